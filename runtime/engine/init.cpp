#include "init.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::engine {

namespace {

// Host values are produced in chunks of this many elements: bounded staging memory for any model size.

// FNV-1a, 64-bit, over little-endian bytes: stable across ranks, runs and builds.
struct Fnv {
  std::uint64_t h = 0xcbf29ce484222325ull;
  void byte(unsigned char b) {
    h ^= b;
    h *= 0x100000001b3ull;
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) byte(static_cast<unsigned char>(v >> (8 * i)));
  }
  void f64(double v) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
  void str(std::string_view s) {
    u64(s.size());
    for (const char c : s) byte(static_cast<unsigned char>(c));
  }
};

// One group slice in the rank's flat buffer.
struct FlatPiece {
  std::size_t flat_offset = 0;
  std::size_t unit = 0;
  Group group = Group::trainable;
};

// The group slices of [begin_flat, end_flat) of the flat param-shard buffer, in flat order.
std::vector<FlatPiece> flat_pieces(const Layout& layout, std::size_t begin_flat, std::size_t end_flat) {
  std::vector<FlatPiece> pieces;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    for (const Group g : {Group::trainable, Group::frozen}) {
      const GroupLayout& gl = layout.units[u].group(g);
      if (gl.shard > 0 && gl.flat_offset >= begin_flat && gl.flat_offset < end_flat) {
        pieces.push_back({gl.flat_offset, u, g});
      }
    }
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const FlatPiece& a, const FlatPiece& b) { return a.flat_offset < b.flat_offset; });
  return pieces;
}

// Host values of flat elements [first, first + out.size()); padding is 0. Also streams the values of
// persistent params into their hashes (chunks arrive in increasing order).
void fill_flat(const Layout& layout, const std::vector<FlatPiece>& pieces, std::uint64_t seed, std::size_t first,
               std::span<float> out, std::vector<Fnv>& hashes) {
  std::fill(out.begin(), out.end(), 0.0f);
  const std::size_t last = first + out.size();
  for (const FlatPiece& piece : pieces) {
    const UnitLayout& unit = layout.units[piece.unit];
    const GroupLayout& g = unit.group(piece.group);
    const std::size_t lo = std::max(first, piece.flat_offset);
    const std::size_t hi = std::min(last, piece.flat_offset + g.shard);
    if (lo >= hi) continue;
    // [lo, hi) of the flat buffer is [begin, begin + n) of the group slice.
    const std::size_t begin = g.shard_begin + (lo - piece.flat_offset);
    const std::size_t n = hi - lo;
    for (const std::size_t pi : g.params) {
      const ParamLayout& p = layout.params[pi];
      const SliceOverlap o = overlap(p, begin, n);
      if (o.count == 0) continue;
      const std::span<float> dst = out.subspan(lo - first + o.slice_offset, o.count);
      init_values(p.spec, seed, o.param_first, dst);
      if (unit.persistent) {
        for (const float v : dst) {
          std::uint32_t bits = 0;
          std::memcpy(&bits, &v, sizeof bits);
          hashes[pi].u64(bits);
        }
      }
    }
  }
}

}  // namespace

void init_values(const ParamSpec& param, std::uint64_t seed, std::uint64_t first, std::span<float> out) {
  const ParamInit& init = param.init;
  switch (init.kind) {
    case ParamInit::Kind::constant:
      std::fill(out.begin(), out.end(), static_cast<float>(init.a));
      return;
    case ParamInit::Kind::custom:
      if (!out.empty()) init.fill(first, out);
      return;
    case ParamInit::Kind::normal: {
      const CounterRng rng(seed, hash_name(param.name));
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(init.a + init.b * rng.normal(first + i));
      return;
    }
    case ParamInit::Kind::uniform: {
      const CounterRng rng(seed, hash_name(param.name));
      for (std::size_t i = 0; i < out.size(); ++i) {
        out[i] = static_cast<float>(init.a + (init.b - init.a) * rng.uniform(first + i));
      }
      return;
    }
  }
}

