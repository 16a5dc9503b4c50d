// The CUDA Llama against the host: its kernels (RMSNorm forward and backward, SwiGLU forward and backward,
// the grouped-query pack with rotary embeddings and its transpose) against llama_ops on the same random fp32
// inputs with outputs poisoned first, then the model against the host LlamaModel<double> on the same params
// and batch: the loss and every param's gradient with grouped-query attention (4 heads, 2 kv heads), with and
// without biases, an explicit head_dim, fp32, bf16 and fp16 params; a tied output matrix; eval passes,
// causality, the planned activation bytes, and the calling contract. Skipped (exit 77) without a device:
// see gpu_main.cpp.
#include <cuda_runtime.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "flash_attention.cuh"
#include "flash_attention.hpp"
#include "kernel_test_util.hpp"
#include "llama_ops.hpp"
#include "model_test_rig.hpp"
#include "rmsnorm.cuh"
#include "rope_gqa.cuh"
#include "swiglu.cuh"
#include "zero3/core/dtype.hpp"
#include "zero3/core/error.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/llama_cuda.hpp"

template <>
struct zero3::test::HostModelOf<zero3::models::LlamaConfig> {
  using type = zero3::models::LlamaModel<double>;
};

namespace {

using zero3::Buffer;
using zero3::BufferView;
using zero3::DType;
using zero3::MemoryKind;
using zero3::models::LlamaConfig;
using zero3::models::Pass;
using zero3::models::UnitModel;
using zero3::test::Batch;
using zero3::test::check_tensor;
using zero3::test::compare_train_pass;
using zero3::test::DeviceTensors;
using zero3::test::DtypeCase;
using zero3::test::forward_pass;
using zero3::test::Gpu;
using zero3::test::host_reference;
using zero3::test::kSeedScale;
using zero3::test::make_batch;
using zero3::test::make_params;
using zero3::test::prefix;
using zero3::test::Reference;
using zero3::test::Tensors;
using zero3::test::zeros_like;
namespace gpu = zero3::models::gpu;
namespace ops = zero3::models::ops;

// Kernels: both sides compute in fp32 with the same formulas, in different summation orders (warp trees,
// fp32 on the device; double for the host's RMSNorm statistics): a few fp32 ulps of the tensor's range.
constexpr double kKernelTol = 1e-5;

// The model: as test_gpt_cuda.cpp's tolerances and for the same reasons (fp32 against float64; bf16 and
// fp16 operands rounded before every linear layer's product, 16-bit gradients). The Llama chains about as
// many products per layer as the GPT (q, k, v, o, gate, up, down), at widths of the same order.
constexpr double kF32GradTol = 1e-4;
constexpr double kF32LossTol = 1e-5;
constexpr double kBf16GradTol = 5e-2;
constexpr double kBf16LossTol = 1e-2;
constexpr double kF16GradTol = 1.5e-2;
constexpr double kF16LossTol = 3e-3;

// Wide enough that every strided loop runs more than once: hidden 48 > 32 lanes (RMSNorm, a warp per row;
// two column tiles of its weight gradient), seq_len 40 > 32 (softmax rows), vocab 300 > 256 threads
// (cross-entropy). Grouped-query: 2 query heads per kv head.
LlamaConfig tiny_config() {
  LlamaConfig c;
  c.vocab_size = 300;
  c.seq_len = 40;
  c.layers = 2;
  c.hidden = 48;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 72;
  c.rope_theta = 500.0;  // angles that wrap within 40 positions in every pair, so a wrong pairing shows
  return c;
}

cudaStream_t native(Gpu& g) {
  return static_cast<cudaStream_t>(g.stream->native_handle());
}
float* f32(Buffer& b) {
  return static_cast<float*>(b.data());
}

std::vector<double> random_values(std::mt19937_64& rng, std::size_t n, double mean, double stddev) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<double> v(n);
  for (double& x : v) x = static_cast<double>(static_cast<float>(dist(rng)));  // exact in fp32
  return v;
}
std::vector<float> as_float(const std::vector<double>& v) {
  return {v.begin(), v.end()};
}
std::vector<double> as_double(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}
// A device fp32 buffer of n NaNs: an element the kernel does not write fails the comparison.
Buffer poisoned(Gpu& g, std::size_t n) {
  return g.upload(std::vector<double>(n, std::numeric_limits<double>::quiet_NaN()), DType::f32);
}

}  // namespace

