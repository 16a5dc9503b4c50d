// The logging half of ZERO3_CUDA_CHECK_NOTHROW (zero3_cuda_check.hpp), compiled as C++ so that the header
// stays free of fmt for the .cu files.
#include <cuda_runtime.h>

#include "zero3/core/log.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::detail {

void warn_cuda_failure(const char* statement, cudaError_t status, const char* file, int line) noexcept {
  try {
    log::warn("{} failed: {}: {} ({}:{})", statement, cudaGetErrorName(status), cudaGetErrorString(status), file, line);
  } catch (...) {  // a failing log line must not turn a no-throw path into a throwing one
  }
}

}  // namespace zero3::detail
