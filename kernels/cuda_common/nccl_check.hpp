// ZERO3_NCCL_CHECK(call): throws CommError naming the call, NCCL's error string, file and line when an
// NCCL function does not return ncclSuccess; the _NOTHROW form logs instead, for destructors. The CUDA runtime
// calls around NCCL's use ZERO3_CUDA_CHECK (zero3_cuda_check.hpp). Private to zero3's CUDA-built sources
// (target zero3_cuda_common).
#pragma once

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
