#include "layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "zero3/core/error.hpp"

namespace zero3 {

namespace engine {

std::optional<std::size_t> Layout::find_unit(std::string_view name) const {
  const auto it = unit_index.find(name);
  if (it == unit_index.end()) return std::nullopt;
  return it->second;
}

std::optional<std::size_t> Layout::find_param(std::string_view name) const {
  const auto it = param_index.find(name);
  if (it == param_index.end()) return std::nullopt;
  return it->second;
}

namespace {

// An init whose arguments cannot make the values asked for (a std < 0, low > high, NaN, ...).
void validate_init(const std::string& unit, const ParamSpec& p) {
  const ParamInit& init = p.init;
  const auto fail = [&](std::string_view what) {
    throw UsageError(fmt::format("add_unit('{}'): param '{}' has {}", unit, p.name, what));
  };
  switch (init.kind) {
    case ParamInit::Kind::normal:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || init.b < 0.0) {
        fail(
            fmt::format("a normal init with mean {} and std {}; both must be finite and std >= 0 "
                        "(ParamInit::normal({{.mean = ..., .std = ...}}))",
                        init.a, init.b));
      }
      break;
    case ParamInit::Kind::uniform:
      if (!std::isfinite(init.a) || !std::isfinite(init.b) || init.a > init.b) {
        fail(
            fmt::format("a uniform init with low {} and high {}; both must be finite and low <= high "
                        "(ParamInit::uniform({{.low = ..., .high = ...}}))",
                        init.a, init.b));
      }
      break;
    case ParamInit::Kind::constant:
      if (!std::isfinite(init.a)) fail(fmt::format("a constant init of {}, which must be finite", init.a));
      break;
    case ParamInit::Kind::custom:
      if (!init.fill) fail("a custom init without a fill function");
      break;
  }
}

}  // namespace

void validate_unit_spec(const UnitSpec& unit) {
  if (unit.name.empty()) throw UsageError("add_unit: a unit needs a non-empty name");
  for (const ParamSpec& p : unit.params) {
    if (p.name.empty()) throw UsageError(fmt::format("add_unit('{}'): a param needs a non-empty name", unit.name));
    (void)p.numel();  // throws for negative extents and overflow, naming the param
    validate_init(unit.name, p);
    if (!std::isfinite(p.lr_scale) || p.lr_scale < 0.0) {
      throw UsageError(fmt::format("add_unit('{}'): param '{}' has lr_scale {}, which must be finite and >= 0",
                                   unit.name, p.name, p.lr_scale));
    }
  }
}

namespace {

std::size_t round_up(std::size_t n, std::size_t multiple) {
  return (n + multiple - 1) / multiple * multiple;
}

}  // namespace

Layout build_layout(std::vector<UnitSpec> units, int world_size, int rank, const config::ZeroConfig& zero) {
  ZERO3_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "build_layout: rank outside the world");
  Layout layout;
  layout.world_size = world_size;
  layout.rank = rank;
  const auto w = static_cast<std::size_t>(world_size);
  const auto param_threshold = static_cast<std::uint64_t>(std::max<std::int64_t>(zero.param_persistence_threshold, 0));
  const auto model_threshold = static_cast<std::uint64_t>(std::max<std::int64_t>(zero.model_persistence_threshold, 0));
  std::uint64_t persistent_total = 0;

  layout.units.reserve(units.size());
  for (UnitSpec& spec : units) {
    const std::size_t u = layout.units.size();
    UnitLayout unit;
    unit.name = std::move(spec.name);
    for (ParamSpec& p : spec.params) {
      ParamLayout pl;
      pl.numel = p.numel();
      pl.unit = u;
      pl.group = p.trainable ? Group::trainable : Group::frozen;
      GroupLayout& g = unit.groups[group_index(pl.group)];
      pl.offset = g.numel;
      g.numel += pl.numel;
      unit.numel += pl.numel;
      const std::size_t index = layout.params.size();
      g.params.push_back(index);
      unit.params.push_back(index);
      layout.param_index.emplace(p.name, index);
      pl.spec = std::move(p);
      layout.params.push_back(std::move(pl));
    }
    if (unit.numel <= param_threshold && persistent_total + unit.numel <= model_threshold) {
      unit.persistent = true;
      persistent_total += unit.numel;
    }
    for (GroupLayout& g : unit.groups) {
      if (unit.persistent) {
        g.padded = g.numel;
        g.shard = g.numel;
        g.shard_begin = 0;
      } else {
        g.padded = round_up(g.numel, w * kAlignElems);
        g.shard = g.padded / w;
        g.shard_begin = static_cast<std::size_t>(rank) * g.shard;
      }
    }
    layout.total_elems += unit.numel;
    if (unit.persistent) layout.persistent_elems += unit.numel;
    layout.unit_index.emplace(unit.name, u);
    layout.units.push_back(std::move(unit));
  }

  // Flat offsets: sharded trainable, persistent trainable, then every frozen group.
  std::size_t offset = 0;
  for (const bool persistent : {false, true}) {
    for (UnitLayout& unit : layout.units) {
      if (unit.persistent != persistent) continue;
      GroupLayout& g = unit.groups[group_index(Group::trainable)];
      g.flat_offset = offset;
      offset += g.shard;
    }
    if (!persistent) layout.sharded_state_count = offset;
  }
  layout.state_count = offset;
  for (UnitLayout& unit : layout.units) {
    GroupLayout& g = unit.groups[group_index(Group::frozen)];
    g.flat_offset = offset;
    offset += g.shard;
  }
  layout.param_shard_count = offset;
  return layout;
}

SliceOverlap overlap(const ParamLayout& param, std::size_t begin, std::size_t count) {
  const std::size_t lo = std::max(param.offset, begin);
  const std::size_t hi = std::min(param.offset + param.numel, begin + count);
  if (lo >= hi) return {};
  return {lo - param.offset, lo - begin, hi - lo};
}

std::vector<StateSegment> state_segments(const Layout& layout) {
  std::vector<StateSegment> segments;
  // Units in flat order: sharded first, then persistent (as build_layout placed them).
  for (const bool persistent : {false, true}) {
    for (const UnitLayout& unit : layout.units) {
      if (unit.persistent != persistent) continue;
      const GroupLayout& g = unit.group(Group::trainable);
      for (const std::size_t pi : g.params) {
        const ParamLayout& p = layout.params[pi];
        const SliceOverlap o = overlap(p, g.shard_begin, g.shard);
        if (o.count == 0) continue;
        const std::size_t flat = g.flat_offset + o.slice_offset;
        if (!segments.empty()) {
          StateSegment& last = segments.back();
          if (last.offset + last.count == flat && last.lr_scale == p.spec.lr_scale &&
              last.weight_decay == p.spec.weight_decay) {
            last.count += o.count;
            continue;
          }
        }
        segments.push_back({flat, o.count, p.spec.lr_scale, p.spec.weight_decay});
      }
    }
  }
  return segments;
}

}  // namespace engine
}  // namespace zero3