void initialize_shards(const Layout& layout, std::uint64_t seed, Device& device, Stream& stream,
                       const std::function<void(std::size_t, ConstBufferView)>& write_master, DType param_dtype,
                       const std::function<void(std::size_t, ConstBufferView)>& write_params,
                       std::vector<std::uint64_t>& value_hashes) {
  std::vector<Fnv> hashes(layout.params.size());
  // Values are made in host staging (pinned where the device needs it for async copies), rounded to the
  // compute dtype there too (the same RNE the cast kernels use), and copied to wherever master and params
  // live: device memory, or host memory when they are offloaded.
  const MemoryKind staging_kind = device.caps().host_staging;
  const std::size_t chunk = std::min(kInitChunkElems, layout.param_shard_count);
  Buffer host = device.allocate(chunk, DType::f32, staging_kind, MemCategory::staging);
  Buffer rounded = device.allocate(chunk, param_dtype, staging_kind, MemCategory::staging);
  const auto round_into_params = [&](std::size_t at, std::size_t n) {
    const float* v = host.view().as<float>();
    for (std::size_t i = 0; i < n; ++i) store_from_float(rounded.data(), rounded.dtype(), i, v[i]);
    write_params(at, rounded.cview().slice(0, n));
  };

  // Trainable slices into the master (its flat layout is the first state_count elements of the param
  // shards'); frozen slices have no master and only go to the params.
  const std::vector<FlatPiece> trainable = flat_pieces(layout, 0, layout.state_count);
  for (std::size_t c = 0; c < layout.state_count; c += chunk) {
    const std::size_t n = std::min(chunk, layout.state_count - c);
    fill_flat(layout, trainable, seed, c, std::span<float>(host.view().as<float>(), n), hashes);
    write_master(c, host.cview().slice(0, n));
    round_into_params(c, n);
    stream.synchronize();  // the host staging is refilled next
  }
  const std::size_t frozen_count = layout.param_shard_count - layout.state_count;
  const std::vector<FlatPiece> frozen = flat_pieces(layout, layout.state_count, layout.param_shard_count);
  for (std::size_t c = 0; c < frozen_count; c += chunk) {
    const std::size_t n = std::min(chunk, frozen_count - c);
    fill_flat(layout, frozen, seed, layout.state_count + c, std::span<float>(host.view().as<float>(), n), hashes);
    round_into_params(layout.state_count + c, n);
    stream.synchronize();
  }
  stream.synchronize();

  value_hashes.assign(layout.params.size(), 0);
  for (std::size_t p = 0; p < layout.params.size(); ++p) {
    if (layout.units[layout.params[p].unit].persistent) value_hashes[p] = hashes[p].h;
  }
}

namespace {

// Entry i of rank r in an all-gathered vector of `n` u64 per rank.
std::uint64_t entry(const std::vector<std::uint64_t>& all, std::size_t n, int r, std::size_t i) {
  return all[static_cast<std::size_t>(r) * n + i];
}

// "ranks 0, 1 and ranks 2" style grouping of which ranks hold which value of entry i.
std::string describe_split(const std::vector<std::uint64_t>& all, std::size_t n, int size, std::size_t i) {
  std::vector<int> differ;
  const std::uint64_t v0 = entry(all, n, 0, i);
  for (int r = 1; r < size; ++r) {
    if (entry(all, n, r, i) != v0) differ.push_back(r);
  }
  std::string text = fmt::format("rank 0 differs from rank{} ", differ.size() == 1 ? "" : "s");
  for (std::size_t k = 0; k < differ.size(); ++k) text += fmt::format("{}{}", k == 0 ? "" : ", ", differ[k]);
  return text;
}

}  // namespace

