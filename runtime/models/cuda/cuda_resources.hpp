// RAII owners of the CUDA resources the CUDA models hold (device and pinned memory, events, the cuBLAS
// handle), a current-device guard, and the carver that splits one allocation into aligned views. Private
// to runtime/models/cuda; host code (compiled by the host compiler).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <utility>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models::gpu {

// Makes `ordinal` current for one call and restores the caller's device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int ordinal) {
    ZERO3_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != ordinal) ZERO3_CUDA_CHECK(cudaSetDevice(ordinal));
    switched_ = previous_ != ordinal;
  }
  ~DeviceGuard() {
    if (switched_) ZERO3_CUDA_CHECK_NOTHROW(cudaSetDevice(previous_));
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Move-only owner of device memory (cudaMalloc) or pinned host memory (cudaHostAlloc).
class CudaArray {
 public:
  enum class Kind : std::uint8_t { device, pinned };

  CudaArray() = default;
  CudaArray(std::size_t size_bytes, Kind kind) : kind_(kind) {
    if (size_bytes == 0) return;
    const cudaError_t err =
        kind == Kind::device ? cudaMalloc(&ptr_, size_bytes) : cudaHostAlloc(&ptr_, size_bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0;
      std::size_t total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      throw OutOfMemory(fmt::format(
          "CUDA model: cannot allocate {} bytes of {} memory for activations and scratch ({} of {} bytes of device "
          "memory free); lower train_micro_batch_size_per_gpu or zero3.model.seq_len",
          size_bytes, kind == Kind::device ? "device" : "pinned host", free_bytes, total_bytes));
    }
    ZERO3_CUDA_CHECK(err);
    size_bytes_ = size_bytes;
  }
  CudaArray(CudaArray&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), size_bytes_(std::exchange(o.size_bytes_, 0)), kind_(o.kind_) {}
  CudaArray& operator=(CudaArray&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      size_bytes_ = std::exchange(o.size_bytes_, 0);
      kind_ = o.kind_;
    }
    return *this;
  }
  CudaArray(const CudaArray&) = delete;
  CudaArray& operator=(const CudaArray&) = delete;
  ~CudaArray() { reset(); }

  // By the model's contract the caller has waited for every use of the memory.
  void reset() noexcept {
    if (ptr_ == nullptr) return;
    if (kind_ == Kind::device) {
      ZERO3_CUDA_CHECK_NOTHROW(cudaFree(ptr_));
    } else {
      ZERO3_CUDA_CHECK_NOTHROW(cudaFreeHost(ptr_));
    }
    ptr_ = nullptr;
    size_bytes_ = 0;
  }
  void* data() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  std::size_t size_bytes() const { return size_bytes_; }

 private:
  void* ptr_ = nullptr;
  std::size_t size_bytes_ = 0;
  Kind kind_ = Kind::device;
};

class CudaEventHandle {
 public:
  CudaEventHandle() { ZERO3_CUDA_CHECK(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming)); }
  ~CudaEventHandle() { ZERO3_CUDA_CHECK_NOTHROW(cudaEventDestroy(event_)); }
  CudaEventHandle(const CudaEventHandle&) = delete;
  CudaEventHandle& operator=(const CudaEventHandle&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle() { ZERO3_CUBLAS_CHECK(cublasCreate(&handle_)); }
  ~CublasHandle() {
    const cublasStatus_t status = cublasDestroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS) {
      try {
        log::warn("cublasDestroy failed: {}", cublasGetStatusString(status));
      } catch (...) {
      }
    }
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

// Hands out 256-byte-aligned slices of one fp32 allocation; with a null base it only counts.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(std::size_t count) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (count + kAlign - 1) / kAlign * kAlign;
    return p;
  }
  std::size_t used() const { return used_; }

 private:
  static constexpr std::size_t kAlign = 64;  // floats: 256 bytes, what cuBLAS's fastest kernels want
  float* base_;
  std::size_t used_ = 0;
};

}  // namespace zero3::models::gpu
