// make_cuda_llama of a build without CUDA: says so.
#include "zero3/core/error.hpp"
#include "zero3/models/llama_cuda.hpp"

namespace zero3::models {

std::unique_ptr<UnitModel> make_cuda_llama(const LlamaConfig& /*config*/, Device& /*device*/) {
  throw ConfigError(
      "zero3.device: this zero3 was built without CUDA, so the llama model cannot run on a cuda device; rebuild "
      "with nvcc installed (and -DZERO3_ENABLE_CUDA=ON) or use \"zero3\": {\"device\": \"host\"}");
}

bool cuda_llama_available() {
  return false;
}

}  // namespace zero3::models