TEST_CASE("cuda llama kernels: rmsnorm forward and backward match llama_ops", "[models][gpu]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Gpu g;
  const int rows = 77;  // > 32 row lanes of the column sums, not a multiple of the 8 rows of a block
  const int d = 100;    // > 32 lanes, a partial column tile
  const double eps = 1e-5;
  const std::vector<double> x = random_values(rng, std::size_t{77} * 100, 0.3, 1.5);
  const std::vector<double> w = random_values(rng, 100, 1.0, 0.2);
  const std::vector<double> dy = random_values(rng, std::size_t{77} * 100, 0.0, 1.0);
  const std::vector<double> dx0 = random_values(rng, std::size_t{77} * 100, 0.0, 1.0);  // dx and dw accumulate
  const std::vector<double> dw0 = random_values(rng, 100, 0.0, 1.0);

  std::vector<float> y(x.size());
  std::vector<float> inv(rows);
  const std::vector<float> xf = as_float(x);
  const std::vector<float> wf = as_float(w);
  ops::rmsnorm_forward(xf.data(), wf.data(), y.data(), inv.data(), rows, d, eps);
  std::vector<float> dx = as_float(dx0);
  std::vector<float> dw = as_float(dw0);
  const std::vector<float> dyf = as_float(dy);
  ops::rmsnorm_backward(xf.data(), wf.data(), inv.data(), dyf.data(), dx.data(), dw.data(), rows, d);

  Buffer x_dev = g.upload(x, DType::f32);
  Buffer w_dev = g.upload(w, DType::f32);
  Buffer y_dev = poisoned(g, x.size());
  Buffer inv_dev = poisoned(g, rows);
  gpu::rmsnorm_forward(native(g), DType::f32, f32(x_dev), w_dev.data(), f32(y_dev), f32(inv_dev), rows, d,
                       static_cast<float>(eps));
  check_tensor("y", g.download(y_dev), as_double(y), kKernelTol);
  check_tensor("inv_rms", g.download(inv_dev), as_double(inv), kKernelTol);

  Buffer dy_dev = g.upload(dy, DType::f32);
  Buffer dx_dev = g.upload(dx0, DType::f32);
  Buffer dw_dev = g.upload(dw0, DType::f32);
  // The host's inv_rms, so that the backward is compared on its own.
  Buffer inv_host = g.upload(as_double(inv), DType::f32);
  gpu::rmsnorm_backward(native(g), DType::f32, DType::f32, f32(x_dev), w_dev.data(), f32(inv_host), f32(dy_dev),
                        f32(dx_dev), dw_dev.data(), rows, d);
  check_tensor("dx", g.download(dx_dev), as_double(dx), kKernelTol);
  check_tensor("dw", g.download(dw_dev), as_double(dw), kKernelTol);
}

