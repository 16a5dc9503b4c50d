// ZERO3_NCCL_CHECK(call): throws CommError naming the call, NCCL's error string, file and line when an
// NCCL function does not return ncclSuccess. ZERO3_COMM_CUDA_CHECK does the same for the CUDA runtime
// calls the NCCL backend makes (events, device selection), throwing CudaError. The _NOTHROW forms log
// instead, for destructors. Private to comm/; include only from CUDA-built sources.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

#define ZERO3_NCCL_CHECK(call)                         \
  ZERO3_CHECK_CALL(                                    \
      ::zero3::CommError, call, status == ncclSuccess, \
      std::string(ncclGetErrorString(status)) + " (ncclResult " + std::to_string(static_cast<int>(status)) + ")")

#define ZERO3_NCCL_CHECK_NOTHROW(call)                                                                    \
  do {                                                                                                    \
    const ncclResult_t status = (call);                                                                   \
    if (status != ncclSuccess) {                                                                          \
      ::zero3::log::warn("{} failed: {} ({}:{})", #call, ncclGetErrorString(status), __FILE__, __LINE__); \
    }                                                                                                     \
  } while (0)

#define ZERO3_COMM_CUDA_CHECK(call) \
  ZERO3_CHECK_CALL(::zero3::CudaError, call, status == cudaSuccess, std::string(cudaGetErrorString(status)))

#define ZERO3_COMM_CUDA_CHECK_NOTHROW(call)                                                               \
  do {                                                                                                    \
    const cudaError_t status = (call);                                                                    \
    if (status != cudaSuccess) {                                                                          \
      ::zero3::log::warn("{} failed: {} ({}:{})", #call, cudaGetErrorString(status), __FILE__, __LINE__); \
    }                                                                                                     \
  } while (0)
