// libFuzzer target over the token-file readers (zero3/data/token_file.hpp): the input's first byte picks
// TokenFile::open (zero3 and llm.c headers) or open_raw16, the rest is the file, opened through a memfd.
// Any input must either open or throw ConfigError, never crash or throw anything else; a file that opens
// must serve every window of a short context within its vocabulary.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zero3/core/error.hpp"
#include "zero3/data/token_file.hpp"

namespace data = zero3::data;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  if (size == 0) return 0;
  const bool raw16 = (bytes[0] & 1u) != 0;
  const int fd = ::memfd_create("fuzz_token_file", MFD_CLOEXEC);
  if (fd < 0 || ::write(fd, bytes + 1, size - 1) != static_cast<ssize_t>(size - 1)) __builtin_trap();
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  try {
    const data::TokenFile file = raw16 ? data::TokenFile::open_raw16(path, 0.25) : data::TokenFile::open(path, 0.25);
    constexpr std::int64_t kContext = 3;
    std::vector<data::TokenId> window(kContext + 1);
    for (const data::Split split : {data::Split::train, data::Split::heldout}) {
      for (std::int64_t i = 0; i < file.num_samples(split, kContext); ++i) {
        file.tokens(split, i, kContext, window);
        for (const data::TokenId id : window) {
          if (id < 0 || id >= file.vocab_size()) __builtin_trap();
        }
      }
    }
  } catch (const zero3::ConfigError&) {
    // the documented way to reject a file
  }
  ::close(fd);
  return 0;
}
