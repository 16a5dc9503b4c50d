// Start-up work of finalize(): every rank computes only the elements of its own slices from the
// counter-based RNG (so the model is the same for every world size), writes them into the fp32 master and
// the compute-dtype param shards, and then all ranks prove they agree on the model, the config and the
// values of the persistent params. Runs on the calling thread and one stream; blocks until done.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "layout.hpp"
#include "state_pieces.hpp"
#include "zero3/comm/communicator.hpp"
#include "zero3/device/device.hpp"

namespace zero3::engine {

// Values of elements [first, first + out.size()) of `param` (row-major flat index), from
// CounterRng(seed, hash_name(param.name)): normal mean + std * normal(e), uniform low + (high - low) *
// uniform(e), constant, or the custom fill function.
void init_values(const ParamSpec& param, std::uint64_t seed, std::uint64_t first, std::span<float> out);

// initialize_shards makes values this many at a time, in host staging (fp32, and their compute-dtype
// rounding) of at most this many elements each.
inline constexpr std::size_t kInitChunkElems = std::size_t{1} << 20;

// Fills this rank's slices: the master (fp32, layout.state_count elements, written through write_master(offset,
// values), which may enqueue on `stream`) gets the trainable values, the params (param_dtype,
// layout.param_shard_count elements, written through write_params(offset, values), which may enqueue on
// `stream`) their rounded copy, and frozen slices go straight to the params. Padding is 0. Enqueues on
// `stream` and synchronizes it. value_hashes[p] gets a hash of the fp32 values of param p
// when its unit is persistent (every rank holds all of them), 0 otherwise.
void initialize_shards(const Layout& layout, std::uint64_t seed, Device& device, Stream& stream,
                       const std::function<void(std::size_t, ConstBufferView)>& write_master, DType param_dtype,
                       const std::function<void(std::size_t, ConstBufferView)>& write_params,
                       std::vector<std::uint64_t>& value_hashes);

// Collective over `bootstrap`: all-gathers a fingerprint of every unit (name, persistence, group sizes) and
// param (name, shape, flags, init, layout, persistent values) plus `config_json`'s hash, and throws Error
// naming the first unit or param (or the config) on which ranks differ, and which ranks.
void check_ranks_agree(const Layout& layout, const std::vector<std::uint64_t>& value_hashes,
                       const std::string& config_json, comm::Bootstrap& bootstrap);

}  // namespace zero3::engine
