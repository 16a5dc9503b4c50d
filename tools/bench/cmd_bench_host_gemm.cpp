// `zero3-bench host-gemm`: the host GPT's matrix products at a config's shapes (every linear layer's forward,
// input-gradient and weight-gradient product: NT, NN and TN), timed through each candidate backend on 1
// and 2 threads (or --threads): OpenBLAS sgemm on its own thread pool and in host_gemm's blocks on the
// oneTBB pool, oneDNN fp32 matmul on its OpenMP pool, oneDNN bf16 matmul (bf16 operands, fp32 output) on
// its OpenMP pool and in host_gemm's blocks. OpenBLAS's kernel family follows OPENBLAS_CORETYPE (run once
// per value to compare). Prints one table per thread count: best-of-repeats time per product, GFLOP/s,
// and the sum over one training step's products.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "host_gemm.hpp"
#include "host_parallel.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/rng.hpp"

namespace zero3::tools {
namespace {

using zero3::bf16_t;
using zero3::models::gemm::Backend;
using Index = std::size_t;
namespace gemm = zero3::models::gemm;
namespace par = zero3::models::par;

struct Shape {
  std::string name;
  bool ta, tb;
  Index m, n, k;
  int per_step;  // how many such products one step runs (one per block)
};

struct Args {
  Index rows = 8 * 128;
  Index hidden = 256;
  Index vocab = 2048;
  int layers = 4;
  std::vector<int> threads = {1, 2};
  double min_ms = 20;
  int repeats = 5;
};

std::vector<Shape> shapes(const Args& a) {
  struct Layer {
    const char* name;
    Index in, out;
    int count;
  };
  const Index d = a.hidden;
  const Layer layers[] = {{"qkv", d, 3 * d, a.layers},
                          {"attn.proj", d, d, a.layers},
                          {"mlp.fc", d, 4 * d, a.layers},
                          {"mlp.proj", 4 * d, d, a.layers},
                          {"lm_head", d, a.vocab, 1}};
  std::vector<Shape> out;
  for (const Layer& l : layers) {
    out.push_back({fmt::format("{} fwd  y=xW^T", l.name), false, true, a.rows, l.out, l.in, l.count});
    out.push_back({fmt::format("{} dx   dy W", l.name), false, false, a.rows, l.in, l.out, l.count});
    out.push_back({fmt::format("{} dW   dy^T x", l.name), true, false, l.out, l.in, a.rows, l.count});
  }
  return out;
}

// Best over `repeats` of the mean time of enough back-to-back calls to fill min_ms.
double time_ms(const Args& a, const std::function<void()>& fn) {
  using Clock = std::chrono::steady_clock;
  fn();  // warm-up: primitive creation, packing buffers, page faults
  auto t0 = Clock::now();
  fn();
  const double once = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const int calls = std::max(1, static_cast<int>(a.min_ms / std::max(once, 1e-3)));
  double best = 1e300;
  for (int r = 0; r < a.repeats; ++r) {
    t0 = Clock::now();
    for (int i = 0; i < calls; ++i) fn();
    best = std::min(best, std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / calls);
  }
  return best;
}

struct Operands {
  std::vector<float> a, b, c;
  std::vector<bf16_t> a16, b16;
  Operands(const Shape& s) : a(s.m * s.k), b(s.k * s.n), c(s.m * s.n, 0.0f) {
    const zero3::CounterRng rng(1, zero3::hash_name(s.name));
    for (Index i = 0; i < a.size(); ++i) a[i] = static_cast<float>(rng.normal(i));
    for (Index i = 0; i < b.size(); ++i) b[i] = static_cast<float>(rng.normal(a.size() + i));
    for (float v : a) a16.push_back(zero3::float_to_bf16(v));
    for (float v : b) b16.push_back(zero3::float_to_bf16(v));
  }
  Index lda(const Shape& s) const { return s.ta ? s.m : s.k; }
  Index ldb(const Shape& s) const { return s.tb ? s.k : s.n; }
};

void run(const Args& a) {
  const std::vector<Shape> list = shapes(a);
  const bool bf16 = gemm::bf16_native();
  fmt::print("zero3-bench host-gemm: rows {}, hidden {}, vocab {}, {} layers; OpenBLAS core {}; oneDNN {}; bf16 {}\n",
             a.rows, a.hidden, a.vocab, a.layers, gemm::openblas_core(), gemm::onednn_built() ? "built" : "absent",
             bf16 ? "native" : "unavailable");
  if (gemm::onednn_built()) {
    for (const Shape& s : list) {
      if (s.per_step != 1 && s.name.rfind("qkv", 0) != 0) continue;
      fmt::print("  oneDNN impl for {:<24} f32 {:<28} bf16 {}\n", s.name,
                 gemm::onednn_impl(false, s.ta, s.tb, s.m, s.n, s.k),
                 bf16 ? gemm::onednn_impl(true, s.ta, s.tb, s.m, s.n, s.k) : "-");
    }
  }
  struct Variant {
    const char* name;
    bool available;
  };
  const std::vector<Variant> variants = {{"openblas pool", true},
                                         {"openblas blocks", true},
                                         {"bf16 blocks", bf16},
                                         {"onednn f32 pool", gemm::onednn_built()},
                                         {"bf16 pool", bf16}};
  for (int threads : a.threads) {
    par::set_threads(threads);
    fmt::print("\n{} thread(s): ms per product (GFLOP/s)\n{:<26}", threads, "product m x n x k");
    for (const Variant& v : variants) fmt::print(" {:>22}", v.name);
    fmt::print("\n");
    std::vector<double> step_ms(variants.size(), 0.0);
    for (const Shape& s : list) {
      Operands o(s);
      const double gflop = 2.0 * static_cast<double>(s.m * s.n * s.k) * 1e-9;
      fmt::print("{:<26}",
                 fmt::format("{} {}x{}x{}", s.name.substr(0, s.name.find(' ')) + s.name.substr(s.name.find(' '), 4),
                             s.m, s.n, s.k));
      for (std::size_t vi = 0; vi < variants.size(); ++vi) {
        if (!variants[vi].available) {
          fmt::print(" {:>22}", "-");
          continue;
        }
        gemm::configure_backends();
        const Index lda = o.lda(s);
        const Index ldb = o.ldb(s);
        std::function<void()> fn;
        switch (vi) {
          case 0:
            fn = [&] {
              gemm::gemm_f32_pooled(Backend::openblas, threads, s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda,
                                    o.b.data(), ldb, 0.0f, o.c.data(), s.n);
            };
            break;
          case 1:
            fn = [&] {
              gemm::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda, o.b.data(), ldb, 0.0f, o.c.data(), s.n);
            };
            break;
          case 2:
            fn = [&] {
              gemm::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a16.data(), lda, o.b16.data(), ldb, 0.0f, o.c.data(),
                              s.n);
            };
            break;
          case 3:
            fn = [&] {
              gemm::gemm_f32_pooled(Backend::onednn, threads, s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a.data(), lda,
                                    o.b.data(), ldb, 0.0f, o.c.data(), s.n);
            };
            break;
          default:
            fn = [&] {
              gemm::gemm_bf16_pooled(threads, s.ta, s.tb, s.m, s.n, s.k, 1.0f, o.a16.data(), lda, o.b16.data(), ldb,
                                     0.0f, o.c.data(), s.n);
            };
            break;
        }
        const double ms = time_ms(a, fn);
        step_ms[vi] += ms * s.per_step;
        fmt::print(" {:>22}", fmt::format("{:.3f} ({:.0f})", ms, gflop / (ms * 1e-3)));
      }
      fmt::print("\n");
    }
    fmt::print("{:<26}", "one step's products (ms)");
    for (std::size_t vi = 0; vi < variants.size(); ++vi) {
      fmt::print(" {:>22}", variants[vi].available ? fmt::format("{:.2f}", step_ms[vi]) : "-");
    }
    fmt::print("\n");
  }
  gemm::configure_backends();
}

}  // namespace

void add_bench_host_gemm_command(CLI::App& app) {
  auto opt = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "host-gemm", "The host models' matrix products at a GPT's shapes through each backend, on 1 and 2 threads");
  cmd->add_option("--rows", opt->rows, "Rows of the activations (micro-batch x context)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--hidden", opt->hidden, "Hidden size")->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--vocab", opt->vocab, "Vocabulary (the lm_head's width)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench::add_count_option(*cmd, "--layers", opt->layers, "Transformer blocks (products per step)");
  cmd->add_option("--threads", opt->threads, "Thread counts, one table each")
      ->delimiter(',')
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  cmd->add_option("--min-ms", opt->min_ms, "Back-to-back calls per timing fill at least this many ms")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bench::add_repeats_option(*cmd, opt->repeats, "Timings per product and backend; the best is reported");
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
