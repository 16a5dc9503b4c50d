// describe() and fingerprint() of a collective (declared with CollectiveInfo in zero3/comm/communicator.hpp): the
// words and the hash that the flight recorder, the watchdog's reports and the desync guard use. Here, below the
// communicators, since the flight recorder records with them.
#include <fmt/format.h>

#include <cstdint>
#include <string>

#include "zero3/comm/communicator.hpp"

namespace zero3::comm {

std::string describe(const CollectiveInfo& info) {
  if (info.op == "barrier") return fmt::format("barrier #{}", info.seq);
  std::string s = fmt::format("{} #{} ({} x {}", info.op, info.seq, dtype_name(info.dtype), info.count);
  if (info.reduce_op) s += fmt::format(", {}", reduce_op_name(*info.reduce_op));
  if (info.root >= 0) s += fmt::format(", root {}", info.root);
  s += ")";
  return s;
}

namespace {
// FNV-1a, 64 bit: stable across runs and builds, which std::hash is not.
struct Fnv1a {
  std::uint64_t h = 14695981039346656037ull;
  void bytes(const void* p, std::size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= b[i];
      h *= 1099511628211ull;
    }
  }
  void u64(std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {  // little-endian bytes regardless of the host's order
      const auto b = static_cast<unsigned char>(v >> (8 * i));
      bytes(&b, 1);
    }
  }
};
}  // namespace

std::uint64_t fingerprint(const CollectiveInfo& info) {
  Fnv1a f;
  f.u64(info.seq);
  f.bytes(info.op.data(), info.op.size());
  f.u64(static_cast<std::uint64_t>(info.dtype));
  f.u64(info.count);
  f.u64(info.reduce_op ? 1 + static_cast<std::uint64_t>(*info.reduce_op) : 0);
  f.u64(static_cast<std::uint64_t>(static_cast<std::int64_t>(info.root)));
  return f.h;
}

}  // namespace zero3::comm