TEST_CASE("cuda llama kernels: swiglu forward and backward match llama_ops", "[models][gpu]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  std::mt19937_64 rng(seed);
  Gpu g;
  const std::size_t n = 5003;
  const std::vector<double> gate = random_values(rng, n, 0.0, 3.0);
  const std::vector<double> up = random_values(rng, n, 0.0, 1.0);
  const std::vector<double> dh = random_values(rng, n, 0.0, 1.0);
  const std::vector<float> gf = as_float(gate);
  const std::vector<float> uf = as_float(up);
  std::vector<float> h(n);
  ops::swiglu_forward(gf.data(), uf.data(), h.data(), n);
  std::vector<float> dgate = as_float(dh);  // dgate over dh, as the model calls it
  std::vector<float> dup(n);
  ops::swiglu_backward(gf.data(), uf.data(), dgate.data(), dgate.data(), dup.data(), n);

  Buffer gate_dev = g.upload(gate, DType::f32);
  Buffer up_dev = g.upload(up, DType::f32);
  Buffer h_dev = poisoned(g, n);
  gpu::swiglu_forward(native(g), f32(gate_dev), f32(up_dev), f32(h_dev), n);
  check_tensor("h", g.download(h_dev), as_double(h), kKernelTol);
  Buffer dgate_dev = g.upload(dh, DType::f32);
  Buffer dup_dev = poisoned(g, n);
  gpu::swiglu_backward(native(g), f32(gate_dev), f32(up_dev), f32(dgate_dev), f32(dgate_dev), f32(dup_dev), n);
  check_tensor("dgate", g.download(dgate_dev), as_double(dgate), kKernelTol);
  check_tensor("dup", g.download(dup_dev), as_double(dup), kKernelTol);
}

TEST_CASE("cuda attention: the tiled kernels match the host's tiled attention, the same bits on every run",
          "[models][gpu]") {
  // Lengths below, at and across the host's tile and the warp width; head_dim below the warp, at two warps and
  // an odd width (lanes idle in the last pass); every output element written (the buffers start as NaN).
  const int len = GENERATE(1, 33, 130);
  const int head_dim = GENERATE(8, 64, 72);
  const int batch = 2, heads = 3;
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("len " << len << ", head_dim " << head_dim << ", seed " << seed);
  std::mt19937_64 rng(seed);
  Gpu g;
  const std::size_t rows = static_cast<std::size_t>(batch) * static_cast<std::size_t>(len);
  const std::size_t d = static_cast<std::size_t>(heads) * static_cast<std::size_t>(head_dim);
  const std::size_t lse_count = static_cast<std::size_t>(batch) * heads * static_cast<std::size_t>(len);
  const std::vector<double> qkv = random_values(rng, rows * 3 * d, 0.0, 1.0);
  const std::vector<double> datt = random_values(rng, rows * d, 0.0, 1.0);
  const std::vector<float> qkvf = as_float(qkv);
  const std::vector<float> dattf = as_float(datt);
  std::vector<float> att(rows * d), lse(lse_count), dqkv(rows * 3 * d);
  const auto n = [](int v) { return static_cast<std::size_t>(v); };
  ops::flash_attention_forward(qkvf.data(), lse.data(), att.data(), n(batch), n(len), n(heads), n(head_dim),
                               /*bf16_products=*/false);
  ops::flash_attention_backward(qkvf.data(), att.data(), lse.data(), dattf.data(), dqkv.data(), n(batch), n(len),
                                n(heads), n(head_dim), /*bf16_products=*/false);

  Buffer qkv_dev = g.upload(qkv, DType::f32);
  Buffer datt_dev = g.upload(datt, DType::f32);
  Buffer att_dev = poisoned(g, att.size());
  Buffer lse_dev = poisoned(g, lse.size());
  Buffer delta_dev = poisoned(g, lse.size());
  gpu::flash_attention_forward(native(g), f32(qkv_dev), f32(lse_dev), f32(att_dev), batch, len, heads, head_dim);
  check_tensor("att", g.download(att_dev), as_double(att), kKernelTol);
  check_tensor("lse", g.download(lse_dev), as_double(lse), kKernelTol);
  std::vector<std::vector<double>> runs;  // fp32 values, exact as doubles: equal means the same bits
  for (int run = 0; run < 2; ++run) {
    Buffer dqkv_dev = poisoned(g, dqkv.size());
    gpu::flash_attention_backward(native(g), f32(qkv_dev), f32(att_dev), f32(lse_dev), f32(datt_dev), f32(dqkv_dev),
                                  f32(delta_dev), batch, len, heads, head_dim);
    runs.push_back(g.download(dqkv_dev));
  }
  // Sums over up to len terms in another order than the host's tiles: a few more ulps than a kernel of one row.
  check_tensor("dqkv", runs[0], as_double(dqkv), 4 * kKernelTol);
  CHECK(runs[0] == runs[1]);
}

