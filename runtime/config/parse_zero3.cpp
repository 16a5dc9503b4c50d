// The top-level "zero3" block: zero3's own settings (model, data, run length, communication, non-finite and
// loss-spike policies, device). Not
// a DeepSpeed key; strict like the rest. To add a setting: a field in Zero3Settings (config.hpp), a row in
// schema.cpp, a read here and a write in to_json.cpp.
#include <fmt/format.h>

#include <vector>

#include "parse_blocks.hpp"
#include "zero3/config/model_types.hpp"

namespace zero3::config::detail {

namespace {

void require(ObjectReader& r, std::string_view key, Got got, std::string_view why = "") {
  if (got == Got::absent) r.error(key, fmt::format("required key is missing{}", why));
}

// The zero3.model keys of a Llama-family model; read for every type so that another type names them.
constexpr std::string_view kLlamaKeys[] = {"hf_config",    "kv_heads", "head_dim", "intermediate_size",  "rope_theta",
                                           "rms_norm_eps", "qkv_bias", "o_bias",   "tie_word_embeddings"};

// Reads the llama keys into m over what hf_config gave (`from_hf`: the keys the file set); a key given in
// both must agree with the file.
void parse_llama_keys(ObjectReader& r, ModelSettings& m, const HfShape& from_hf) {
  const auto agree = [&](std::string_view key, auto zero3_value, auto hf_value, bool in_hf) {
    if (in_hf && zero3_value != hf_value) {
      r.error(key, fmt::format("{} disagrees with {} in hf_config '{}'", zero3_value, hf_value, m.hf_config));
    }
  };
  std::int64_t v = 0;
  const auto int_key = [&](std::string_view key, std::int64_t& out) {
    const std::int64_t from_file = out;
    if (r.get_int(key, v) == Got::value) {
      agree(key, v, from_file, from_hf.has(key));
      out = v;
    }
  };
  int_key("kv_heads", m.kv_heads);
  int_key("head_dim", m.head_dim);
  int_key("intermediate_size", m.intermediate_size);
  double x = 0;
  for (auto [key, out] : {std::pair{"rope_theta", &m.rope_theta}, std::pair{"rms_norm_eps", &m.rms_norm_eps}}) {
    const double from_file = *out;
    if (r.get_number(key, x) == Got::value) {
      agree(key, x, from_file, from_hf.has(key));
      *out = x;
    }
  }
  bool b = false;
  for (auto [key, out] : {std::pair{"qkv_bias", &m.qkv_bias}, std::pair{"o_bias", &m.o_bias}}) {
    const bool from_file = *out;
    if (r.get_bool(key, b) == Got::value) {
      agree(key, b, from_file, from_hf.has(key));
      *out = b;
    }
  }
  // true ties the output layer to the embedding (one param, read by two units); false over a tied
  // hf_config unties them: lm_head gets its own param (init_from copies it).
  bool tied = false;
  if (r.get_bool("tie_word_embeddings", tied) == Got::value) m.tie_word_embeddings = tied;
  if (m.intermediate_size == 0) r.error("intermediate_size", "required key is missing (a llama model needs it)");
  // Resolved, so that the written-back config names them (and reads back the same).
  if (m.kv_heads == 0) m.kv_heads = m.heads;
  if (m.head_dim == 0 && m.heads > 0 && m.hidden_size % m.heads == 0) m.head_dim = m.hidden_size / m.heads;
}

void parse_model(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("model");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("model"), "zero3.model", cx.sink);
  ModelSettings m;
  std::vector<std::string_view> names;
  for (const ModelTypeSpec& t : model_types()) names.push_back(t.name);
  std::string type(names.front());
  r.get_choice("type", type, names);
  const ModelTypeSpec& spec = *find_model_type(type);
  m.type = spec.type;
  const bool llama = spec.decoder_options;
  HfShape from_hf;
  if (llama && r.get_string("hf_config", m.hf_config) == Got::value) from_hf = read_hf_config(r, m);
  if (!llama) {
    for (std::string_view key : kLlamaKeys) {
      if (r.has(key)) r.error(key, fmt::format("applies to \"type\": \"llama\" only (this model is \"{}\")", type));
      r.skip(key);
    }
  }
  // The shape: required from the zero3 block unless hf_config gave it; given in both, the two must agree.
  for (auto [key, out] : {std::pair{"layers", &m.layers}, std::pair{"hidden_size", &m.hidden_size},
                          std::pair{"vocab_size", &m.vocab_size}}) {
    const std::int64_t from_file = *out;
    std::int64_t v = 0;
    const Got got = r.get_int(key, v);
    if (got == Got::value && from_hf.has(key) && v != from_file) {
      r.error(key, fmt::format("{} disagrees with {} in hf_config '{}'", v, from_file, m.hf_config));
    }
    if (got == Got::value) *out = v;
    if (got == Got::absent && !from_hf.has(key)) require(r, key, got);
  }
  const std::int64_t heads_from_file = m.heads;
  std::int64_t heads_value = 0;
  const Got heads = r.get_int("heads", heads_value);
  if (heads == Got::value) {
    if (from_hf.has("heads") && heads_value != heads_from_file) {
      r.error("heads",
              fmt::format("{} disagrees with {} in hf_config '{}'", heads_value, heads_from_file, m.hf_config));
    }
    m.heads = heads_value;
  }
  const Got seq = r.get_int("seq_len", m.seq_len);
  if (spec.sequence_model) {
    if (!from_hf.has("heads")) require(r, "heads", heads, fmt::format(" (a {} model needs it)", type));
    require(r, "seq_len", seq, fmt::format(" (a {} model needs it)", type));
    if (spec.heads_divide_hidden && heads == Got::value && m.hidden_size > 0 && m.hidden_size % m.heads != 0) {
      r.error("heads", fmt::format("hidden_size ({}) is not divisible by heads ({})", m.hidden_size, m.heads));
    }
  } else {
    if (seq != Got::value) m.seq_len = 1;
    if (heads != Got::value) m.heads = 1;
  }
  if (llama) parse_llama_keys(r, m, from_hf);
  if (r.get_string("init_from", m.init_from) == Got::value && m.init_from.empty()) {
    r.error("init_from", "an empty path; name a .safetensors file or a directory holding the checkpoint");
  }
  std::string recompute;
  r.get_choice("activation_checkpointing", recompute, {"none", "full", "selective"});
  m.activation_checkpointing = parse_recompute(recompute).value_or(Recompute::none);
  if (from_hf.sliding_window > 0 && m.seq_len > from_hf.sliding_window) {
    r.error("seq_len", fmt::format("{} exceeds the sliding_window {} of hf_config '{}': sliding-window attention is "
                                   "not implemented (a context within the window computes the same)",
                                   m.seq_len, from_hf.sliding_window, m.hf_config));
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
  r.get_int("markov_order", d.markov_order);
  r.get_number("heldout_fraction", d.heldout_fraction);
  r.finish();
}

void parse_run(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("run");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("run"), "zero3.run", cx.sink);
  RunSettings run;
  require(r, "steps", r.get_int("steps", run.steps));
  r.get_int("log_interval", run.log_interval);
  r.finish();
  if (run.steps > 0) cx.config.zero3.run = run;
}

void parse_comm(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("comm");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("comm"), "zero3.comm", cx.sink);
  CommSettings& c = cx.config.zero3.comm;
  r.get_number("timeout_s", c.timeout_s);
  double first = 0.0;
  if (r.get_number("first_step_timeout_s", first) == Got::value) c.first_step_timeout_s = first;
  r.get_int("flight_records", c.flight_records);
  r.get_bool("desync_check", c.desync_check);
  std::string backend;
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
  std::string level;
  r.get_choice("level", level, {"warning", "error"});
  a.errors_only = level == "error";
  r.finish();
}

