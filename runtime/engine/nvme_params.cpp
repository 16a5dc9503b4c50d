#include "nvme_params.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "nvme_optimizer.hpp"
#include "zero3/core/checked.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/trace.hpp"

namespace zero3::engine {

namespace {

using config::OffloadDevice;
using offload::kDirectAlign;

std::size_t shard_elems(const UnitLayout& ul) {
  return ul.group(Group::trainable).shard + ul.group(Group::frozen).shard;
}

// Whether the unit stays in host memory: persistent units, then units in layout order while they fit in
// max_in_cpu (`budget`: what is left of it).
bool keep_unit(const UnitLayout& ul, std::uint64_t& budget) {
  if (ul.persistent) return true;
  const std::uint64_t n = shard_elems(ul);
  if (n > budget) return false;
  budget -= n;
  return true;
}

std::uint64_t max_in_cpu(const config::Config& config) {
  return static_cast<std::uint64_t>(std::max<std::int64_t>(config.zero.offload_param.max_in_cpu, 0));
}

// Bytes of the whole blocks that cover each group's shard of the unit, one group after the other.
std::size_t unit_span_bytes(const UnitLayout& ul, DType dtype) {
  std::size_t bytes = 0;
  for (const Group g : {Group::trainable, Group::frozen}) {
    const GroupLayout& gl = ul.group(g);
    if (gl.shard == 0) continue;
    const std::uint64_t b = std::uint64_t{gl.flat_offset} * size_of(dtype);
    bytes += offload::direct_align_up(b + std::uint64_t{gl.shard} * size_of(dtype)) - b / kDirectAlign * kDirectAlign;
  }
  return bytes;
}

void check_buffers(const config::Config& config, const Layout& layout) {
  const config::OffloadConfig& p = config.zero.offload_param;
  if (p.buffer_count < 1) {
    throw ConfigError(
        fmt::format("zero_optimization.offload_param.buffer_count: {}; NVMe offload of params reads each "
                    "gathered unit's shard into one of these buffers: use at least 1",
                    p.buffer_count));
  }
  std::uint64_t budget = max_in_cpu(config);
  for (const UnitLayout& ul : layout.units) {
    if (keep_unit(ul, budget)) continue;
    const std::size_t n = shard_elems(ul);
    if (n > static_cast<std::uint64_t>(std::max<std::int64_t>(p.buffer_size, 0))) {
      throw ConfigError(fmt::format(
          "zero_optimization.offload_param.buffer_size: {} elements, but unit '{}' has a shard of {} elements on "
          "this rank, which is read into one buffer: use at least {} (or raise max_in_cpu to keep the unit in "
          "host memory)",
          p.buffer_size, ul.name, n, n));
    }
  }
}

// The directory of the params file, once the read buffers are known to be usable: checked before the
// rank directory is claimed, so a bad buffer setting leaves nothing on the disk.
const std::string& checked_nvme_path(const config::Config& config, const Layout& layout) {
  check_buffers(config, layout);
  return *config.zero.offload_param.nvme_path;
}

}  // namespace

std::size_t nvme_params_kept_elems(const config::Config& config, const Layout& layout) {
  std::uint64_t budget = max_in_cpu(config);
  std::size_t kept = 0;
  for (const UnitLayout& ul : layout.units) {
    if (keep_unit(ul, budget)) kept += shard_elems(ul);
  }
  return kept;
}

std::size_t nvme_params_buffer_bytes(const config::Config& config, const Layout& layout, DType dtype) {
  std::uint64_t budget = max_in_cpu(config);
  std::size_t bytes = 0;
  for (const UnitLayout& ul : layout.units) {
    if (!keep_unit(ul, budget)) bytes = std::max(bytes, unit_span_bytes(ul, dtype));
  }
  return bytes;
}

MemoryTable nvme_params_memory(const config::Config& config, const Layout& layout, DType dtype) {
  MemoryTable t;
  const config::OffloadConfig& p = config.zero.offload_param;
  if (p.device != OffloadDevice::nvme) return t;
  const MemoryKind kind = p.pin_memory ? MemoryKind::pinned_host : MemoryKind::pageable_host;
  t.at(kind, MemCategory::param_shard) += std::uint64_t{nvme_params_kept_elems(config, layout)} * size_of(dtype);
  const std::size_t buffer = nvme_params_buffer_bytes(config, layout, dtype);
  if (buffer > 0) {
    const auto count = static_cast<std::uint64_t>(std::max<std::int64_t>(p.buffer_count, 1));
    // A count past what memory could ever hold is refused by the plan, not wrapped into a small one.
    t.at(kind, MemCategory::staging) += checked_mul<ConfigError>(
        count, std::uint64_t{buffer} + kDirectAlign, "zero_optimization.offload_param.buffer_count x buffer bytes");
  }
  t.at(MemoryKind::pageable_host, MemCategory::staging) += SwapFile::kBounceBytes + 2 * kDirectAlign;
  return t;
}

std::uint64_t nvme_params_disk_bytes(const config::Config& config, const Layout& layout, DType dtype) {
  if (config.zero.offload_param.device != OffloadDevice::nvme) return 0;
  return offload::direct_align_up(std::uint64_t{layout.param_shard_count} * size_of(dtype));
}

NvmeParams::NvmeParams(const config::Config& config, const Layout& layout, Device& device, OffloadHost& host,
                       DType dtype, int rank)
    : count_(layout.param_shard_count),
      dtype_(dtype),
      dir_(checked_nvme_path(config, layout), rank),
      queue_(nvme_aio_options(config)) {
  if (layout.param_shard_count > 0) {
    file_.emplace(fmt::format("{}/params.{}", dir_.path(), dtype_name(dtype)), layout.param_shard_count, dtype);
  }
  const bool pinned = config.zero.offload_param.pin_memory;
  if (const std::size_t kept = nvme_params_kept_elems(config, layout); kept > 0) {
    kept_memory_ = host.allocate(device, kept, dtype, pinned, MemCategory::param_shard);
  }
  for (const UnitLayout& ul : layout.units) {
    const GroupLayout& t = ul.group(Group::trainable);
    const GroupLayout& f = ul.group(Group::frozen);
    units_.push_back({ul.name, {t.flat_offset, t.shard}, {f.flat_offset, f.shard}});
  }
  kept_.resize(layout.units.size());
  std::uint64_t budget = max_in_cpu(config);
  std::size_t at = 0;
  for (std::size_t u = 0; u < layout.units.size(); ++u) {
    const UnitLayout& ul = layout.units[u];
    if (!keep_unit(ul, budget)) continue;
    kept_[u] = at;
    for (const Group g : {Group::trainable, Group::frozen}) {
      const GroupLayout& gl = ul.group(g);
      if (gl.shard > 0) kept_ranges_.push_back({gl.flat_offset, gl.shard, at});
      at += gl.shard;
    }
  }
  std::sort(kept_ranges_.begin(), kept_ranges_.end(),
            [](const KeptRange& a, const KeptRange& b) { return a.first < b.first; });
  const std::size_t buffer = nvme_params_buffer_bytes(config, layout, dtype);
  if (buffer == 0) return;  // every unit is kept
  slots_.resize(static_cast<std::size_t>(config.zero.offload_param.buffer_count));
  for (Slot& s : slots_) {
    s.memory = host.allocate(device, (buffer + kDirectAlign + sizeof(float) - 1) / sizeof(float), DType::f32, pinned,
                             MemCategory::staging);
    const auto address = reinterpret_cast<std::uintptr_t>(s.memory.data());
    s.aligned = static_cast<std::byte*>(s.memory.data()) + (offload::direct_align_up(address) - address);
    s.copied = device.create_event();
  }
}

NvmeParams::~NvmeParams() {
  try {
    queue_.wait_all();
  } catch (...) {  // reported by the call that waited; nothing more to do while tearing down
  }
}

void NvmeParams::read(std::size_t first, std::size_t n, void* dst) {
  if (n == 0) return;
  const std::size_t elem = size_of(dtype_);
  if (!all_kept(first, n)) file_->read(queue_, bounce_, first, n, dst);
  // The kept units' values are the host copies (the file's may be older).
  for (const KeptRange& r : kept_ranges_) {
    const std::size_t lo = std::max(first, r.first);
    const std::size_t hi = std::min(first + n, r.first + r.count);
    if (lo >= hi) continue;
    std::memcpy(static_cast<std::byte*>(dst) + (lo - first) * elem,
                static_cast<const std::byte*>(kept_memory_.data()) + (r.host + lo - r.first) * elem, (hi - lo) * elem);
  }
}

void NvmeParams::write(std::size_t first, std::size_t n, const void* src) {
  if (n == 0) return;
  write_kept(first, n, src);
  drop_read_ahead();
  if (!all_kept(first, n)) file_->write(queue_, bounce_, first, n, src);
}

std::optional<offload::AioQueue::Ticket> NvmeParams::write_blocks(offload::AioQueue& queue, std::size_t first,
                                                                  std::size_t n, const void* src) {
  if (n == 0) return std::nullopt;
  write_kept(first, n, src);
  drop_read_ahead();
  if (all_kept(first, n)) return std::nullopt;
  const std::size_t end = first + n;
  // A partial last block would carry padding over the params after it: those go through the bounce buffer.
  if (end == count_ || end * size_of(dtype_) % kDirectAlign == 0) {
    return file_->write_blocks(queue, first, n, src);
  }
  file_->write(queue_, bounce_, first, n, src);
  return std::nullopt;
}

void NvmeParams::write_kept(std::size_t first, std::size_t n, const void* src) {
  const std::size_t elem = size_of(dtype_);
  for (const KeptRange& r : kept_ranges_) {
    const std::size_t lo = std::max(first, r.first);
    const std::size_t hi = std::min(first + n, r.first + r.count);
    if (lo >= hi) continue;
    std::memcpy(static_cast<std::byte*>(kept_memory_.data()) + (r.host + lo - r.first) * elem,
                static_cast<const std::byte*>(src) + (lo - first) * elem, (hi - lo) * elem);
  }
}

bool NvmeParams::all_kept(std::size_t first, std::size_t n) const {
  std::size_t at = first;
  for (const KeptRange& r : kept_ranges_) {
    if (r.first + r.count <= at) continue;
    if (r.first > at) return false;
    at = r.first + r.count;
    if (at >= first + n) return true;
  }
  return at >= first + n;
}

ConstBufferView NvmeParams::shard(std::size_t unit, Group g) {
  const UnitShards& us = units_[unit];
  const Shard& s = us.of(g);
  if (kept_[unit]) {
    const std::size_t at = *kept_[unit] + (g == Group::frozen ? us.trainable.count : 0);
    return kept_memory_.cview().slice(at, s.count);
  }
  Slot* slot = find_slot(unit);
  if (slot == nullptr) {
    slot = free_slot(/*wait=*/true);
    start_read(*slot, unit);
  }
  if (slot->read) {
    const trace::Scope span("nvme", fmt::format("wait params of {}", us.name));
    queue_.wait(*slot->read);
    slot->read.reset();
  }
  slot->last_use = ++uses_;
  std::size_t offset = 0;
  if (g == Group::frozen && us.trainable.count > 0) offset = file_->span_bytes(us.trainable.flat, us.trainable.count);
  offset += file_->span_skip(s.flat);
  return {slot->aligned + offset, s.count, dtype_, slot->memory.cview().kind};
}

DiskTimes NvmeParams::take_disk_times() {
  const offload::AioQueue::Counters now = queue_.counters();
  DiskTimes d;
  d.param_read_bytes = now.read_bytes - reported_.read_bytes;
  d.param_wait_ms = (now.wait_s - reported_.wait_s) * 1e3;
  reported_ = now;
  return d;
}

void NvmeParams::copied(std::size_t unit, Stream& stream) {
  Slot* slot = find_slot(unit);
  if (slot == nullptr) return;  // kept in host memory
  stream.record(*slot->copied);
  slot->copy_pending = true;
}

void NvmeParams::read_ahead(std::span<const std::size_t> units) {
  for (const std::size_t unit : units) {
    if (kept_[unit] || find_slot(unit) != nullptr) continue;
    Slot* slot = free_slot(/*wait=*/false);
    if (slot == nullptr) return;
    start_read(*slot, unit);
  }
}

NvmeParams::Slot* NvmeParams::find_slot(std::size_t unit) {
  for (Slot& s : slots_) {
    if (s.unit == unit) return &s;
  }
  return nullptr;
}

// A buffer whose contents no one needs: empty, or holding a unit already handed out whose copies have
// completed; the least recently used first. With `wait`, when there is none, the least recently used buffer
// is taken once its copies (or its read) are done.
NvmeParams::Slot* NvmeParams::free_slot(bool wait) {
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    const bool unread_ahead = s.unit != kNone && s.last_use == 0;
    if (s.read || unread_ahead) continue;
    if (s.copy_pending && !s.copied->query()) continue;
    if (best == nullptr || s.last_use < best->last_use) best = &s;
  }
  if (best == nullptr && wait) {
    for (Slot& s : slots_) {
      if (best == nullptr || s.last_use < best->last_use) best = &s;
    }
    if (best->read) queue_.wait(*best->read);
    best->read.reset();
    if (best->copy_pending) best->copied->synchronize();
  }
  if (best != nullptr) {
    best->copy_pending = false;
    best->unit = kNone;
  }
  return best;
}

void NvmeParams::start_read(Slot& slot, std::size_t unit) {
  std::byte* at = slot.aligned;
  for (const Group g : {Group::trainable, Group::frozen}) {
    const Shard& s = units_[unit].of(g);
    if (s.count == 0) continue;
    slot.read = file_->read_span(queue_, s.flat, s.count, at);
    at += file_->span_bytes(s.flat, s.count);
  }
  slot.unit = unit;
  slot.last_use = 0;  // read ahead, not yet handed out
}

void NvmeParams::drop_read_ahead() {
  for (Slot& s : slots_) {
    if (s.read) queue_.wait(*s.read);
    s.read.reset();
    s.unit = kNone;
  }
}

}  // namespace zero3::engine
