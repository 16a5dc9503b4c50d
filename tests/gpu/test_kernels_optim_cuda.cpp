// The CUDA accumulate and optimizer steps against the host backend on the same inputs, bit for bit: both
// run the per-element code of kernels/math/optim_math.hpp with the same fp32 coefficients, one IEEE
// operation at a time (the _rn intrinsics on the device, -ffp-contract=off on the host). The only
// freedom is the bits of a NaN result (GPU arithmetic makes canonical NaNs), which must just be NaN.
// Several steps run back to back on each side, so the state evolves on both. Skipped (exit 77) without
// a device: see gpu_main.cpp.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "gpu_rig.hpp"
#include "kernel_test_util.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/kernels/kernels.hpp"

namespace {

using zero3::Buffer;
using zero3::BufferView;
using zero3::DType;
using zero3::MemCategory;
using zero3::MemoryKind;
namespace kernels = zero3::kernels;
using zero3::test::fill_random;
using zero3::test::poison;
using zero3::test::random_float;
using zero3::test::test_seed;
using zero3::test::value_at;
using Rig = zero3::test::GpuRig;

constexpr DType kAllDTypes[] = {DType::f32, DType::f16, DType::bf16};

// check_same with the name of the compared output in the failure report.
void check_same(const char* what, const std::vector<unsigned char>& dev, const Buffer& ref) {
  INFO(what);
  zero3::test::check_same(dev, ref);
}

// One optimizer's buffers on one side: master, two fp32 state slots (Lion and Adagrad use one), grad
// and the low-precision param copy (absent when param_t is empty).
struct Side {
  Buffer master, s1, s2, grad, param;
  BufferView param_view() const { return param.count() == 0 ? BufferView{} : param.view(); }
};

Side make_host_side(Rig& rig, std::size_t n, DType grad_t, std::optional<DType> param_t, std::mt19937_64& rng) {
  Side h{rig.host_buffer(n, DType::f32), rig.host_buffer(n, DType::f32), rig.host_buffer(n, DType::f32),
         rig.host_buffer(n, grad_t), param_t ? rig.host_buffer(n, *param_t) : Buffer{}};
  fill_random(h.master, rng, -4, 2);
  fill_random(h.s1, rng, -12, -4);
  fill_random(h.s2, rng, -20, -8, /*positive=*/true);
  poison(h.param);
  return h;
}

Side make_device_side(Rig& rig, const Side& h) {
  Side d{rig.upload(h.master), rig.upload(h.s1), rig.upload(h.s2), rig.upload(h.grad),
         h.param.count() == 0 ? Buffer{} : rig.upload(h.param)};
  return d;
}

// A fresh gradient; with `specials`, a few elements are 0, -0, Inf and NaN (non-finite values become
// NaN results, which only have to be NaN on both sides).
void new_grad(Buffer& g, std::mt19937_64& rng, bool specials) {
  fill_random(g, rng, -12, 0);
  if (!specials || g.count() < 8) return;
  const float values[4] = {0.0f, -0.0f, INFINITY, NAN};
  for (int k = 0; k < 4; ++k) zero3::store_from_float(g.data(), g.dtype(), (rng() % g.count()), values[k]);
}

enum class Op { adam, adamw, adam_no_bias_correction, lion, adagrad };

void run_step(const kernels::KernelBackend& k, zero3::Stream& s, Op op, std::int64_t step, float weight_decay,
              Side& side) {
  switch (op) {
    case Op::adam:
    case Op::adamw:
    case Op::adam_no_bias_correction: {
      kernels::AdamArgs a;
      a.lr = 3e-3f;
      a.weight_decay = weight_decay;
      a.adamw = op != Op::adam;
      a.bias_correction = op != Op::adam_no_bias_correction;
      a.step = step;
      a.grad_scale = 0.375f;
      k.adam_step(s, a, side.master.view(), side.s1.view(), side.s2.view(), side.grad.cview(), side.param_view());
      return;
    }
    case Op::lion: {
      kernels::LionArgs a;
      a.lr = 1e-3f;
      a.weight_decay = weight_decay;
      a.grad_scale = 1.25f;
      k.lion_step(s, a, side.master.view(), side.s1.view(), side.grad.cview(), side.param_view());
      return;
    }
    case Op::adagrad: {
      kernels::AdagradArgs a;
      a.weight_decay = weight_decay;
      a.grad_scale = 0.75f;
      k.adagrad_step(s, a, side.master.view(), side.s2.view(), side.grad.cview(), side.param_view());
      return;
    }
  }
}

// Runs three steps of `op` on the host and on the GPU from the same state and grads, comparing every
// output after each step (the third step's grads include 0, -0, Inf and NaN).
void compare_steps(Op op, std::size_t n, DType grad_t, std::optional<DType> param_t, float weight_decay) {
  const std::uint64_t seed = test_seed();
  INFO("op " << static_cast<int>(op) << ", n " << n << ", grad " << zero3::dtype_name(grad_t) << ", param "
             << (param_t ? zero3::dtype_name(*param_t) : "none") << ", weight_decay " << weight_decay << ", seed "
             << seed);
  std::mt19937_64 rng(seed);
  Rig rig;
  Side h = make_host_side(rig, n, grad_t, param_t, rng);
  Side d = make_device_side(rig, h);
  for (std::int64_t step = 1; step <= 3; ++step) {
    INFO("step " << step);
    new_grad(h.grad, rng, /*specials=*/step == 3);
    rig.upload_into(d.grad, h.grad);
    run_step(rig.host->kernels(), *rig.host_stream, op, step, weight_decay, h);
    run_step(rig.gpu->kernels(), *rig.gpu_stream, op, step, weight_decay, d);
    rig.host_stream->synchronize();
    check_same("master", rig.download(d.master), h.master);
    check_same("state 1", rig.download(d.s1), h.s1);
    check_same("state 2", rig.download(d.s2), h.s2);
    if (param_t) check_same("param", rig.download(d.param), h.param);
  }
}

}  // namespace

