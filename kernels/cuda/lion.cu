#include "lion.cuh"
#include "optim_common.cuh"

namespace zero3::kernels::gpu {
namespace {

// M: the master's storage type, S: the state's, G: the gradient's, P: the param copy's (or NoParam).
// Each element is widened to fp32, updated by lion_elem and rounded back (kernels.hpp's rounding rule).
template <typename M, typename S, typename G, typename P>
__global__ void lion_kernel(detail::LionCoeffs c, M* __restrict__ master, S* __restrict__ exp_avg,
                            const G* __restrict__ grad, P* __restrict__ param, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = load_f32(master[i]), m = load_f32(exp_avg[i]);
    detail::lion_elem(c, load_f32(grad[i]), p, m);
    exp_avg[i] = store_f32<S>(m);
    store_master(master, param, i, p);
  }
}

}  // namespace

void launch_lion(cudaStream_t stream, const detail::LionCoeffs& c, BufferView master, BufferView exp_avg,
                 ConstBufferView grad, BufferView param) {
  with_storage_types(master.dtype, exp_avg.dtype, [&](auto master_tag, auto state_tag) {
    using M = typename decltype(master_tag)::type;
    using S = typename decltype(state_tag)::type;
    with_step_types(grad, param, [&](auto grad_tag, auto param_tag) {
      using G = typename decltype(grad_tag)::type;
      using P = typename decltype(param_tag)::type;
      lion_kernel<M, S, G, P><<<grid_for(master.count), kThreads, 0, stream>>>(
          c, static_cast<M*>(master.data), static_cast<S*>(exp_avg.data), static_cast<const G*>(grad.data),
          static_cast<P*>(param.data), master.count);
      ZERO3_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace zero3::kernels::gpu
