#include "zero3/train/memory_report.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zero3/comm/typed_collectives.hpp"
#include "zero3/core/resident.hpp"

namespace zero3::train {

namespace {

// Categories and the total of each kind, then the resident peak and base.
constexpr std::size_t kPerRank = kNumMemoryKinds * (kNumMemCategories + 1) + 2;

}  // namespace

RankPeaks rank_peaks(const MemoryTracker& m, std::uint64_t resident_base) {
  RankPeaks r;
  r.resident_peak = resident_peak_bytes().value_or(0);
  r.resident_base = resident_base;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      r.peak.at(kind, static_cast<MemCategory>(c)) = m.get(kind, static_cast<MemCategory>(c)).peak_bytes;
    }
    r.total_peak[k] = m.total(kind).peak_bytes;
  }
  return r;
}

std::vector<RankPeaks> gather_peaks(comm::Bootstrap& bootstrap, const MemoryTracker& memory,
                                    std::uint64_t resident_base) {
  const RankPeaks mine = rank_peaks(memory, resident_base);
  std::vector<std::uint64_t> flat;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) flat.push_back(mine.peak.bytes[k][c]);
    flat.push_back(mine.total_peak[k]);
  }
  flat.push_back(mine.resident_peak);
  flat.push_back(mine.resident_base);
  const std::vector<std::uint64_t> all = comm::all_gather_vectors(bootstrap, flat);
  std::vector<RankPeaks> ranks(all.size() / kPerRank);
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    const std::uint64_t* v = all.data() + r * kPerRank;
    for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
      for (std::size_t c = 0; c < kNumMemCategories; ++c)
        ranks[r].peak.bytes[k][c] = v[k * (kNumMemCategories + 1) + c];
      ranks[r].total_peak[k] = v[k * (kNumMemCategories + 1) + kNumMemCategories];
    }
    ranks[r].resident_peak = v[kPerRank - 2];
    ranks[r].resident_base = v[kPerRank - 1];
  }
  return ranks;
}

std::string peak_memory_table(const std::vector<RankPeaks>& ranks) {
  std::string out = fmt::format("{:<34}", "peak MiB");
  for (std::size_t r = 0; r < ranks.size(); ++r) out += fmt::format(" {:>10}", fmt::format("rank {}", r));
  out += '\n';
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    for (std::size_t c = 0; c <= kNumMemCategories; ++c) {
      const auto at = [&](const RankPeaks& p) {
        return c == kNumMemCategories ? p.total_peak[k] : p.peak.at(kind, static_cast<MemCategory>(c));
      };
      bool any = false;
      for (const RankPeaks& p : ranks) any = any || at(p) != 0;
      if (!any) continue;
      const std::string name = c == kNumMemCategories ? fmt::format("{} total", memory_kind_name(kind))
                                                      : fmt::format("{} {}", memory_kind_name(kind),
                                                                    mem_category_name(static_cast<MemCategory>(c)));
      out += fmt::format("  {:<32}", name);
      for (const RankPeaks& p : ranks) out += fmt::format(" {:>10.2f}", static_cast<double>(at(p)) / (1 << 20));
      out += '\n';
    }
  }
  return out;
}

std::string peak_memory_table(comm::Bootstrap& bootstrap, const MemoryTracker& memory) {
  return peak_memory_table(gather_peaks(bootstrap, memory));
}

std::string peak_phase_lines(const MemoryTracker& memory) {
  std::string out;
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      const auto kind = static_cast<MemoryKind>(k);
      const auto cat = static_cast<MemCategory>(c);
      const std::size_t peak = memory.get(kind, cat).peak_bytes;
      if (peak == 0) continue;
      const std::string phase = memory.peak_phase(kind, cat);
      out += fmt::format("  {:<32} {:>10.2f} MiB  in {}\n",
                         fmt::format("{} {}", memory_kind_name(kind), mem_category_name(cat)),
                         static_cast<double>(peak) / (1 << 20), phase.empty() ? "start-up" : phase);
    }
  }
  return out;
}

nlohmann::json memory_table_json(const MemoryTable& table) {
  nlohmann::json j = nlohmann::json::object();
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    nlohmann::json kind = nlohmann::json::object();
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      kind[std::string(mem_category_name(static_cast<MemCategory>(c)))] = table.bytes[k][c];
    }
    j[std::string(memory_kind_name(static_cast<MemoryKind>(k)))] = kind;
  }
  return j;
}

nlohmann::json peaks_json(const std::vector<RankPeaks>& ranks) {
  nlohmann::json list = nlohmann::json::array();
  for (std::size_t r = 0; r < ranks.size(); ++r) {
    nlohmann::json totals = nlohmann::json::object();
    for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
      totals[std::string(memory_kind_name(static_cast<MemoryKind>(k)))] = ranks[r].total_peak[k];
    }
    list.push_back({{"rank", r},
                    {"peak_bytes", memory_table_json(ranks[r].peak)},
                    {"total_peak_bytes", totals},
                    {"resident_bytes", {{"base", ranks[r].resident_base}, {"peak", ranks[r].resident_peak}}}});
  }
  return {{"ranks", list}};
}

nlohmann::json plan_json(const MemoryPlan& plan) {
  nlohmann::json ranks = nlohmann::json::array();
  nlohmann::json totals = nlohmann::json::object();
  nlohmann::json how = nlohmann::json::object();
  for (std::size_t k = 0; k < kNumMemoryKinds; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    totals[std::string(memory_kind_name(kind))] = plan.peak_total(kind);
    nlohmann::json h = nlohmann::json::object();
    for (std::size_t c = 0; c < kNumMemCategories; ++c) {
      if (!plan.how[k][c].empty()) h[std::string(mem_category_name(static_cast<MemCategory>(c)))] = plan.how[k][c];
    }
    how[std::string(memory_kind_name(kind))] = h;
  }
  for (int r = 0; r < plan.world_size; ++r) {
    ranks.push_back({{"rank", r}, {"peak_bytes", memory_table_json(plan.peak)}, {"total_peak_bytes", totals}});
  }
  const DeepSpeedEstimate& ds = plan.deepspeed;
  nlohmann::json deepspeed = {{"covered", ds.covered},
                              {"total_params", ds.total_params},
                              {"largest_layer_params", ds.largest_layer},
                              {"gpu_bytes_per_gpu", ds.gpu_bytes_per_gpu},
                              {"cpu_bytes_per_node", ds.cpu_bytes_per_node}};
  return {
      {"world_size", plan.world_size},
      {"ranks_per_node", plan.ranks_per_node},
      {"resident_bytes",
       {{"base", plan.resident_base}, {"library_temporary", plan.library_temporary}, {"peak", plan.resident_peak()}}},
      {"optimizer_storage",
       {{"master_dtype", dtype_name(plan.master_dtype)},
        {"state_dtype", dtype_name(plan.state_dtype)},
        {"states", plan.optimizer_states},
        {"bytes_per_param", plan.optimizer_bytes_per_param}}},
      {"nvme_bytes",
       {{"files", plan.nvme_file_bytes},
        {"read_per_step", plan.nvme_read_bytes_per_step},
        {"write_per_step", plan.nvme_write_bytes_per_step}}},
      {"ranks", ranks},
      {"how", how},
      {"deepspeed_estimate", deepspeed}};
}

}  // namespace zero3::train