TEST_CASE("cuda optim kernels: accumulate matches the host bit for bit", "[kernels][gpu]") {
  const std::size_t n = GENERATE(as<std::size_t>{}, 0, 1, 7, 4097, 1048583);
  const DType src_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::uint64_t seed = test_seed();
  INFO("n " << n << ", src " << zero3::dtype_name(src_t) << ", seed " << seed);
  std::mt19937_64 rng(seed);
  const float alpha = random_float(rng, -3, 3);
  Rig rig;
  Buffer dst = rig.host_buffer(n, DType::f32);
  Buffer src = rig.host_buffer(n, src_t);
  fill_random(dst, rng, -20, 20);
  fill_random(src, rng, -20, 20);
  Buffer d_dst = rig.upload(dst);
  Buffer d_src = rig.upload(src);
  const auto& host_k = rig.host->kernels();
  const auto& gpu_k = rig.gpu->kernels();
  host_k.accumulate(*rig.host_stream, dst.view(), src.cview(), alpha);
  gpu_k.accumulate(*rig.gpu_stream, d_dst.view(), d_src.cview(), alpha);
  if (src_t == DType::f32) {  // and onto itself
    host_k.accumulate(*rig.host_stream, dst.view(), dst.cview(), -0.5f);
    gpu_k.accumulate(*rig.gpu_stream, d_dst.view(), d_dst.cview(), -0.5f);
  }
  rig.host_stream->synchronize();
  check_same("dst", rig.download(d_dst), dst);
}

TEST_CASE("cuda optim kernels: every step matches the host bit for bit over several steps", "[kernels][gpu]") {
  const Op op = GENERATE(Op::adam, Op::adamw, Op::adam_no_bias_correction, Op::lion, Op::adagrad);
  const std::size_t n = GENERATE(as<std::size_t>{}, 1, 7, 4097);
  const DType grad_t = GENERATE(from_range(std::begin(kAllDTypes), std::end(kAllDTypes)));
  const std::optional<DType> param_t =
      GENERATE(as<std::optional<DType>>{}, std::nullopt, DType::f32, DType::f16, DType::bf16);
  const float weight_decay = GENERATE(0.0f, 0.05f);
  compare_steps(op, n, grad_t, param_t, weight_decay);
}