TEST_CASE("cuda llama kernels: gqa pack and unpack with rotary embeddings match llama_ops", "[models][gpu]") {
  const int kv_heads = GENERATE(1, 2, 4);  // multi-query, grouped, multi-head
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("kv_heads " << kv_heads << ", seed " << seed);
  std::mt19937_64 rng(seed);
  Gpu g;
  const gpu::GqaShape sh{.rows = 3 * 37, .len = 37, .heads = 4, .kv_heads = kv_heads, .head_dim = 12};
  const std::size_t rows = static_cast<std::size_t>(sh.rows);
  const std::size_t q_width = std::size_t{4} * 12;
  const std::size_t kv_width = static_cast<std::size_t>(kv_heads) * 12;
  std::vector<float> cos;
  std::vector<float> sin;
  ops::rope_table(37, 12, 500.0, cos, sin);
  Buffer cos_dev = g.upload(as_double(cos), DType::f32);
  Buffer sin_dev = g.upload(as_double(sin), DType::f32);

  const std::vector<double> q = random_values(rng, rows * q_width, 0.0, 1.0);
  const std::vector<double> k = random_values(rng, rows * kv_width, 0.0, 1.0);
  const std::vector<double> v = random_values(rng, rows * kv_width, 0.0, 1.0);
  std::vector<float> qkv(rows * 3 * q_width);
  const std::vector<float> qf = as_float(q);
  const std::vector<float> kf = as_float(k);
  const std::vector<float> vf = as_float(v);
  ops::gqa_pack(qf.data(), kf.data(), vf.data(), qkv.data(), cos.data(), sin.data(), rows, 37, 4,
                static_cast<std::size_t>(kv_heads), 12);
  Buffer q_dev = g.upload(q, DType::f32);
  Buffer k_dev = g.upload(k, DType::f32);
  Buffer v_dev = g.upload(v, DType::f32);
  Buffer qkv_dev = poisoned(g, qkv.size());
  gpu::gqa_pack(native(g), sh, f32(q_dev), f32(k_dev), f32(v_dev), f32(qkv_dev), f32(cos_dev), f32(sin_dev));
  check_tensor("qkv", g.download(qkv_dev), as_double(qkv), kKernelTol);

  const std::vector<double> dqkv = random_values(rng, rows * 3 * q_width, 0.0, 1.0);
  const std::vector<float> dqkvf = as_float(dqkv);
  std::vector<float> dq(rows * q_width);
  std::vector<float> dk(rows * kv_width);
  std::vector<float> dv(rows * kv_width);
  ops::gqa_unpack(dqkvf.data(), dq.data(), dk.data(), dv.data(), cos.data(), sin.data(), rows, 37, 4,
                  static_cast<std::size_t>(kv_heads), 12);
  Buffer dqkv_dev = g.upload(dqkv, DType::f32);
  Buffer dq_dev = poisoned(g, dq.size());
  Buffer dk_dev = poisoned(g, dk.size());
  Buffer dv_dev = poisoned(g, dv.size());
  gpu::gqa_unpack(native(g), sh, f32(dqkv_dev), f32(dq_dev), f32(dk_dev), f32(dv_dev), f32(cos_dev), f32(sin_dev));
  check_tensor("dq", g.download(dq_dev), as_double(dq), kKernelTol);
  check_tensor("dk", g.download(dk_dev), as_double(dk), kKernelTol);
  check_tensor("dv", g.download(dv_dev), as_double(dv), kKernelTol);
}

namespace {

struct BiasCase {
  bool qkv_bias;
  bool o_bias;
  int head_dim;  // 0: hidden / heads; 16 makes heads * head_dim (64) differ from hidden (48)
};

}  // namespace

