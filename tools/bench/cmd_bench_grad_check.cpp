// `zero3-bench grad-check`: what the optimizer step's non-finite check costs next to the squared norm it
// already takes, on one rank's fp32 gradient shard of each --elems size, on the device's kernels (the
// host's, or the GPU's with --device cuda): the norm alone (sum_squares: the step's one pass, from whose
// result the check is read), a separate nonfinite_check pass, and both one after the other (what checking
// with a second kernel would cost). Median of --repeats timed blocks of 20 calls, the stream synchronized
// at the end of each block.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bench_commands.hpp"
#include "bench_common.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"

namespace zero3::tools {
namespace {

struct GradCheckOptions {
  std::vector<std::int64_t> elems = {1 << 20, 16 << 20};
  int repeats = 5;
  std::string device = "host";
  bool json = false;
};

constexpr int kCallsPerBlock = 20;

template <typename Fn>
bench::Spread time_calls(Stream& stream, int repeats, Fn&& call) {
  call();  // warm-up: first touch of the pages, kernel load
  stream.synchronize();
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const bench::Clock::time_point t0 = bench::Clock::now();
    for (int i = 0; i < kCallsPerBlock; ++i) call();
    stream.synchronize();
    ms.push_back(bench::ms_since(t0) / kCallsPerBlock);
  }
  return bench::spread(ms);
}

void run(const GradCheckOptions& o) {
  std::shared_ptr<Device> device(o.device == "cuda" ? make_cuda_device(0) : make_host_device());
  std::unique_ptr<Stream> stream = device->create_stream("bench");
  Buffer scalars = device->allocate(2, DType::f32, MemoryKind::device, MemCategory::workspace);
  std::vector<std::string> rows;
  if (!o.json) {
    fmt::print("non-finite check vs the squared norm, fp32 gradient shard, {} device (ms per call)\n",
               device_kind_name(device->kind()));
    fmt::print("  {:>12}  {:>24}  {:>24}  {:>24}  {:>8}\n", "elements", "norm (sum_squares)", "nonfinite_check", "both",
               "extra");
  }
  for (const std::int64_t n : o.elems) {
    Buffer grads =
        device->allocate(static_cast<std::size_t>(n), DType::f32, MemoryKind::device, MemCategory::grad_shard);
    kernels::fill(*stream, grads.view(), 0.25f);
    const BufferView sum = scalars.view().slice(1, 1);
    const BufferView flag = scalars.view().slice(0, 1);
    const bench::Spread norm =
        time_calls(*stream, o.repeats, [&] { kernels::sum_squares(*stream, grads.cview(), sum, true); });
    const bench::Spread check =
        time_calls(*stream, o.repeats, [&] { kernels::nonfinite_check(*stream, grads.cview(), flag); });
    const bench::Spread both = time_calls(*stream, o.repeats, [&] {
      kernels::sum_squares(*stream, grads.cview(), sum, true);
      kernels::nonfinite_check(*stream, grads.cview(), flag);
    });
    const double extra = 100.0 * (both.median - norm.median) / norm.median;
    if (o.json) {
      rows.push_back(fmt::format(R"({{"elems": {}, "norm_ms": {}, "check_ms": {}, "both_ms": {}, "extra_pct": {}}})", n,
                                 norm.median, check.median, both.median, extra));
    } else {
      fmt::print("  {:>12}  {:>24}  {:>24}  {:>24}  {:>7.1f}%\n", n, bench::median_and_range_ms(norm),
                 bench::median_and_range_ms(check), bench::median_and_range_ms(both), extra);
    }
  }
  if (o.json) {
    fmt::print("{{\"device\": \"{}\", \"rows\": [{}]}}\n", device_kind_name(device->kind()), fmt::join(rows, ", "));
  } else {
    fmt::print(
        "the step reads the check from the norm's result (a non-finite element makes it non-finite): the extra\n"
        "column is what a separate check pass would add; the step adds none.\n");
  }
}

}  // namespace

void add_bench_grad_check_command(CLI::App& app) {
  auto opt = std::make_shared<GradCheckOptions>();
  CLI::App* cmd = app.add_subcommand(
      "grad-check", "What the step's non-finite gradient check costs next to the norm (one rank's shard)");
  cmd->add_option("--elems", opt->elems, "Gradient shard sizes, elements")->capture_default_str();
  bench::add_repeats_option(*cmd, opt->repeats, "Timed blocks of 20 calls; the median is reported");
  cmd->add_option("--device", opt->device, "host or cuda")
      ->check(CLI::IsMember({"host", "cuda"}))
      ->capture_default_str();
  bench::add_json_flag(*cmd, opt->json);
  cmd->callback([opt] { run(*opt); });
}

}  // namespace zero3::tools
