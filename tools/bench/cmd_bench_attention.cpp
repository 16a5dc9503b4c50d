// `zero3-bench attention`: the host models' tiled attention (runtime/models/flash_attention.hpp), forward and
// backward, with fp32 and with bf16 products, on --threads of the models' pool, and with --torch-python torch's
// scaled_dot_product_attention at the same shape and thread count (tools/python/torch_sdpa.py, run in the
// same rounds, interleaved with zero3's). One table: median and range over the rounds, seconds per call, and
// zero3's fwd + bwd time over torch's in the same dtype.
#include <fmt/format.h>
#include <sys/wait.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "flash_attention.hpp"
#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "zero3/core/error.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::tools {
namespace {

using Index = std::size_t;
namespace par = zero3::models::par;

struct Args {
  Index batch = 1;
  Index len = 8192;
  Index heads = 9;
  Index head_dim = 64;
  int threads = 1;
  int rounds = 3;
  std::string torch_python;
  std::string torch_script = "tools/python/torch_sdpa.py";
};

struct Times {
  std::vector<double> forward, backward, total;
  void add(double f, double b) {
    forward.push_back(f);
    backward.push_back(b);
    total.push_back(f + b);
  }
};

// One forward and one backward of zero3's attention; seconds each.
std::pair<double, double> time_zero3(const Args& a, bool bf16) {
  const Index d = a.heads * a.head_dim;
  const Index rows = a.batch * a.len;
  std::vector<float> qkv(rows * 3 * d), datt(rows * d), att(rows * d), dqkv(rows * 3 * d);
  std::vector<float> lse(a.batch * a.heads * a.len);
  const CounterRng rng(1, 0);
  for (Index i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(rng.normal(i));
  for (Index i = 0; i < datt.size(); ++i) datt[i] = static_cast<float>(rng.normal(qkv.size() + i));
  namespace ops = zero3::models::ops;
  auto t0 = bench::Clock::now();
  ops::flash_attention_forward(qkv.data(), lse.data(), att.data(), a.batch, a.len, a.heads, a.head_dim, bf16);
  const double forward = bench::seconds_since(t0);
  t0 = bench::Clock::now();
  ops::flash_attention_backward(qkv.data(), att.data(), lse.data(), datt.data(), dqkv.data(), a.batch, a.len, a.heads,
                                a.head_dim, bf16);
  return {forward, bench::seconds_since(t0)};
}

// torch_sdpa.py's JSON line, or a UsageError naming the command.
nlohmann::json run_torch(const Args& a) {
  const std::string cmd =
      fmt::format("'{}' '{}' --batch {} --len {} --heads {} --head-dim {} --threads {} --dtypes bf16,fp32",
                  a.torch_python, a.torch_script, a.batch, a.len, a.heads, a.head_dim, a.threads);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) throw UsageError(fmt::format("cannot run: {}", cmd));
  std::string out;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe.get()) != nullptr) out += buf.data();
  const int status = pclose(pipe.release());
  if (status != 0) {
    throw UsageError(fmt::format("exit status {}: {}", WIFEXITED(status) ? WEXITSTATUS(status) : status, cmd));
  }
  try {
    return nlohmann::json::parse(out);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(fmt::format("{}: not JSON ({}): {}", cmd, e.what(), out));
  }
}

void print_row(const std::string& name, const Times& t, const Times* base) {
  const auto cell = [](const std::vector<double>& v) {
    const bench::Spread s = bench::spread(v);
    return fmt::format("{:.3f} ({:.3f}-{:.3f})", s.median, s.min, s.max);
  };
  std::string ratio = "-";
  if (base != nullptr) {
    std::vector<double> r;
    for (std::size_t i = 0; i < t.total.size() && i < base->total.size(); ++i) r.push_back(t.total[i] / base->total[i]);
    const bench::Spread s = bench::spread(r);
    ratio = fmt::format("{:.2f}x ({:.2f}-{:.2f})", s.median, s.min, s.max);
  }
  fmt::print("{:<14} {:>24} {:>24} {:>24} {:>20}\n", name, cell(t.forward), cell(t.backward), cell(t.total), ratio);
}

