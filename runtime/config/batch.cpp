// DeepSpeed's batch rule (https://www.deepspeed.ai/docs/config-json/ "Batch Size Related Parameters";
// deepspeed/runtime/config.py, _set_batch_related_parameters and _batch_assertion): the three batch keys, inference by
// floor division from the ones given, and train_batch_size == micro batch * gradient accumulation * world size. "auto"
// is inferred the same way; with nothing to infer from, micro batch and accumulation default to 1 (documented in
// docs/config.md).
#include <fmt/format.h>

#include "parse_blocks.hpp"

namespace zero3::config::detail {

namespace {

constexpr std::int64_t kHfMicroBatch = 8;  // transformers TrainingArguments.per_device_train_batch_size

constexpr std::string_view kTb = "train_batch_size";
constexpr std::string_view kMb = "train_micro_batch_size_per_gpu";
constexpr std::string_view kGas = "gradient_accumulation_steps";

struct Factor {
  explicit Factor(std::string_view k) : key(k) {}
  std::string_view key;
  std::int64_t value = 0;
  Got got = Got::absent;
  bool known = false;  // given, or defaulted for "auto"
  std::string how;     // empty when given; "inferred as 32 // 3 // 2", "\"auto\": ..." otherwise
};

std::string shown(const Factor& f) {
  return f.how.empty() ? fmt::format("{} ({})", f.key, f.value) : fmt::format("{} ({}, {})", f.key, f.value, f.how);
}

}  // namespace

void parse_batch(ObjectReader& top, Context& cx) {
  const int world = cx.options.world_size.value_or(1);
  std::string source = cx.options.world_size_source;
  if (source.empty()) source = cx.options.world_size ? "the caller" : "default";
  const std::string world_text = source.rfind("default", 0) == 0 ? fmt::format("{}, {}", world, source)
                                                                 : fmt::format("{}, from {}", world, source);
  if (world < 1) {
    cx.sink.error(source, fmt::format("world size must be >= 1, got {}", world));
    return;
  }
  const std::int64_t w = world;
  Factor tb(kTb), mb(kMb), gas(kGas);
  for (Factor* f : {&tb, &mb, &gas}) {
    f->got = top.get_int(f->key, f->value);
    f->known = f->got == Got::value;
  }
  if (tb.got == Got::invalid || mb.got == Got::invalid || gas.got == Got::invalid) return;

  // "auto" with nothing to infer it from.
  if (!tb.known && !mb.known) {
    if (tb.got != Got::automatic && mb.got != Got::automatic) {
      cx.sink.error(std::string(kTb),
                    fmt::format("neither {} nor {} is given (DeepSpeed asserts); give at least one", kTb, kMb));
      return;
    }
    // What the HF Trainer would fill in from its own defaults (TrainingArguments.per_device_train_batch_size).
    mb.value = kHfMicroBatch;
    mb.known = true;
    mb.how = fmt::format("{}HF Trainer's default per_device_train_batch_size ({}); nothing to infer it from",
                         mb.got == Got::automatic ? "\"auto\": " : "for \"auto\" train_batch_size: ", kHfMicroBatch);
  }
  if (gas.got == Got::automatic && !(tb.known && mb.known)) {
    gas.value = 1;
    gas.known = true;
    gas.how = "\"auto\": HF Trainer's default gradient_accumulation_steps (1); nothing to infer it from";
  }

  // DeepSpeed's inference table.
  if (tb.known && mb.known && !gas.known) {
    gas.value = tb.value / mb.value / w;
    gas.how = fmt::format("inferred as {} // {} // {}", tb.value, mb.value, w);
  } else if (tb.known && gas.known && !mb.known) {
    mb.value = tb.value / w / gas.value;
    mb.how = fmt::format("inferred as {} // {} // {}", tb.value, w, gas.value);
  } else if (mb.known && gas.known && !tb.known) {
    tb.value = mb.value * gas.value * w;
    tb.how = fmt::format("inferred as {} * {} * {}", mb.value, gas.value, w);
  } else if (tb.known && !mb.known && !gas.known) {
    gas.value = 1;
    gas.how = "inferred as 1";
    mb.value = tb.value / w;
    mb.how = fmt::format("inferred as {} // {}", tb.value, w);
  } else if (mb.known && !tb.known && !gas.known) {
    tb.value = mb.value * w;
    tb.how = fmt::format("inferred as {} * {}", mb.value, w);
    gas.value = 1;
    gas.how = "inferred as 1";
  }

  bool ok = true;
  for (const Factor* f : {&tb, &mb, &gas}) {
    if (f->value <= 0) {
      cx.sink.error(std::string(f->key),
                    fmt::format("{} = {}; must be > 0 (world size {})", f->how, f->value, world_text));
      ok = false;
    }
  }
  if (!ok) return;
  if (tb.value != mb.value * gas.value * w) {
    cx.sink.error(std::string(kTb),
                  fmt::format("{} != {} * {} * world size ({})", tb.value, shown(mb), shown(gas), world_text));
    return;
  }
  for (const Factor* f : {&tb, &mb, &gas}) {
    if (f->how.empty()) continue;
    std::string reason = f->how;
    if (f->got == Got::automatic && reason.rfind("\"auto\"", 0) != 0) reason.insert(0, "\"auto\": ");
    cx.sink.resolved(std::string(f->key), json_text(f->value), fmt::format("{} (world size {})", reason, world_text));
  }
  BatchConfig& b = cx.config.batch;
  b.train_batch_size = tb.value;
  b.train_micro_batch_size_per_gpu = mb.value;
  b.gradient_accumulation_steps = gas.value;
  b.world_size = world;
  b.world_size_source = source;
}

}  // namespace zero3::config::detail
