// Check macros for CUDA runtime and cuBLAS calls, derived from ZERO3_CHECK_CALL: a failing call throws
// zero3::CudaError naming the statement, the error (name and text), the file and the line.
// Private to zero3's CUDA-built sources (target zero3_cuda_common); public headers never include it.
// Safe in .cu files: it pulls in no fmt (nvcc 13's C++20 mode cannot compile fmt 9's headers).
// ZERO3_CUBLAS_CHECK needs <cublas_v2.h> included by the file that uses it.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "zero3/core/error.hpp"

// Throws zero3::CudaError when `statement` (returning cudaError_t) does not return cudaSuccess.
#define ZERO3_CUDA_CHECK(statement)                                      \
  ZERO3_CHECK_CALL(::zero3::CudaError, statement, status == cudaSuccess, \
                   std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status))

namespace zero3::detail {
// Logs "<statement> failed: <error> (file:line)" as a warning (defined in cuda_check.cpp, so that this
// header stays free of fmt, which nvcc's C++20 front end cannot compile).
void warn_cuda_failure(const char* statement, cudaError_t status, const char* file, int line) noexcept;
}  // namespace zero3::detail

// For destructors and other no-throw paths: logs a failure as a warning and goes on.
#define ZERO3_CUDA_CHECK_NOTHROW(statement)                                              \
  do {                                                                                   \
    cudaError_t zero3_status_ = (statement);                                             \
    if (zero3_status_ != cudaSuccess) {                                                  \
      ::zero3::detail::warn_cuda_failure(#statement, zero3_status_, __FILE__, __LINE__); \
    }                                                                                    \
  } while (0)

// After a kernel launch: a bad configuration is reported by cudaGetLastError, not by the launch itself.
#define ZERO3_CUDA_CHECK_LAUNCH() ZERO3_CUDA_CHECK(cudaGetLastError())

// Throws zero3::CudaError when `statement` (returning cublasStatus_t) is not CUBLAS_STATUS_SUCCESS.
#define ZERO3_CUBLAS_CHECK(statement)                                 \
  ZERO3_CHECK_CALL(                                                   \
      ::zero3::CudaError, statement, status == CUBLAS_STATUS_SUCCESS, \
      std::string("cuBLAS status ") + std::to_string(static_cast<int>(status)) + ": " + cublasGetStatusString(status))
