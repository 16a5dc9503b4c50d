// Host accumulate and fused optimizer steps: one loop over the elements, split across oneTBB workers
// when large, that calls the per-element functions of optim_math.hpp on fp32 values widened from the
// master's and state's storage and rounds the results back to it (kernels.hpp's rounding rule). The CUDA
// kernels call the same functions, and this file is compiled without FP contraction (-ffp-contract=off,
// kernels/CMakeLists.txt), so both backends do the same fp32 operations in the same order.
#include "optim_host.hpp"

#include <type_traits>

#include "host_common.hpp"
#include "kernel_checks.hpp"
#include "optim_coeffs.hpp"
#include "optim_math.hpp"

namespace zero3::kernels::host {
namespace {

// The param type of a step that writes no low-precision copy.
struct NoParam {};

template <typename P>
inline void store_param(P* out, std::size_t i, float v) {
  if constexpr (!std::is_same_v<P, NoParam>) out[i] = from_float<P>(v);
}

// Stores the new master weight p, rounded to M, and the param copy of the value stored (kernels.hpp's
// rule: param == cast(master)). For fp32 M both are p itself, as before 16-bit masters existed.
template <typename M, typename P>
inline void store_master(M* master, P* out, std::size_t i, float p) {
  const M stored = from_float<M>(p);
  master[i] = stored;
  store_param(out, i, to_float(stored));
}

// Calls fn(grad_data, param_data) typed by grad's dtype and param's (NoParam when param is empty).
template <typename Fn>
void with_step_types(ConstBufferView grad, BufferView param, const Fn& fn) {
  with_type(grad.dtype, [&](auto grad_tag) {
    using G = decltype(grad_tag);
    auto typed = [&](auto param_tag) {
      using P = decltype(param_tag);
      fn(grad.as<G>(), static_cast<P*>(param.data));
    };
    if (param.count == 0) {
      typed(NoParam{});
    } else {
      with_type(param.dtype, typed);
    }
  });
}

// Calls fn(M{}, S{}) with M and S the storage types of a master and state pair that
// optimizer_storage_supported allows (checked before: no other pair gets here).
template <typename Fn>
void with_storage_types(DType master, DType state, const Fn& fn) {
  if (state == DType::bf16) {
    fn(bf16_t{}, bf16_t{});
    return;
  }
  with_type(master, [&](auto master_tag) { fn(master_tag, float{}); });
}

// The views of an optimizer step: shapes and overlaps (kernel_checks.hpp), then reachability.
void check_step(Stream& stream, std::string_view op, std::initializer_list<detail::StepView> views,
                ConstBufferView grad, BufferView param) {
  detail::check_step_views(op, views, grad, param);
  for (const detail::StepView& v : views) check_host_reachable(stream, op, v.kind);
  check_host_reachable(stream, op, grad.kind);
  if (param.count != 0) check_host_reachable(stream, op, param.kind);
}

}  // namespace

void accumulate(Stream& stream, BufferView dst, ConstBufferView src, float alpha) {
  detail::check_accumulate(dst, src);
  check_host_reachable(stream, "accumulate", dst.kind);
  check_host_reachable(stream, "accumulate", src.kind);
  if (dst.count == 0) return;
  stream.launch_host([dst, src, alpha] {
    with_type(src.dtype, [&](auto tag) {
      using S = decltype(tag);
      float* d = dst.as<float>();
      const S* s = src.as<S>();
      for_ranges(dst.count, [&](std::size_t b, std::size_t e) {
        for (std::size_t i = b; i < e; ++i) d[i] = detail::accumulate_elem(d[i], alpha, to_float(s[i]));
      });
    });
  });
}

void adam_step(Stream& stream, const AdamArgs& args, BufferView master, BufferView exp_avg, BufferView exp_avg_sq,
               ConstBufferView grad, BufferView param) {
  detail::check_adam_args(args);
  check_step(stream, "adam_step",
             {detail::step_view("master", master), detail::step_view("exp_avg", exp_avg),
              detail::step_view("exp_avg_sq", exp_avg_sq)},
             grad, param);
  if (master.count == 0) return;
  const detail::AdamCoeffs c = detail::adam_coeffs(args);
  stream.launch_host([c, master, exp_avg, exp_avg_sq, grad, param] {
    with_storage_types(master.dtype, exp_avg.dtype, [&](auto master_tag, auto state_tag) {
      using M = decltype(master_tag);
      using S = decltype(state_tag);
      with_step_types(grad, param, [&](const auto* g, auto* out) {
        M* p = master.as<M>();
        S* m = exp_avg.as<S>();
        S* v = exp_avg_sq.as<S>();
        for_ranges(master.count, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) {
            float pi = to_float(p[i]), mi = to_float(m[i]), vi = to_float(v[i]);
            detail::adam_elem(c, to_float(g[i]), pi, mi, vi);
            m[i] = from_float<S>(mi);
            v[i] = from_float<S>(vi);
            store_master(p, out, i, pi);
          }
        });
      });
    });
  });
}

void lion_step(Stream& stream, const LionArgs& args, BufferView master, BufferView exp_avg, ConstBufferView grad,
               BufferView param) {
  detail::check_lion_args(args);
  check_step(stream, "lion_step", {detail::step_view("master", master), detail::step_view("exp_avg", exp_avg)}, grad,
             param);
  if (master.count == 0) return;
  const detail::LionCoeffs c = detail::lion_coeffs(args);
  stream.launch_host([c, master, exp_avg, grad, param] {
    with_storage_types(master.dtype, exp_avg.dtype, [&](auto master_tag, auto state_tag) {
      using M = decltype(master_tag);
      using S = decltype(state_tag);
      with_step_types(grad, param, [&](const auto* g, auto* out) {
        M* p = master.as<M>();
        S* m = exp_avg.as<S>();
        for_ranges(master.count, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) {
            float pi = to_float(p[i]), mi = to_float(m[i]);
            detail::lion_elem(c, to_float(g[i]), pi, mi);
            m[i] = from_float<S>(mi);
            store_master(p, out, i, pi);
          }
        });
      });
    });
  });
}

void adagrad_step(Stream& stream, const AdagradArgs& args, BufferView master, BufferView sum_sq, ConstBufferView grad,
                  BufferView param) {
  detail::check_adagrad_args(args);
  check_step(stream, "adagrad_step", {detail::step_view("master", master), detail::step_view("sum_sq", sum_sq)}, grad,
             param);
  if (master.count == 0) return;
  const detail::AdagradCoeffs c = detail::adagrad_coeffs(args);
  stream.launch_host([c, master, sum_sq, grad, param] {
    with_storage_types(master.dtype, sum_sq.dtype, [&](auto master_tag, auto state_tag) {
      using M = decltype(master_tag);
      using S = decltype(state_tag);
      with_step_types(grad, param, [&](const auto* g, auto* out) {
        M* p = master.as<M>();
        S* s = sum_sq.as<S>();
        for_ranges(master.count, [&](std::size_t b, std::size_t e) {
          for (std::size_t i = b; i < e; ++i) {
            float pi = to_float(p[i]), si = to_float(s[i]);
            detail::adagrad_elem(c, to_float(g[i]), pi, si);
            s[i] = from_float<S>(si);
            store_master(p, out, i, pi);
          }
        });
      });
    });
  });
}

}  // namespace zero3::kernels::host
