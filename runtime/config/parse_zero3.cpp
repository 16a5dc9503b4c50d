// The top-level "zero3" block: zero3's own settings (model, data, run length, communication, non-finite and
// loss-spike policies, device). Not
// a DeepSpeed key; strict like the rest. To add a setting: a field in Zero3Settings (config.hpp), a row in
// schema.cpp, a read here and a write in to_json.cpp.
#include <fmt/format.h>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

void require(ObjectReader& r, std::string_view key, Got got, std::string_view why = "") {
  if (got == Got::absent) r.error(key, fmt::format("required key is missing{}", why));
}

void parse_model(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("model");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("model"), "zero3.model", cx.sink);
  ModelSettings m;
  std::string type = "gpt";
  r.get_choice("type", type, {"gpt", "mlp"});
  m.type = type == "mlp" ? ModelType::mlp : ModelType::gpt;
  const bool gpt = m.type == ModelType::gpt;
  require(r, "layers", r.get_int("layers", m.layers, IntRange::at_least(1)));
  require(r, "hidden_size", r.get_int("hidden_size", m.hidden_size, IntRange::at_least(1)));
  require(r, "vocab_size", r.get_int("vocab_size", m.vocab_size, IntRange::at_least(1)));
  const Got heads = r.get_int("heads", m.heads, IntRange::at_least(1));
  const Got seq = r.get_int("seq_len", m.seq_len, IntRange::at_least(1));
  if (gpt) {
    require(r, "heads", heads, " (a gpt model needs it)");
    require(r, "seq_len", seq, " (a gpt model needs it)");
    if (heads == Got::value && m.hidden_size > 0 && m.hidden_size % m.heads != 0) {
      r.error("heads", fmt::format("hidden_size ({}) is not divisible by heads ({})", m.hidden_size, m.heads));
    }
  } else {
    if (seq != Got::value) m.seq_len = 1;
    if (heads != Got::value) m.heads = 1;
  }
  r.finish();
  cx.config.zero3.model = m;
}

void parse_data(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("data");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("data"), "zero3.data", cx.sink);
  DataSettings& d = cx.config.zero3.data;
  if (r.get_string("source", d.source) == Got::value) {
    const auto file_scheme = [&](std::string_view scheme) {
      return d.source.rfind(scheme, 0) == 0 && d.source.size() > scheme.size();
    };
    if (d.source != "synthetic:markov" && !file_scheme("tokens:") && !file_scheme("raw16:")) {
      r.error("source", fmt::format("expected \"synthetic:markov\", \"tokens:<file>\" (a zero3 or llm.c token file) "
                                    "or \"raw16:<file>\" (headerless uint16 ids), got \"{}\"",
                                    d.source));
    }
  }
  r.get_int("markov_order", d.markov_order, IntRange::at_least(1));
  r.get_number("heldout_fraction", d.heldout_fraction, NumRange::open(0.0, 1.0));
  r.finish();
}

void parse_run(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("run");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("run"), "zero3.run", cx.sink);
  RunSettings run;
  require(r, "steps", r.get_int("steps", run.steps, IntRange::at_least(1)));
  r.get_int("log_interval", run.log_interval, IntRange::at_least(1));
  r.finish();
  if (run.steps > 0) cx.config.zero3.run = run;
}

void parse_comm(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("comm");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("comm"), "zero3.comm", cx.sink);
  CommSettings& c = cx.config.zero3.comm;
  r.get_number("timeout_s", c.timeout_s, NumRange::above(0.0));
  double first = 0.0;
  if (r.get_number("first_step_timeout_s", first, NumRange::above(0.0)) == Got::value) c.first_step_timeout_s = first;
  r.get_int("flight_records", c.flight_records, IntRange::at_least(16));
  r.get_bool("desync_check", c.desync_check);
  std::string backend = "auto";
  r.get_choice("backend", backend, {"auto", "mpi", "nccl"});
  c.backend = backend == "mpi" ? CommBackend::mpi : backend == "nccl" ? CommBackend::nccl : CommBackend::automatic;
  r.finish();
}

