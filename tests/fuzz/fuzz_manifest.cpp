// libFuzzer target over the checkpoint manifest reader: manifest_from_text (the text of manifest.json)
// and the checks CheckpointReader makes at open (detail::build_reader_index), both in checkpoint.hpp. Any
// input must either give a manifest or throw CheckpointError, never crash, hang or throw anything else.
// A manifest that reads must round-trip: to_json(manifest) reads back to the same JSON.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "zero3/ckpt/checkpoint.hpp"
#include "zero3/core/error.hpp"

namespace ckpt = zero3::ckpt;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string source = "fuzz/manifest.json";
  ckpt::Manifest m;
  try {
    m = ckpt::manifest_from_text(input, source);
    (void)ckpt::detail::build_reader_index(m, source);
  } catch (const zero3::CheckpointError&) {
    return 0;  // the documented way to reject a manifest
  }
  const std::string text = ckpt::to_json(m).dump();
  try {
    if (ckpt::to_json(ckpt::manifest_from_text(text, source)).dump() != text) __builtin_trap();
  } catch (const zero3::CheckpointError&) {
    __builtin_trap();  // what was written must read back
  }
  return 0;
}