void run(const Args& a) {
  if (!a.torch_python.empty() && !std::filesystem::is_regular_file(a.torch_script)) {
    throw UsageError(
        fmt::format("--torch-script {}: no such file (run from the repository root, or name it)", a.torch_script));
  }
  par::set_threads(a.threads);
  zero3::models::gemm::configure_backends();
  const bool bf16 = zero3::models::gemm::bf16_native();
  std::map<std::string, Times> times;
  std::string torch_version;
  for (int round = 0; round < a.rounds; ++round) {
    // Alternate who goes first, so that neither always runs on a machine the other just warmed.
    const bool torch_first = round % 2 == 1;
    const auto zero3_round = [&] {
      const auto [f32_forward, f32_backward] = time_zero3(a, false);
      times["zero3 fp32"].add(f32_forward, f32_backward);
      if (bf16) {
        const auto [b_forward, b_backward] = time_zero3(a, true);
        times["zero3 bf16"].add(b_forward, b_backward);
      }
    };
    const auto torch_round = [&] {
      if (a.torch_python.empty()) return;
      const nlohmann::json j = run_torch(a);
      if (j["torch"].is_null()) throw UsageError(fmt::format("{}: torch is not installed", a.torch_python));
      torch_version = j["torch"].get<std::string>();
      for (const auto& r : j["results"]) {
        times["torch " + r["dtype"].get<std::string>()].add(r["forward_s"].get<double>(),
                                                            r["backward_s"].get<double>());
      }
    };
    if (torch_first) torch_round();
    zero3_round();
    if (!torch_first) torch_round();
  }
  fmt::print("causal attention, batch {} x len {} x heads {} x head_dim {}, {} thread(s), {} rounds{}\n", a.batch,
             a.len, a.heads, a.head_dim, a.threads, a.rounds,
             torch_version.empty() ? "" : fmt::format(", torch {} scaled_dot_product_attention", torch_version));
  fmt::print("{:<14} {:>24} {:>24} {:>24} {:>20}\n", "", "forward s", "backward s", "forward + backward s",
             "time / torch's");
  for (const char* dtype : {"fp32", "bf16"}) {
    const auto z = times.find(fmt::format("zero3 {}", dtype));
    if (z == times.end()) continue;
    const auto t = times.find(fmt::format("torch {}", dtype));
    print_row(z->first, z->second, t == times.end() ? nullptr : &t->second);
    if (t != times.end()) print_row(t->first, t->second, nullptr);
  }
  fmt::print("median (range) over the rounds; bf16 = bf16 operands, fp32 accumulation{}\n",
             bf16 ? "" : " (not run: this CPU has no bf16 dot products)");
}

}  // namespace

void add_bench_attention_command(CLI::App& app) {
  auto opt = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "attention", "The host models' tiled causal attention, fp32 and bf16 products, beside torch's SDPA");
  cmd->add_option("--batch", opt->batch, "Sequences")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--len", opt->len, "Context length")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--heads", opt->heads, "Query heads (kv heads repeated)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--head-dim", opt->head_dim, "Head dimension")->check(CLI::PositiveNumber)->capture_default_str();
  bench::add_count_option(*cmd, "--threads", opt->threads, "Threads (the models' pool; torch.set_num_threads)");
  bench::add_count_option(*cmd, "--rounds", opt->rounds, "Rounds; zero3 and torch alternate first");
  cmd->add_option("--torch-python", opt->torch_python,
                  "A Python with torch: also time its scaled_dot_product_attention (run from the repository root)");
  cmd->add_option("--torch-script", opt->torch_script, "torch's side (tools/python/torch_sdpa.py)")
      ->capture_default_str();
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