TEST_CASE("cuda optim kernels: a step larger than one pass of the grid matches the host", "[kernels][gpu]") {
  const Op op = GENERATE(Op::adam, Op::adamw, Op::adam_no_bias_correction, Op::lion, Op::adagrad);
  compare_steps(op, 1048583, DType::bf16, DType::bf16, 0.05f);
}

TEST_CASE("cuda optim kernels: pinned views work, pageable views and host streams are refused", "[kernels][gpu]") {
  Rig rig;
  const std::size_t n = 33;
  std::mt19937_64 rng(test_seed());
  // Pinned host memory is reachable from the kernels: a step on pinned buffers matches the host.
  Side h = make_host_side(rig, n, DType::f32, DType::bf16, rng);
  new_grad(h.grad, rng, false);
  Side p{rig.gpu->allocate(n, DType::f32, MemoryKind::pinned_host, MemCategory::staging),
         rig.gpu->allocate(n, DType::f32, MemoryKind::pinned_host, MemCategory::staging),
         rig.gpu->allocate(n, DType::f32, MemoryKind::pinned_host, MemCategory::staging),
         rig.gpu->allocate(n, DType::f32, MemoryKind::pinned_host, MemCategory::staging),
         rig.gpu->allocate(n, DType::bf16, MemoryKind::pinned_host, MemCategory::staging)};
  for (auto [dst, src] : {std::pair{&p.master, &h.master}, std::pair{&p.s1, &h.s1}, std::pair{&p.s2, &h.s2},
                          std::pair{&p.grad, &h.grad}, std::pair{&p.param, &h.param}}) {
    std::memcpy(dst->data(), src->data(), src->size_bytes());
  }
  run_step(rig.host->kernels(), *rig.host_stream, Op::adamw, 2, 0.01f, h);
  run_step(rig.gpu->kernels(), *rig.gpu_stream, Op::adamw, 2, 0.01f, p);
  rig.host_stream->synchronize();
  rig.gpu_stream->synchronize();
  CHECK(std::memcmp(p.master.data(), h.master.data(), h.master.size_bytes()) == 0);
  CHECK(std::memcmp(p.param.data(), h.param.data(), h.param.size_bytes()) == 0);

  const auto& k = rig.gpu->kernels();
  std::vector<float> pageable(n, 1.0f);
  BufferView pageable_view{pageable.data(), n, DType::f32, MemoryKind::pageable_host};
  Buffer d = rig.gpu->allocate(n, DType::f32, MemoryKind::device, MemCategory::workspace);
  Buffer d2 = rig.gpu->allocate(n, DType::f32, MemoryKind::device, MemCategory::workspace);
  Buffer d3 = rig.gpu->allocate(n, DType::f32, MemoryKind::device, MemCategory::workspace);
  kernels::AdamArgs adam;
  CHECK_THROWS_AS(k.accumulate(*rig.gpu_stream, d.view(), pageable_view, 1.0f), zero3::UsageError);
  CHECK_THROWS_AS(k.adam_step(*rig.gpu_stream, adam, d.view(), d2.view(), d3.view(), pageable_view, BufferView{}),
                  zero3::UsageError);
  CHECK_THROWS_AS(
      k.adam_step(*rig.host_stream, adam, p.master.view(), p.s1.view(), p.s2.view(), p.grad.cview(), BufferView{}),
      zero3::UsageError);
  Buffer short_state = rig.gpu->allocate(n - 1, DType::f32, MemoryKind::device, MemCategory::workspace);
  CHECK_THROWS_AS(
      k.lion_step(*rig.gpu_stream, kernels::LionArgs{}, d.view(), short_state.view(), d2.cview(), BufferView{}),
      zero3::UsageError);
  rig.gpu_stream->synchronize();
}
