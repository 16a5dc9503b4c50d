// The engine's model description after finalize(): units and params found by name, each unit's flat layout
// (a trainable and a frozen group, each padded to world_size x kAlignElems elements), which units are
// persistent (kept whole on every rank), and where this rank's slices sit in its flat shard buffers.
// Built once by build_layout(); immutable afterwards, so any thread may read it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zero3/config/config.hpp"
#include "zero3/units/unit_spec.hpp"

namespace zero3::engine {

// Every group is padded to a multiple of world_size * kAlignElems elements, so each rank's slice starts
// on a 64-element boundary (256 bytes in fp32, 128 in 16-bit): aligned for vector loads and for NCCL's
// fast paths, for a waste of at most 64 * world_size elements per group.
inline constexpr std::size_t kAlignElems = 64;

enum class Group : std::uint8_t { trainable = 0, frozen = 1 };
inline constexpr std::size_t kNumGroups = 2;
inline constexpr std::size_t group_index(Group g) {
  return static_cast<std::size_t>(g);
}

struct ParamLayout {
  ParamSpec spec;
  std::size_t unit = 0;  // index of its unit
  Group group = Group::trainable;
  std::size_t offset = 0;  // first element in its group's flat buffer
  std::size_t numel = 0;
};

// One group of a unit, laid end to end in declaration order.
struct GroupLayout {
  std::vector<std::size_t> params;  // indices into Layout::params
  std::size_t numel = 0;            // sum of the params' numel
  std::size_t padded = 0;           // the full flat size: numel rounded up (persistent units: numel)
  std::size_t shard = 0;            // elements each rank keeps: padded / world_size (persistent units: padded)
  std::size_t shard_begin = 0;      // this rank's first element in the group's flat buffer (persistent: 0)
  // Where this rank's slice sits in the rank's flat param-shard buffer (compute dtype). Trainable groups
  // come first, in the same order and at the same offsets as in the flat master/accumulator/state buffers,
  // so one offset serves all of them.
  std::size_t flat_offset = 0;
};

struct UnitLayout {
  std::string name;
  std::vector<std::size_t> params;  // indices into Layout::params, in declaration order
  std::array<GroupLayout, kNumGroups> groups;
  bool persistent = false;
  std::size_t numel = 0;  // both groups, unpadded

  const GroupLayout& group(Group g) const { return groups[group_index(g)]; }
  // Elements of the full (gathered) buffer: the trainable group, then the frozen group, both padded.
  std::size_t gathered_count() const { return groups[0].padded + groups[1].padded; }
  // Offset of group g in the gathered buffer.
  std::size_t gathered_offset(Group g) const { return g == Group::trainable ? 0 : groups[0].padded; }
};

// Heterogeneous lookup: find by string_view without building a std::string.
struct NameHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using NameIndex = std::unordered_map<std::string, std::size_t, NameHash, std::equal_to<>>;

struct Layout {
  int world_size = 1;
  int rank = 0;
  std::vector<UnitLayout> units;
  std::vector<ParamLayout> params;
  NameIndex unit_index;
  NameIndex param_index;
  // The rank's flat buffers: [sharded trainable | persistent trainable | frozen] for the param shards, and
  // [sharded trainable | persistent trainable] for master, accumulators and optimizer state.
  std::size_t param_shard_count = 0;
  std::size_t state_count = 0;
  std::size_t sharded_state_count = 0;  // the first elements of the state buffers that belong to sharded units
  std::uint64_t total_elems = 0;        // all params, unpadded
  std::uint64_t persistent_elems = 0;   // params of persistent units

  std::optional<std::size_t> find_unit(std::string_view name) const;
  std::optional<std::size_t> find_param(std::string_view name) const;
};

// Validates a unit as add_unit() receives it: a non-empty name, params with non-empty names, no negative
// extents, a fill function for custom inits, a finite lr_scale >= 0. Throws UsageError naming the unit/param.
void validate_unit_spec(const UnitSpec& unit);

// Lays out `units` (declaration order) for `world_size` ranks as seen from `rank`. Persistence follows
// DeepSpeed's rule applied per unit: walking units in declaration order, a unit whose numel is at most
// param_persistence_threshold is persistent unless that would bring the running total of persistent
// elements above model_persistence_threshold (then it is skipped, and later units may still fit).
Layout build_layout(std::vector<UnitSpec> units, int world_size, int rank, const config::ZeroConfig& zero);

// A run of the flat state buffers whose elements share one lr_scale and weight-decay flag: consecutive
// params with equal settings are merged; padding is in no segment (it stays 0 and is never stepped).
struct StateSegment {
  std::size_t offset = 0;
  std::size_t count = 0;
  double lr_scale = 1.0;
  bool weight_decay = true;
};
std::vector<StateSegment> state_segments(const Layout& layout);

// The (rank slice) range of a param inside a group slice, for init and for reading back.
struct SliceOverlap {
  std::size_t param_first = 0;   // first element of the param covered
  std::size_t slice_offset = 0;  // where it lands in the slice
  std::size_t count = 0;
};
// The part of `param` inside [begin, begin + count) of its group; count 0 when they do not meet.
SliceOverlap overlap(const ParamLayout& param, std::size_t begin, std::size_t count);

}  // namespace zero3::engine
