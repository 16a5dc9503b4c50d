// Engine::Impl::gather_tensor(): one param's whole tensor (or its gradient or optimizer state) as fp32 on
// every rank, gathered from the ranks' shards wherever they live.
#include <fmt/format.h>

#include "engine_impl.hpp"
#include "zero3/comm/watchdog.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/error.hpp"

namespace zero3 {

std::vector<float> Engine::Impl::gather_tensor(std::string_view name, TensorKind kind) {
  const comm::ScopedOpAnnotation note("gather_tensor", name);
  check_call(fmt::format("gather_tensor('{}')", name), true);
  const auto pi = layout->find_param(name);
  if (!pi) throw UsageError(fmt::format("gather_tensor: no param named '{}'", name));
  const engine::ParamLayout& p = layout->params[*pi];
  const engine::UnitLayout& unit = layout->units[p.unit];
  const engine::GroupLayout& g = unit.group(p.group);
  const bool frozen = p.group == engine::Group::frozen;
  if (frozen && kind != TensorKind::param && kind != TensorKind::master) {
    throw UsageError(
        fmt::format("gather_tensor('{}', {}): param '{}' of unit '{}' is frozen (trainable = false): it "
                    "has no gradient and no optimizer state",
                    name, tensor_kind_name(kind), name, unit.name));
  }
  // The rank's slice of this kind, copied into device memory (wherever it lives: device, host chunks)
  // so the all-gather reads it from where every backend can.
  DType source_dtype = dtype;
  engine::ShardOptimizer& opt = optimizer_step->optimizer();
  const bool from_shards = kind == TensorKind::param || (kind == TensorKind::master && frozen);
  if (!from_shards) {
    source_dtype = DType::f32;
    if (!opt.keeps(kind)) {
      throw UsageError(fmt::format("gather_tensor('{}', {}): the {} optimizer keeps no {}", name,
                                   tensor_kind_name(kind), config::to_string(config.optimizer->type),
                                   tensor_kind_name(kind)));
    }
  }
  comm_stream->synchronize();
  opt.prepare_read();
  Buffer mine = device->allocate(g.shard, source_dtype, MemoryKind::device, MemCategory::workspace);
  if (g.shard > 0 && from_shards) {
    read_params(g.flat_offset, mine.view());
  } else if (g.shard > 0) {
    opt.copy_out(*device, kind, g.flat_offset, mine.view(), *comm_stream);
  }
  Buffer full;
  ConstBufferView piece;
  if (unit.persistent) {
    piece = mine.cview().slice(p.offset, p.numel);
  } else {  // collective: every rank takes this path for the same param
    full = device->allocate(g.padded, source_dtype, MemoryKind::device, MemCategory::workspace);
    if (g.padded > 0) communicator->all_gather(mine.cview(), full.view(), *comm_stream);
    piece = full.cview().slice(p.offset, p.numel);
  }
  Buffer host = device->allocate(p.numel, source_dtype, device->caps().host_staging, MemCategory::staging);
  if (p.numel > 0) device->copy_async(host.view(), piece, *comm_stream);
  comm_stream->synchronize();  // also orders after every reduction and step enqueued so far
  std::vector<float> out(p.numel);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(host.data(), host.dtype(), i);
  return out;
}

}  // namespace zero3
