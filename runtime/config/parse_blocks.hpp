// The block parsers behind parse_config_text, one per DeepSpeed block (or group of small blocks). Each reads
// its block from the top-level reader, fills its part of the Config and reports through the Sink; they run
// in the order parse.cpp gives, so later blocks may use what earlier ones resolved. Internal.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "reader.hpp"
#include "zero3/config/config.hpp"
#include "zero3/config/parse.hpp"

namespace zero3::config::detail {

struct Context {
  Sink& sink;
  const ParseOptions& options;
  Config& config;
  // Facts later blocks need that the typed Config does not keep.
  bool scheduler_warmup_max_lr_given = false;
};

void parse_zero3_block(ObjectReader& top, Context& cx);        // parse_zero3.cpp
void parse_removed_keys(ObjectReader& top, Context& cx);       // parse_removed.cpp: keys DeepSpeed 0.19.8 rejects
void parse_precision(ObjectReader& top, Context& cx);          // parse_misc.cpp: fp16, bf16 / bfloat16
void parse_zero_optimization(ObjectReader& top, Context& cx);  // parse_zero.cpp
void parse_optimizer(ObjectReader& top, Context& cx);          // parse_optim.cpp
// parse_misc.cpp: the master-weight keys against the dtype blocks and the ZeRO stage (after both are read)
void check_optimizer_storage(ObjectReader& top, Context& cx);
void parse_scheduler(ObjectReader& top, Context& cx);        // parse_optim.cpp
void parse_top_scalars(ObjectReader& top, Context& cx);      // parse_misc.cpp
void parse_batch(ObjectReader& top, Context& cx);            // batch.cpp
void parse_aio(ObjectReader& top, Context& cx);              // parse_zero.cpp
void parse_misc_blocks(ObjectReader& top, Context& cx);      // parse_misc.cpp: checkpoint, data_types, monitors, ...
void parse_other_ds_blocks(ObjectReader& top, Context& cx);  // parse_other.cpp: DeepSpeed features zero3 lacks
// What zero3.model.hf_config set: the zero3.model keys it gave, and Mistral's attention window (0: none).
struct HfShape {
  std::set<std::string, std::less<>> keys;
  std::int64_t sliding_window = 0;
  bool has(std::string_view key) const { return keys.find(key) != keys.end(); }
};
// Reads m.hf_config into m (hf_config.cpp); errors at zero3.model.hf_config name the file and the field.
HfShape read_hf_config(ObjectReader& r, ModelSettings& m);
// The zero_optimization keys DeepSpeed 0.19.8 rejects (parse_removed.cpp), for parse_zero_optimization.
void reject_removed_zero_keys(ObjectReader& zero);

}  // namespace zero3::config::detail
