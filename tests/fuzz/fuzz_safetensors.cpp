// libFuzzer target over the safetensors reader (zero3/ckpt/safetensors.hpp): the input is a whole file,
// opened through a memfd (header length, header JSON, data), then the first elements of every tensor are
// read. Any input must either open or throw CheckpointError, never crash, hang, allocate what the file
// merely claims (-malloc_limit_mb) or throw anything else; a tensor that opens must read.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero3/ckpt/safetensors.hpp"
#include "zero3/core/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const int fd = ::memfd_create("fuzz_safetensors", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, data, size) != static_cast<ssize_t>(size)) __builtin_trap();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const auto file = zero3::ckpt::SafetensorsFile::open(path);
    std::vector<float> out;
    for (const zero3::ckpt::SafetensorsTensor& t : file->header().tensors) {
      out.resize(static_cast<std::size_t>(std::min<std::uint64_t>(t.numel(), 64)));
      file->read(t, 0, out);
    }
  } catch (const zero3::CheckpointError&) {
    // the documented way to reject a file
  }
  ::close(fd);
  return 0;
}