TEST_CASE("cuda llama: loss and every gradient match the float64 host model", "[models][gpu]") {
  const BiasCase bc = GENERATE(BiasCase{false, false, 0}, BiasCase{true, false, 0}, BiasCase{true, true, 16});
  const DtypeCase dc =
      GENERATE(DtypeCase{DType::f32, kF32GradTol, kF32LossTol}, DtypeCase{DType::bf16, kBf16GradTol, kBf16LossTol},
               DtypeCase{DType::f16, kF16GradTol, kF16LossTol});
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("qkv_bias " << bc.qkv_bias << ", o_bias " << bc.o_bias << ", head_dim " << bc.head_dim << ", seed " << seed);
  LlamaConfig config = tiny_config();
  config.qkv_bias = bc.qkv_bias;
  config.o_bias = bc.o_bias;
  config.head_dim = bc.head_dim;
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_llama(config, *gpu.device);
  // The second pass's full length also rebuilds the rotary table.
  zero3::test::compare_train_passes(*model, gpu, config, dc, seed);
}

TEST_CASE("cuda llama: a tied output matrix adds its gradient into the embedding's", "[models][gpu]") {
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  const LlamaConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_llama(config, *gpu.device);
  Tensors params = make_params(model->units(), config.hidden, seed, DType::f32);
  const std::size_t head = params.size() - 1;
  params[head][1] = params[0][0];  // the reference: an untied model whose lm_head equals the embedding
  const Batch b = make_batch(config, 3, 7, seed + 1);
  const Reference ref = host_reference(config, params, b, kSeedScale);

  // The head gets the embedding's param and gradient buffers in its output matrix's position.
  const DeviceTensors device_params(gpu, params, DType::f32);
  const DeviceTensors grads(gpu, zeros_like(params), DType::f32);
  auto tied = [&](const DeviceTensors& t) {
    std::vector<BufferView> v = t.views(head);
    v[1] = t.views(0)[0];
    return v;
  };
  model->set_batch(b.tokens, b.targets, b.batch, b.len, Pass::train);
  for (std::size_t u = 0; u < head; ++u) model->forward_unit(u, device_params.views(u), *gpu.stream);
  model->forward_unit(head, tied(device_params), *gpu.stream);
  CHECK(std::abs(model->loss(*gpu.stream) - ref.loss) <= kF32LossTol * ref.loss);
  model->backward_unit(head, tied(device_params), tied(grads), kSeedScale, *gpu.stream);
  for (std::size_t u = head; u-- > 0;) {
    model->backward_unit(u, device_params.views(u), grads.views(u), kSeedScale, *gpu.stream);
  }
  gpu.stream->synchronize();
  std::vector<double> want = ref.grads[0][0];
  for (std::size_t i = 0; i < want.size(); ++i) want[i] += ref.grads[head][1][i];
  check_tensor("tied embedding", gpu.download(grads.buffers[0][0]), want, kF32GradTol);
  check_tensor("model.norm.weight", gpu.download(grads.buffers[head][0]), ref.grads[head][0], kF32GradTol);
}

TEST_CASE("cuda llama: eval passes, causality and planned activation bytes", "[models][gpu]") {
  const DType dtype = GENERATE(DType::f32, DType::bf16);
  const std::uint64_t seed = zero3::test::test_seed();
  INFO(zero3::dtype_name(dtype) << ", seed " << seed);
  const LlamaConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_llama(config, *gpu.device);
  const Tensors params = make_params(model->units(), config.hidden, seed, dtype);
  const DeviceTensors device_params(gpu, params, dtype);
  const Batch b = make_batch(config, 3, 5, seed + 1);
  const Reference ref = host_reference(config, params, b, kSeedScale);
  const double loss_tol = dtype == DType::f32 ? kF32LossTol : kBf16LossTol;

  const double train_loss = forward_pass(*model, gpu, device_params, b, Pass::train);
  const DeviceTensors grads(gpu, zeros_like(params), dtype);
  zero3::test::backward_pass(*model, gpu, device_params, grads);
  const Batch eval_batch = make_batch(config, 4, 5, seed + 3);
  forward_pass(*model, gpu, device_params, eval_batch, Pass::eval);
  const double eval_loss = forward_pass(*model, gpu, device_params, b, Pass::eval);
  CHECK(std::abs(eval_loss - train_loss) <= 1e-6 * train_loss);
  CHECK(std::abs(eval_loss - ref.loss) <= loss_tol * ref.loss);

  // The plan bounds what the passes allocated: only the batch words depend on the data (tokens assumed all
  // distinct: at most 2 words per row over).
  const std::size_t planned =
      model->planned_activation_bytes({.micro_batch = 3, .eval_batch = 4, .len = 5, .params = dtype});
  const std::size_t held = model->activation_bytes();
  INFO("planned " << planned << " bytes, held " << held);
  CHECK(held <= planned);
  CHECK(planned - held <= std::size_t{2 * 4 * 5} * sizeof(std::int32_t));

  if (dtype != DType::f32) return;
  zero3::test::check_eval_contract(
      *model, [&] { return zero3::models::make_cuda_llama(config, *gpu.device); }, gpu, device_params, b, ref,
      kF32LossTol);
}

