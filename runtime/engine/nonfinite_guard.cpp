#include "nonfinite_guard.hpp"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "optimizer_step.hpp"
#include "zero3/comm/typed_collectives.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/events.hpp"

namespace zero3::engine {
namespace {

// What one rank found, as it travels through the bootstrap's all-gather.
struct RankFinding {
  std::int64_t param = -1;  // layout index of the first param with a non-finite gradient; -1: none
  std::int64_t element = 0;
  std::uint64_t count = 0;  // non-finite elements in this rank's shard
  float value = 0.0f;
  std::int32_t loss_nonfinite = 0;
};

// The rank's scan of its accumulators, param by param in layout order.
RankFinding scan_shard(const Layout& layout, const float* acc) {
  RankFinding f;
  for (const UnitLayout& u : layout.units) {
    const GroupLayout& g = u.group(Group::trainable);
    for (const std::size_t pi : u.params) {
      const ParamLayout& p = layout.params[pi];
      if (p.group != Group::trainable) continue;
      const SliceOverlap o = overlap(p, g.shard_begin, g.shard);
      const float* x = acc + g.flat_offset + o.slice_offset;
      for (std::size_t i = 0; i < o.count; ++i) {
        if (std::isfinite(x[i])) continue;
        if (f.param < 0) {
          f.param = static_cast<std::int64_t>(pi);
          f.element = static_cast<std::int64_t>(o.param_first + i);
          f.value = x[i];
        }
        ++f.count;
      }
    }
  }
  return f;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (const int r : ranks) s += fmt::format("{}{}", s.empty() ? "" : ", ", r);
  return s;
}

}  // namespace

std::string NonfiniteReport::describe() const {
  std::string s = fmt::format("step {}: ", step);
  if (first) {
    s += fmt::format(
        "non-finite gradient in '{}' (unit '{}', element {}, rank {}: {}); {} non-finite element(s) on "
        "rank(s) {}",
        first->param, first->unit, first->element, first->rank, first->value, nonfinite_elems, rank_list(grad_ranks));
  } else if (loss_ranks.empty()) {
    s += fmt::format("the gradient norm is not finite ({}) although every element is: the squared norm overflows fp32",
                     grad_norm);
  } else {
    s += "every gradient element is finite";
  }
  if (!loss_ranks.empty()) s += fmt::format("; non-finite loss on rank(s) {}", rank_list(loss_ranks));
  return s;
}

NonfiniteReport locate_nonfinite(const Layout& layout, ShardOptimizer& optimizer, Device& device, Stream& stream,
                                 comm::Bootstrap& bootstrap, bool loss_nonfinite, std::int64_t step, double grad_norm) {
  stream.synchronize();
  optimizer.prepare_read();
  const MemoryKind host_kind = device.caps().host_staging;
  Buffer host = device.allocate(layout.state_count, DType::f32, host_kind, MemCategory::staging);
  if (layout.state_count > 0) optimizer.copy_out(device, TensorKind::grad, 0, host.view(), stream);
  stream.synchronize();
  RankFinding mine = scan_shard(layout, host.view().as<float>());
  mine.loss_nonfinite = loss_nonfinite ? 1 : 0;

  const std::vector<RankFinding> all = comm::all_gather_values(bootstrap, mine);
  NonfiniteReport report;
  report.step = step;
  report.grad_norm = grad_norm;
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  for (int r = 0; r < bootstrap.size(); ++r) {
    const RankFinding& f = all[static_cast<std::size_t>(r)];
    if (f.loss_nonfinite != 0) report.loss_ranks.push_back(r);
    if (f.param < 0) continue;
    report.grad_ranks.push_back(r);
    report.nonfinite_elems += f.count;
    if (f.param < best) {  // ties go to the lowest rank: ranks are visited in order
      best = f.param;
      const ParamLayout& p = layout.params[static_cast<std::size_t>(f.param)];
      report.first =
          NonfiniteSite{layout.units[p.unit].name, p.spec.name, static_cast<std::uint64_t>(f.element), r, f.value};
    }
  }
  return report;
}

void NonfiniteGuard::skipped(const NonfiniteReport& report) {
  ++consecutive_;
  const bool abort = settings_.policy == config::NonfinitePolicy::abort;
  const bool limit = consecutive_ >= settings_.max_consecutive;
  if (rank_ == 0) {
    events::Event e;
    e.level = abort || limit ? log::Level::error : log::Level::warning;
    e.kind = abort || limit ? "nonfinite_abort" : "nonfinite_skip";
    e.step = report.step;
    e.message = fmt::format("{}; the step is {} ({} in a row, zero3.nonfinite.max_consecutive {})", report.describe(),
                            abort ? "not applied and the run ends (zero3.nonfinite.policy abort)" : "skipped",
                            consecutive_, settings_.max_consecutive);
    e.figures = {{"grad_norm", report.grad_norm},
                 {"consecutive", static_cast<double>(consecutive_)},
                 {"max_consecutive", static_cast<double>(settings_.max_consecutive)},
                 {"nonfinite_elems", static_cast<double>(report.nonfinite_elems)}};
    e.fields = {{"grad_ranks", rank_list(report.grad_ranks)}, {"loss_ranks", rank_list(report.loss_ranks)}};
    if (report.first) {
      e.fields.emplace_back("unit", report.first->unit);
      e.fields.emplace_back("param", report.first->param);
      e.figures.emplace_back("element", static_cast<double>(report.first->element));
      e.figures.emplace_back("rank", static_cast<double>(report.first->rank));
    }
    events::emit(e);
  }
  if (abort) {
    throw NonFiniteError(
        fmt::format("{}; zero3.nonfinite.policy is \"abort\" (\"skip\" would skip such steps)", report.describe()));
  }
  if (limit) {
    throw NonFiniteError(fmt::format(
        "{}; {} non-finite steps in a row (zero3.nonfinite.max_consecutive {}): training has diverged; lower the "
        "lr, enable gradient_clipping, or resume from an earlier checkpoint",
        report.describe(), consecutive_, settings_.max_consecutive));
  }
}

}  // namespace zero3::engine
