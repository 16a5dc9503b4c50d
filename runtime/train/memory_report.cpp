#include "zero3/train/memory_report.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <vector>

namespace zero3::train {

std::string peak_memory_table(comm::Bootstrap& bootstrap, const MemoryTracker& m) {
  std::vector<std::uint64_t> mine;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c)
      mine.push_back(m.get(static_cast<MemoryKind>(k), static_cast<MemCategory>(c)).peak_bytes);
    mine.push_back(m.total(static_cast<MemoryKind>(k)).peak_bytes);
  }
  std::vector<std::byte> bytes(mine.size() * sizeof(std::uint64_t));
  std::memcpy(bytes.data(), mine.data(), bytes.size());
  const std::vector<std::byte> all = bootstrap.all_gather(bytes);
  const std::size_t ranks = all.size() / bytes.size();
  const auto at = [&](std::size_t rank, std::size_t i) {
    std::uint64_t v = 0;
    std::memcpy(&v, all.data() + rank * bytes.size() + i * sizeof v, sizeof v);
    return v;
  };
  std::string out = fmt::format("{:<34}", "peak MiB");
  for (std::size_t r = 0; r < ranks; ++r) out += fmt::format(" {:>10}", fmt::format("rank {}", r));
  out += '\n';
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c <= kNumMemCategories; ++c) {
      const std::size_t i = k * (kNumMemCategories + 1) + c;
      bool any = false;
      for (std::size_t r = 0; r < ranks; ++r) any = any || at(r, i) != 0;
      if (!any) continue;
      const std::string name = c == kNumMemCategories
                                   ? fmt::format("{} total", memory_kind_name(static_cast<MemoryKind>(k)))
                                   : fmt::format("{} {}", memory_kind_name(static_cast<MemoryKind>(k)),
                                                 mem_category_name(static_cast<MemCategory>(c)));
      out += fmt::format("  {:<32}", name);
      for (std::size_t r = 0; r < ranks; ++r)
        out += fmt::format(" {:>10.2f}", static_cast<double>(at(r, i)) / (1 << 20));
      out += '\n';
    }
  }
  return out;
}

}  // namespace zero3::train