void check_ranks_agree(const Layout& layout, const std::vector<std::uint64_t>& value_hashes,
                       const std::string& config_json, comm::Bootstrap& bootstrap) {
  const int size = bootstrap.size();
  const comm::ScopedOpAnnotation note("init", "rank agreement");
  Fnv config_hash;
  config_hash.str(config_json);
  // Header first: with different unit or param counts the detailed vectors would not even line up.
  const std::vector<std::uint64_t> header{layout.units.size(), layout.params.size(), config_hash.h};
  const std::vector<std::uint64_t> all_headers = comm::all_gather_vectors(bootstrap, header);
  for (std::size_t i = 0; i < 2; ++i) {
    for (int r = 1; r < size; ++r) {
      if (entry(all_headers, header.size(), r, i) != entry(all_headers, header.size(), 0, i)) {
        throw Error(fmt::format("ranks disagree on the model: rank 0 declared {} {} but rank {} declared {}",
                                entry(all_headers, header.size(), 0, i), i == 0 ? "units" : "params", r,
                                entry(all_headers, header.size(), r, i)));
      }
    }
  }
  for (int r = 1; r < size; ++r) {
    if (entry(all_headers, header.size(), r, 2) != entry(all_headers, header.size(), 0, 2)) {
      throw Error(fmt::format("ranks disagree on the configuration (hash of the resolved config): {}",
                              describe_split(all_headers, header.size(), size, 2)));
    }
  }

  // One fingerprint per unit, then one per param of that unit, in declaration order.
  std::vector<std::uint64_t> prints;
  std::vector<std::string> names;
  std::vector<bool> unit_entry;
  for (const UnitLayout& unit : layout.units) {
    Fnv f;
    f.str(unit.name);
    f.u64(unit.persistent ? 1 : 0);
    f.u64(unit.params.size());
    for (const GroupLayout& g : unit.groups) {
      f.u64(g.numel);
      f.u64(g.padded);
    }
    prints.push_back(f.h);
    names.push_back(fmt::format("unit '{}'", unit.name));
    unit_entry.push_back(true);
    for (const std::size_t pi : unit.params) {
      const ParamLayout& p = layout.params[pi];
      Fnv pf;
      pf.str(p.spec.name);
      pf.u64(p.spec.shape.size());
      for (const std::int64_t e : p.spec.shape) pf.u64(static_cast<std::uint64_t>(e));
      pf.u64(p.spec.trainable ? 1 : 0);
      pf.u64(p.spec.weight_decay ? 1 : 0);
      pf.f64(p.spec.lr_scale);
      pf.u64(static_cast<std::uint64_t>(p.spec.init.kind));
      pf.f64(p.spec.init.a);
      pf.f64(p.spec.init.b);
      pf.u64(p.offset);
      pf.u64(value_hashes[pi]);
      prints.push_back(pf.h);
      names.push_back(fmt::format("param '{}' of unit '{}'", p.spec.name, unit.name));
      unit_entry.push_back(false);
    }
  }
  const std::vector<std::uint64_t> all = comm::all_gather_vectors(bootstrap, prints);
  const auto differs = [&](std::size_t i) {
    for (int r = 1; r < size; ++r) {
      if (entry(all, prints.size(), r, i) != entry(all, prints.size(), 0, i)) return true;
    }
    return false;
  };
  for (std::size_t i = 0; i < prints.size(); ++i) {
    if (!differs(i)) continue;
    // A unit differs when its params do: name the first such param, the more precise culprit.
    std::size_t culprit = i;
    for (std::size_t j = i + 1; unit_entry[i] && j < prints.size() && !unit_entry[j]; ++j) {
      if (differs(j)) {
        culprit = j;
        break;
      }
    }
    throw Error(fmt::format(
        "ranks disagree on {} (its name, shape, flags, init, layout or, for persistent units, initial values): {}; "
        "every rank must declare the same units and params in the same order",
        names[culprit], describe_split(all, prints.size(), size, culprit)));
  }
}

}  // namespace zero3::engine
