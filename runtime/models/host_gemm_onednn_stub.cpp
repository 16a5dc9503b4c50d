// host_gemm's oneDNN side in a build without oneDNN: nothing is built in, every call says so.
#include "host_gemm_onednn.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::gemm::onednn {

bool built() {
  return false;
}

bool bf16_supported() {
  return false;
}

void matmul(bool, int, bool, bool, std::size_t, std::size_t, std::size_t, float, const void*, std::size_t, const void*,
            std::size_t, float, float*, std::size_t) {
  throw UsageError("host gemm: this build has no oneDNN (configure with -DZERO3_WITH_ONEDNN=ON and libdnnl-dev)");
}

const char* impl(bool, bool, bool, std::size_t, std::size_t, std::size_t) {
  return "none (built without oneDNN)";
}

}  // namespace zero3::models::gemm::onednn
