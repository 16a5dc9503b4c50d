// cpu_checkpointing for the CUDA decoders: under full recomputation the layers' inputs (the residual stream)
// take turns in two device buffers, and the inputs a later layer overwrites are copied to pinned host memory
// on a copy stream of their own during forward and brought back one layer ahead in backward, so the copies run
// behind the compute when they fit in its time.
//
// Layer u (1 .. L) reads input u - 1 from buffer (u - 1) % 2 and writes its output into buffer u % 2 (the last
// layer's into a third, the head's input). Input k is overwritten by layer k + 2's output, so only inputs
// 0 .. L - 3 leave the device; inputs L - 2 and L - 1 are still in place when backward starts. The compute
// stream waits for a copy only where it would overwrite or read a buffer the copy has not finished with; each
// such wait is timed with a pair of events around it, which is the exposed copy time.
//
//   KeptInputsCopier copier(layers, elems);   // the model's device current
//   copier.before_forward(u, compute);        // then enqueue layer u's forward
//   copier.after_forward(u, input, compute);
//   copier.before_backward(u, next_input, compute);  // then enqueue layer u's backward
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "cuda_resources.hpp"

namespace zero3::models::gpu {

class KeptInputsCopier {
 public:
  KeptInputsCopier();
  ~KeptInputsCopier();
  KeptInputsCopier(const KeptInputsCopier&) = delete;
  KeptInputsCopier& operator=(const KeptInputsCopier&) = delete;

  // A train pass of `layers` layers whose inputs hold `elems` floats each: grows the pinned store (after the
  // copies in flight).
  void prepare(std::size_t layers, std::size_t elems);
  // Before layer u's forward, which overwrites input u - 2: that input's copy out has completed.
  void before_forward(std::size_t u, cudaStream_t compute);
  // After layer u's forward: input u - 1 (at `input`) goes out when a later layer overwrites it.
  void after_forward(std::size_t u, const float* input, cudaStream_t compute);
  // Before layer u's backward: its input is back, and input u - 2 starts coming back into `next_input` (the
  // buffer of input u, which layer u + 1's backward, enqueued already, was the last to read).
  void before_backward(std::size_t u, float* next_input, cudaStream_t compute);

  // Pinned bytes of the store; the compute stream's time stalled on copies since the last call, of the waits
  // that completed (milliseconds; never blocks).
  std::size_t host_bytes() const { return store_.size_bytes(); }
  double take_exposed_ms();

 private:
  bool leaves_device(std::size_t k) const { return layers_ >= 3 && k + 3 <= layers_; }  // input k is overwritten
  // compute waits for `event` (recorded on the copy stream), the wait timed.
  void timed_wait(cudaStream_t compute, cudaEvent_t event);
  // The copy stream waits for the work enqueued on `compute` so far.
  void after_compute(cudaStream_t compute);
  float* slot(std::size_t k) { return store_.as<float>() + k * elems_; }

  cudaStream_t copy_ = nullptr;
  CudaArray store_;  // pinned: inputs 0 .. layers - 3, elems_ floats each
  std::size_t layers_ = 0;
  std::size_t elems_ = 0;
  CudaEventHandle progress_;                                  // on the compute stream, for the copy stream to wait on
  CudaEventHandle out_[2];                                    // per device buffer: its input's copy out has completed
  CudaEventHandle back_[2];                                   // per device buffer: its input's copy back has completed
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> pending_;  // timed waits not read yet, in stream order
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> spare_;
};

}  // namespace zero3::models::gpu
