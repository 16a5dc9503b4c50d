#include "kept_inputs_cuda.hpp"

#include "zero3_cuda_check.hpp"

namespace zero3::models::gpu {

KeptInputsCopier::KeptInputsCopier() {
  ZERO3_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
}

KeptInputsCopier::~KeptInputsCopier() {
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamSynchronize(copy_));
  for (auto* list : {&pending_, &spare_}) {
    for (const auto& [a, b] : *list) {
      ZERO3_CUDA_CHECK_NOTHROW(cudaEventDestroy(a));
      ZERO3_CUDA_CHECK_NOTHROW(cudaEventDestroy(b));
    }
  }
  ZERO3_CUDA_CHECK_NOTHROW(cudaStreamDestroy(copy_));
}

void KeptInputsCopier::prepare(std::size_t layers, std::size_t elems) {
  layers_ = layers;
  elems_ = elems;
  const std::size_t bytes = (layers >= 3 ? layers - 2 : 0) * elems * sizeof(float);
  if (store_.size_bytes() >= bytes) return;
  ZERO3_CUDA_CHECK(cudaStreamSynchronize(copy_));  // the copies in flight still use the old store
  store_.reset();
  store_ = CudaArray(bytes, CudaArray::Kind::pinned);
}

void KeptInputsCopier::timed_wait(cudaStream_t compute, cudaEvent_t event) {
  std::pair<cudaEvent_t, cudaEvent_t> marks{};
  if (spare_.empty()) {
    ZERO3_CUDA_CHECK(cudaEventCreate(&marks.first));
    ZERO3_CUDA_CHECK(cudaEventCreate(&marks.second));
  } else {
    marks = spare_.back();
    spare_.pop_back();
  }
  ZERO3_CUDA_CHECK(cudaEventRecord(marks.first, compute));
  ZERO3_CUDA_CHECK(cudaStreamWaitEvent(compute, event, 0));
  ZERO3_CUDA_CHECK(cudaEventRecord(marks.second, compute));
  pending_.push_back(marks);
}

void KeptInputsCopier::after_compute(cudaStream_t compute) {
  ZERO3_CUDA_CHECK(cudaEventRecord(progress_.get(), compute));
  ZERO3_CUDA_CHECK(cudaStreamWaitEvent(copy_, progress_.get(), 0));
}

void KeptInputsCopier::before_forward(std::size_t u, cudaStream_t compute) {
  if (u >= 2 && leaves_device(u - 2)) timed_wait(compute, out_[u % 2].get());
}

void KeptInputsCopier::after_forward(std::size_t u, const float* input, cudaStream_t compute) {
  const std::size_t k = u - 1;
  if (!leaves_device(k)) return;
  after_compute(compute);
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(slot(k), input, elems_ * sizeof(float), cudaMemcpyDeviceToHost, copy_));
  ZERO3_CUDA_CHECK(cudaEventRecord(out_[k % 2].get(), copy_));
}

void KeptInputsCopier::before_backward(std::size_t u, float* next_input, cudaStream_t compute) {
  const std::size_t k = u - 1;
  if (leaves_device(k)) timed_wait(compute, back_[k % 2].get());
  if (u < 2 || !leaves_device(u - 2)) return;
  const std::size_t j = u - 2;
  after_compute(compute);
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(next_input, slot(j), elems_ * sizeof(float), cudaMemcpyHostToDevice, copy_));
  ZERO3_CUDA_CHECK(cudaEventRecord(back_[j % 2].get(), copy_));
}

double KeptInputsCopier::take_exposed_ms() {
  double total = 0.0;
  std::size_t done = 0;
  for (; done < pending_.size(); ++done) {
    const auto [a, b] = pending_[done];
    const cudaError_t ready = cudaEventQuery(b);
    if (ready == cudaErrorNotReady) break;
    ZERO3_CUDA_CHECK(ready);
    float ms = 0.0f;
    ZERO3_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    total += ms;
    spare_.push_back(pending_[done]);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  return total;
}

}  // namespace zero3::models::gpu