void parse_nonfinite(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("nonfinite");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("nonfinite"), "zero3.nonfinite", cx.sink);
  NonfiniteSettings& n = cx.config.zero3.nonfinite;
  std::string policy;
  r.get_choice("policy", policy, {"skip", "abort"});
  n.policy = policy == "abort" ? NonfinitePolicy::abort : NonfinitePolicy::skip;
  r.get_int("max_consecutive", n.max_consecutive);
  r.finish();
}

void parse_spike(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("spike");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("spike"), "zero3.spike", cx.sink);
  SpikeSettings& s = cx.config.zero3.spike;
  r.get_bool("enabled", s.enabled);
  std::string detector;
  r.get_choice("detector", detector, {"ratio", "zscore"});
  s.detector = detector == "ratio" ? SpikeDetector::ratio : SpikeDetector::zscore;
  // A ratio compares the loss with the mean (so it must exceed 1); a z-score counts standard deviations.
  s.threshold = s.detector == SpikeDetector::ratio ? 2.0 : 6.0;
  r.get_number_in("threshold", s.threshold, s.detector == SpikeDetector::ratio ? num_above(1) : num_above(0));
  r.get_int("window", s.window);
  r.get_int("warmup_steps", s.warmup_steps);
  std::string action;
  r.get_choice("action", action, {"skip", "reset_moments", "rollback"});
  s.action = action == "rollback"        ? SpikeAction::rollback
             : action == "reset_moments" ? SpikeAction::reset_moments
                                         : SpikeAction::skip;
  r.get_int("rewarm_steps", s.rewarm_steps);
  r.get_int("skip_batches", s.skip_batches);
  r.get_int("max_consecutive", s.max_consecutive);
  r.finish();
}

void parse_accumulation(ObjectReader& z, Context& cx) {
  const Json* j = z.get_object("accumulation");
  if (j == nullptr) return;
  ObjectReader r(*j, z.path_of("accumulation"), "zero3.accumulation", cx.sink);
  AccumulationSettings& a = cx.config.zero3.accumulation;
  std::string policy;
  r.get_choice("policy", policy, {"fixed", "memory"});
  a.policy = policy == "memory" ? AccumulationPolicy::memory : AccumulationPolicy::fixed;
  r.get_number("high", a.high);
  r.get_number("low", a.low);
  r.get_int("rounds", a.rounds);
  if (a.low >= a.high) {
    r.error("low", fmt::format("{} is not below high ({}): the micro-batch would grow and shrink on the same use",
                               a.low, a.high));
  }
  r.finish();
}

}  // namespace

void parse_zero3_block(ObjectReader& top, Context& cx) {
  const Json* j = top.get_object("zero3");
  if (j == nullptr) return;
  ObjectReader r(*j, "zero3", "zero3", cx.sink);
  Zero3Settings& s = cx.config.zero3;
  r.get_int("seed", s.seed);
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
  parse_accumulation(r, cx);
  std::string device;
  r.get_choice("device", device, {"auto", "host", "cuda"});
  s.device = device == "host" ? DeviceChoice::host : device == "cuda" ? DeviceChoice::cuda : DeviceChoice::automatic;
  r.finish();
}

}  // namespace zero3::config::detail