TEST_CASE("cuda llama: full and selective recomputation, and cpu_checkpointing, give bitwise the gradients of none",
          "[models][gpu]") {
  const DType dtype = GENERATE(DType::f32, DType::bf16);
  const std::uint64_t seed = zero3::test::test_seed();
  INFO("seed " << seed);
  LlamaConfig config = tiny_config();
  config.layers = 5;  // inputs 0 .. 2 are overwritten by later layers: the offload copies them
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_llama(config, *gpu.device);
  zero3::test::check_recompute_bitwise(*model, gpu, config, dtype, seed);
}

TEST_CASE("cuda llama: calls out of order or with wrong views throw naming the unit", "[models][gpu]") {
  using Catch::Matchers::Contains;
  const LlamaConfig config = tiny_config();
  Gpu gpu;
  std::unique_ptr<UnitModel> model = zero3::models::make_cuda_llama(config, *gpu.device);
  const Tensors params = make_params(model->units(), config.hidden, 7, DType::f32);
  const DeviceTensors device_params(gpu, params, DType::f32);
  const DeviceTensors grads(gpu, zeros_like(params), DType::f32);
  const Batch b = make_batch(config, 2, 4, 9);
  const std::size_t head = model->units().size() - 1;

  REQUIRE_THROWS_AS(model->forward_unit(0, device_params.views(0), *gpu.stream), zero3::UsageError);  // no batch
  model->set_batch(b.tokens, b.targets, b.batch, b.len, Pass::train);
  REQUIRE_THROWS_WITH(model->forward_unit(1, device_params.views(1), *gpu.stream), Contains("layers.0"));
  model->forward_unit(0, device_params.views(0), *gpu.stream);
  for (std::size_t u = 1; u < head; ++u) model->forward_unit(u, device_params.views(u), *gpu.stream);
  // The head takes exactly two views: the final norm and the output matrix.
  std::vector<BufferView> three = device_params.views(head);
  three.push_back(three.back());
  REQUIRE_THROWS_WITH(model->forward_unit(head, three, *gpu.stream), Contains("takes 2 params"));
  model->forward_unit(head, device_params.views(head), *gpu.stream);
  REQUIRE_THROWS_WITH(model->backward_unit(1, device_params.views(1), grads.views(1), 1.0f, *gpu.stream),
                      Contains("head"));
  model->backward_unit(head, device_params.views(head), grads.views(head), 1.0f, *gpu.stream);
  gpu.stream->synchronize();
  REQUIRE_THROWS_AS(model->set_batch({}, {}, 0, 0, Pass::train), zero3::UsageError);
  REQUIRE_THROWS_AS(model->set_batch(b.tokens, b.targets, b.batch, config.seq_len + 1, Pass::train), zero3::UsageError);
}

TEST_CASE("cuda llama: a host device is refused", "[models][gpu]") {
  std::unique_ptr<zero3::Device> host = zero3::make_host_device();
  REQUIRE_THROWS_AS(zero3::models::make_cuda_llama(tiny_config(), *host), zero3::ConfigError);
  CHECK(zero3::models::cuda_llama_available());
}
