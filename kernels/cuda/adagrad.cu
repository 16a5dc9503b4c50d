#include "adagrad.cuh"
#include "optim_common.cuh"

namespace zero3::kernels::gpu {
namespace {

// M: the master's storage type, S: the sum's, G: the gradient's, P: the param copy's (or NoParam).
// Each element is widened to fp32, updated by adagrad_elem and rounded back (kernels.hpp's rounding rule).
template <typename M, typename S, typename G, typename P>
__global__ void adagrad_kernel(detail::AdagradCoeffs c, M* __restrict__ master, S* __restrict__ sum_sq,
                               const G* __restrict__ grad, P* __restrict__ param, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = load_f32(master[i]), s = load_f32(sum_sq[i]);
    detail::adagrad_elem(c, load_f32(grad[i]), p, s);
    sum_sq[i] = store_f32<S>(s);
    store_master(master, param, i, p);
  }
}

}  // namespace

void launch_adagrad(cudaStream_t stream, const detail::AdagradCoeffs& c, BufferView master, BufferView sum_sq,
                    ConstBufferView grad, BufferView param) {
  with_storage_types(master.dtype, sum_sq.dtype, [&](auto master_tag, auto state_tag) {
    using M = typename decltype(master_tag)::type;
    using S = typename decltype(state_tag)::type;
    with_step_types(grad, param, [&](auto grad_tag, auto param_tag) {
      using G = typename decltype(grad_tag)::type;
      using P = typename decltype(param_tag)::type;
      adagrad_kernel<M, S, G, P><<<grid_for(master.count), kThreads, 0, stream>>>(
          c, static_cast<M*>(master.data), static_cast<S*>(sum_sq.data), static_cast<const G*>(grad.data),
          static_cast<P*>(param.data), master.count);
      ZERO3_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace zero3::kernels::gpu
