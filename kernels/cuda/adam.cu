#include "adam.cuh"
#include "optim_common.cuh"

namespace zero3::kernels::gpu {
namespace {

template <typename G, typename P>
__global__ void adam_kernel(detail::AdamCoeffs c, float* __restrict__ master, float* __restrict__ exp_avg,
                            float* __restrict__ exp_avg_sq, const G* __restrict__ grad, P* __restrict__ param,
                            std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = master[i], m = exp_avg[i], v = exp_avg_sq[i];
    detail::adam_elem(c, load_f32(grad[i]), p, m, v);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    store_param(param, i, p);
  }
}

}  // namespace

void launch_adam(cudaStream_t stream, const detail::AdamCoeffs& c, BufferView master, BufferView exp_avg,
                 BufferView exp_avg_sq, ConstBufferView grad, BufferView param) {
  with_step_types(grad, param, [&](auto grad_tag, auto param_tag) {
    using G = typename decltype(grad_tag)::type;
    using P = typename decltype(param_tag)::type;
    adam_kernel<G, P><<<grid_for(master.count), kThreads, 0, stream>>>(
        c, static_cast<float*>(master.data), static_cast<float*>(exp_avg.data), static_cast<float*>(exp_avg_sq.data),
        static_cast<const G*>(grad.data), static_cast<P*>(param.data), master.count);
    ZERO3_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace zero3::kernels::gpu