void parse_alerts(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("alerts");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("alerts"), "zero3.alerts", cx.sink);
  AlertSettings& a = cx.config.zero3.alerts;
  r.get_string("command", a.command);
  std::string level = "warning";
  r.get_choice("level", level, {"warning", "error"});
  a.errors_only = level == "error";
  r.finish();
}

void parse_nonfinite(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("nonfinite");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("nonfinite"), "zero3.nonfinite", cx.sink);
  NonfiniteSettings& n = cx.config.zero3.nonfinite;
  std::string policy = "skip";
  r.get_choice("policy", policy, {"skip", "abort"});
  n.policy = policy == "abort" ? NonfinitePolicy::abort : NonfinitePolicy::skip;
  r.get_int("max_consecutive", n.max_consecutive, IntRange::at_least(1));
  r.finish();
}

void parse_spike(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("spike");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("spike"), "zero3.spike", cx.sink);
  SpikeSettings& s = cx.config.zero3.spike;
  r.get_bool("enabled", s.enabled);
  std::string detector = "zscore";
  r.get_choice("detector", detector, {"ratio", "zscore"});
  s.detector = detector == "ratio" ? SpikeDetector::ratio : SpikeDetector::zscore;
  // A ratio compares the loss with the mean (so it must exceed 1); a z-score counts standard deviations.
  s.threshold = s.detector == SpikeDetector::ratio ? 2.0 : 6.0;
  r.get_number("threshold", s.threshold,
               s.detector == SpikeDetector::ratio ? NumRange::above(1.0) : NumRange::above(0.0));
  r.get_int("window", s.window, IntRange::at_least(2));
  r.get_int("warmup_steps", s.warmup_steps, IntRange::at_least(0));
  std::string action = "skip";
  r.get_choice("action", action, {"skip", "reset_moments", "rollback"});
  s.action = action == "rollback"        ? SpikeAction::rollback
             : action == "reset_moments" ? SpikeAction::reset_moments
                                         : SpikeAction::skip;
  r.get_int("rewarm_steps", s.rewarm_steps, IntRange::at_least(1));
  r.get_int("skip_batches", s.skip_batches, IntRange::at_least(0));
  r.get_int("max_consecutive", s.max_consecutive, IntRange::at_least(1));
  r.finish();
}

}  // namespace

void parse_zero3_block(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("zero3");
  if (j == nullptr) return;
  ObjectReader r(*j, "zero3", "zero3", cx.sink);
  Zero3Settings& s = cx.config.zero3;
  r.get_int("seed", s.seed, IntRange::at_least(0));
  r.get_bool("strict", s.strict);
  if (const Json* b = r.raw("pinned_memory_budget_gb")) {
    if (b->is_string() && b->get_ref<const std::string&>() == "auto") {
      s.pinned_memory_budget_gb.reset();
    } else if (b->is_number() && b->get<double>() > 0.0) {
      s.pinned_memory_budget_gb = b->get<double>();
    } else {
      r.error("pinned_memory_budget_gb", fmt::format("expected a number > 0 or \"auto\", got {}", describe(*b)));
    }
  }
  r.get_bool("single_rank_in_place", s.single_rank_in_place);
  parse_model(r, cx);
  parse_data(r, cx);
  parse_run(r, cx);
  parse_comm(r, cx);
  parse_alerts(r, cx);
  parse_nonfinite(r, cx);
  parse_spike(r, cx);
  std::string device = "auto";
  r.get_choice("device", device, {"auto", "host", "cuda"});
  s.device = device == "host" ? DeviceChoice::host : device == "cuda" ? DeviceChoice::cuda : DeviceChoice::automatic;
  r.finish();
}

}  // namespace zero3::config::detail
