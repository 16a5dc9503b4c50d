#include "adagrad.cuh"
#include "optim_common.cuh"

namespace zero3::kernels::gpu {
namespace {

template <typename G, typename P>
__global__ void adagrad_kernel(detail::AdagradCoeffs c, float* __restrict__ master, float* __restrict__ sum_sq,
                               const G* __restrict__ grad, P* __restrict__ param, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float p = master[i], s = sum_sq[i];
    detail::adagrad_elem(c, load_f32(grad[i]), p, s);
    master[i] = p;
    sum_sq[i] = s;
    store_param(param, i, p);
  }
}

}  // namespace

void launch_adagrad(cudaStream_t stream, const detail::AdagradCoeffs& c, BufferView master, BufferView sum_sq,
                    ConstBufferView grad, BufferView param) {
  with_step_types(grad, param, [&](auto grad_tag, auto param_tag) {
    using G = typename decltype(grad_tag)::type;
    using P = typename decltype(param_tag)::type;
    adagrad_kernel<G, P><<<grid_for(master.count), kThreads, 0, stream>>>(
        c, static_cast<float*>(master.data), static_cast<float*>(sum_sq.data), static_cast<const G*>(grad.data),
        static_cast<P*>(param.data), master.count);
    ZERO3_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace zero3::kernels::gpu
