// The CUDA GPT: the unit-by-unit forward and backward of GptModel (gpt.cpp) with the same formulas, on
// cuBLAS and the kernels of this folder, behind the calling contract of cuda_decoder.hpp. Precision:
// activations, LayerNorm statistics, softmax and losses are fp32. A linear layer's product takes A and B in
// its weight's dtype: with 16-bit weights the fp32 activation operand is rounded to that dtype first (as
// autocast does), and cuBLAS accumulates in fp32 into fp32 output. Attention's products (activation by
// activation) stay fp32; with 16-bit weights they may use tf32 tensor cores, still finer than the bf16
// operands of the linear layers. Weight gradients accumulate in fp32 and are rounded once into the grads'
// dtype. Every reduction has a fixed order (embedding backward included: rows are grouped by token on the
// host, no atomics), so a run repeats bit for bit on one GPU and cuBLAS version.
//
// Memory: one cudaMalloc'd arena carved into named fp32 views per pass (train keeps every block's
// activations, eval one block's and two residual streams), grown never shrunk; 16-bit operand and fp32
// weight-gradient scratch only when the dtypes need them.
#include "zero3/models/gpt_cuda.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cross_entropy.cuh"
#include "cuda_decoder.hpp"
#include "embedding.cuh"
#include "gelu.cuh"
#include "layernorm.cuh"
#include "linear_aux.cuh"
#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models {
namespace {

using gpu::AttentionTensors;
using gpu::Carver;
using gpu::Operand;

// Param positions within the head unit: ln_f.weight, ln_f.bias, lm_head.weight.
constexpr std::size_t kLnfWeight = 0;
constexpr std::size_t kLnfBias = 1;
constexpr std::size_t kLmHeadWeight = 2;

// Param positions within a block unit, in gpt_units() order.
enum BlockParam : std::size_t {
  kLn1Weight,
  kLn1Bias,
  kQkvWeight,
  kQkvBias,
  kAttnProjWeight,
  kAttnProjBias,
  kLn2Weight,
  kLn2Bias,
  kFcWeight,
  kFcBias,
  kMlpProjWeight,
  kMlpProjBias,
};

std::size_t sz(int v) {
  return static_cast<std::size_t>(v);
}

// What one block keeps from forward for its backward (rows = batch * len), as in GptModel::BlockActs.
struct BlockActs {
  float* ln1 = nullptr;       // [rows, hidden]
  float* ln1_stat = nullptr;  // [rows, 2] mean, 1/std
  float* qkv = nullptr;       // [rows, 3 hidden]
  float* attn_lse = nullptr;  // [batch, heads, len] attention rows' log-sum-exp
  float* att = nullptr;       // [rows, hidden]
  float* res1 = nullptr;      // [rows, hidden]
  float* ln2 = nullptr;
  float* ln2_stat = nullptr;
  float* fc = nullptr;    // [rows, 4 hidden] before GELU
  float* gelu = nullptr;  // [rows, 4 hidden]
};

struct Activations {
  // The residual stream: unit u's output in residual[residual_slot(u)] (CudaDecoder::residual_slot).
  std::vector<float*> residual;
  std::vector<BlockActs> blocks;  // train: one per block (Recompute::full: one, reused); eval: one, reused
  BlockActs recomputed;           // Recompute::selective: ln1, ln2 and gelu of the block in hand
  float* lnf = nullptr;
  float* lnf_stat = nullptr;
  float* logits = nullptr;  // [rows, vocab]; dlogits in place for fp32 weights
  float* lse = nullptr;     // [rows] logsumexp of each row of logits
  float* losses = nullptr;  // [rows]
  double* loss = nullptr;   // the mean
  // Backward scratch (train only).
  float* dresidual = nullptr;  // [rows, hidden] the gradient flowing down the residual stream
  float* dwide = nullptr;      // [rows, 4 hidden]
  float* dnarrow = nullptr;    // [rows, hidden]
  float* dqkv = nullptr;       // [rows, 3 hidden]
  float* delta = nullptr;      // [batch, heads, len] attention backward's rowsum(dO O)
};

class CudaGpt final : public gpu::CudaDecoder {
 public:
  CudaGpt(const GptConfig& config, Device& device);

 private:
  std::size_t carve(float* base) override;
  ScratchSizes scratch_sizes() const override;
  const double* device_loss() const override { return acts_.loss; }
  float* residual_stream(std::size_t u) override { return acts_.residual[residual_slot(u)]; }
  int hidden_size() const override { return config_.hidden; }
  void forward(std::size_t unit, std::span<const BufferView> params, cudaStream_t stream) override;
  void backward(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                float seed_scale, cudaStream_t stream) override;

  AttentionTensors attention(const BlockActs& a) const {
    return {.qkv = a.qkv, .lse = a.attn_lse, .att = a.att, .heads = config_.heads, .head_dim = config_.head_dim()};
  }
  // Block `unit`'s buffers in this pass: its own set or the shared one, with the shared ln1, ln2 and gelu when
  // selective.
  BlockActs block_view(std::size_t unit) const {
    BlockActs a = acts_.blocks[train() && recompute() != Recompute::full ? unit - 1 : 0];
    if (train() && recompute() == Recompute::selective) {
      a.ln1 = acts_.recomputed.ln1;
      a.ln2 = acts_.recomputed.ln2;
      a.gelu = acts_.recomputed.gelu;
    }
    return a;
  }
  void forward_embed(cudaStream_t stream, std::span<const BufferView> p);
  // with_output false stops after GELU: what a full recomputation needs (backward never reads the output).
  void forward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p, bool with_output = true);
  void forward_head(cudaStream_t stream, std::span<const BufferView> p);
  void backward_head(cudaStream_t stream, std::span<const BufferView> p, std::span<const BufferView> g,
                     float seed_scale);
  void backward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p,
                      std::span<const BufferView> g);
  void backward_embed(cudaStream_t stream, std::span<const BufferView> g);

  GptConfig config_;
  Activations acts_;
};

// Each unit takes its declared params, in order.
std::vector<std::vector<ParamSpec>> param_views(const std::vector<UnitSpec>& units) {
  std::vector<std::vector<ParamSpec>> views;
  views.reserve(units.size());
  for (const UnitSpec& u : units) views.push_back(u.params);
  return views;
}

CudaGpt::CudaGpt(const GptConfig& config, Device& device)
    : CudaDecoder("CUDA GPT", device, gpt_units(config), param_views(gpt_units(config)), config.vocab_size,
                  config.seq_len),
      config_(config) {
  set_description(
      fmt::format("GPT {} layers, hidden {}, {} heads, mlp {}, vocab {}, seq_len {} ({} params), CUDA on {}",
                  config_.layers, config_.hidden, config_.heads, config_.mlp_hidden(), config_.vocab_size,
                  config_.seq_len, gpt_num_params(config_), device.description()));
}

// ---- buffers ---------------------------------------------------------------------------------------------

std::size_t CudaGpt::carve(float* base) {
  Activations& a = acts_;
  Carver c(base);
  const std::size_t r = rows();
  const std::size_t d = sz(config_.hidden);
  const std::size_t f = sz(config_.mlp_hidden());
  const std::size_t len = sz(this->len());
  const std::size_t layers = sz(config_.layers);
  a.residual.assign(residual_buffers(train(), offload_kept_inputs(), config_.layers), nullptr);
  for (float*& p : a.residual) p = c.take(r * d);
  a.blocks.assign(train() && recompute() != Recompute::full ? layers : 1, BlockActs{});
  // Selective recomputation: ln1, ln2 and gelu live once, in recomputed.
  const bool shared = train() && recompute() == Recompute::selective;
  const auto recomputable = [&](BlockActs& b) {
    b.ln1 = c.take(r * d);
    b.ln2 = c.take(r * d);
    b.gelu = c.take(r * f);
  };
  a.recomputed = BlockActs{};
  if (shared) recomputable(a.recomputed);
  for (BlockActs& b : a.blocks) {
    if (!shared) recomputable(b);
    b.ln1_stat = c.take(2 * r);
    b.qkv = c.take(r * 3 * d);
    b.attn_lse = c.take(sz(batch()) * sz(config_.heads) * len);
    b.att = c.take(r * d);
    b.res1 = c.take(r * d);
    b.ln2_stat = c.take(2 * r);
    b.fc = c.take(r * f);
  }
  a.lnf = c.take(r * d);
  a.lnf_stat = c.take(2 * r);
  a.logits = c.take(r * sz(config_.vocab_size));
  a.lse = c.take(r);
  a.losses = c.take(r);
  a.loss = reinterpret_cast<double*>(c.take(2));  // 256-byte aligned
  if (train()) {
    a.dresidual = c.take(r * d);
    a.dwide = c.take(r * f);
    a.dnarrow = c.take(r * d);
    a.dqkv = c.take(r * 3 * d);
    a.delta = c.take(sz(batch()) * sz(config_.heads) * len);
  } else {
    a.dresidual = a.dwide = a.dnarrow = a.dqkv = a.delta = nullptr;
  }
  return c.used();
}

CudaGpt::ScratchSizes CudaGpt::scratch_sizes() const {
  const std::size_t r = rows();
  const std::size_t d = sz(config_.hidden);
  const std::size_t widest_out = std::max({sz(config_.vocab_size), sz(config_.mlp_hidden()), 3 * d});
  return {.operand_a = r * sz(config_.mlp_hidden()),
          .operand_b = r * widest_out,
          .weight_grad = std::max({sz(config_.vocab_size) * d, sz(config_.mlp_hidden()) * d, 3 * d * d})};
}

void CudaGpt::forward(std::size_t unit, std::span<const BufferView> params, cudaStream_t stream) {
  if (unit == 0) {
    forward_embed(stream, params);
  } else if (unit + 1 == num_units()) {
    forward_head(stream, params);
  } else {
    forward_block(stream, unit, params);
  }
}

void CudaGpt::backward(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                       float seed_scale, cudaStream_t stream) {
  if (unit == 0) {
    backward_embed(stream, grads);
  } else if (unit + 1 == num_units()) {
    backward_head(stream, params, grads, seed_scale);
  } else {
    backward_block(stream, unit, params, grads);
  }
}

// ---- units -----------------------------------------------------------------------------------------------

void CudaGpt::forward_embed(cudaStream_t stream, std::span<const BufferView> p) {
  gpu::embedding_forward(stream, p[0].dtype, p[0].data, p[1].data, tokens_dev(), residual_stream(0),
                         static_cast<int>(rows()), len(), config_.hidden);
}

void CudaGpt::forward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p, bool with_output) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int f = config_.mlp_hidden();
  const DType pt = p[0].dtype;
  const BlockActs a = block_view(unit);
  const float* in = residual_stream(unit - 1);
  float* out = residual_stream(unit);
  gpu::layernorm_forward(stream, pt, in, p[kLn1Weight].data, p[kLn1Bias].data, a.ln1, a.ln1_stat, r, d);
  gpu::bias_rows(stream, pt, a.qkv, p[kQkvBias].data, nullptr, r, 3 * d);
  linear_forward(stream, a.ln1, p[kQkvWeight], a.qkv, d, 3 * d, 1.0f);
  attention_forward(stream, attention(a));
  gpu::bias_rows(stream, pt, a.res1, p[kAttnProjBias].data, in, r, d);  // residual + bias, then += att W^T
  linear_forward(stream, a.att, p[kAttnProjWeight], a.res1, d, d, 1.0f);
  gpu::layernorm_forward(stream, pt, a.res1, p[kLn2Weight].data, p[kLn2Bias].data, a.ln2, a.ln2_stat, r, d);
  gpu::bias_rows(stream, pt, a.fc, p[kFcBias].data, nullptr, r, f);
  linear_forward(stream, a.ln2, p[kFcWeight], a.fc, d, f, 1.0f);
  gpu::gelu_forward(stream, a.fc, a.gelu, rows() * sz(f));
  if (!with_output) return;
  gpu::bias_rows(stream, pt, out, p[kMlpProjBias].data, a.res1, r, d);
  linear_forward(stream, a.gelu, p[kMlpProjWeight], out, f, d, 1.0f);
}

void CudaGpt::forward_head(cudaStream_t stream, std::span<const BufferView> p) {
  const int r = static_cast<int>(rows());
  const std::size_t layers = sz(config_.layers);
  const float* in = residual_stream(layers);
  gpu::layernorm_forward(stream, p[kLnfWeight].dtype, in, p[kLnfWeight].data, p[kLnfBias].data, acts_.lnf,
                         acts_.lnf_stat, r, config_.hidden);
  linear_forward(stream, acts_.lnf, p[kLmHeadWeight], acts_.logits, config_.hidden, config_.vocab_size, 0.0f);
  gpu::cross_entropy_forward(stream, acts_.logits, targets_dev(), acts_.lse, acts_.losses, acts_.loss, r,
                             config_.vocab_size);
}

void CudaGpt::backward_head(cudaStream_t stream, std::span<const BufferView> p, std::span<const BufferView> g,
                            float seed_scale) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int vocab = config_.vocab_size;
  const BufferView& w = p[kLmHeadWeight];
  // dlogits = seed_scale / rows * (softmax - onehot), written as the GEMM operand: over the logits for fp32
  // weights (nothing reads them after this), else rounded into the 16-bit operand scratch.
  void* dlogits = w.dtype == DType::f32 ? static_cast<void*>(acts_.logits) : output_grad_scratch();
  gpu::cross_entropy_backward(stream, w.dtype, acts_.logits, acts_.lse, targets_dev(), dlogits, r, vocab,
                              seed_scale / static_cast<float>(r));
  linear_backward(stream, acts_.lnf, w, Operand{dlogits, w.dtype}, nullptr, acts_.dnarrow, g[kLmHeadWeight], nullptr, d,
                  vocab);
  ZERO3_CUDA_CHECK(cudaMemsetAsync(acts_.dresidual, 0, rows() * sz(d) * sizeof(float), stream));
  gpu::layernorm_backward(stream, p[kLnfWeight].dtype, g[kLnfWeight].dtype, residual_stream(sz(config_.layers)),
                          p[kLnfWeight].data, acts_.lnf_stat, acts_.dnarrow, acts_.dresidual, g[kLnfWeight].data,
                          g[kLnfBias].data, r, d);
}

void CudaGpt::backward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p,
                             std::span<const BufferView> g) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int f = config_.mlp_hidden();
  const DType pt = p[0].dtype;
  const DType gt = g[0].dtype;
  const BlockActs a = block_view(unit);
  const float* in = residual_stream(unit - 1);
  if (recompute() == Recompute::full) {
    forward_block(stream, unit, p, /*with_output=*/false);
  } else if (recompute() == Recompute::selective) {
    // The forward's own kernels on the kept inputs: the same bits.
    gpu::layernorm_forward(stream, pt, in, p[kLn1Weight].data, p[kLn1Bias].data, a.ln1, a.ln1_stat, r, d);
    gpu::layernorm_forward(stream, pt, a.res1, p[kLn2Weight].data, p[kLn2Bias].data, a.ln2, a.ln2_stat, r, d);
    gpu::gelu_forward(stream, a.fc, a.gelu, rows() * sz(f));
  }
  float* dres = acts_.dresidual;  // dL/d(block output) now; dL/d(block input) when done
  // MLP branch: out = res1 + proj(gelu(fc(ln2(res1)))).
  const BufferView& mlp_proj = p[kMlpProjWeight];
  linear_backward(stream, a.gelu, mlp_proj, dy_operand(dres, d, mlp_proj.dtype, stream), dres, acts_.dwide,
                  g[kMlpProjWeight], &g[kMlpProjBias], f, d);
  gpu::gelu_backward(stream, a.fc, acts_.dwide, acts_.dwide, rows() * sz(f));
  const BufferView& fc = p[kFcWeight];
  linear_backward(stream, a.ln2, fc, dy_operand(acts_.dwide, f, fc.dtype, stream), acts_.dwide, acts_.dnarrow,
                  g[kFcWeight], &g[kFcBias], d, f);
  gpu::layernorm_backward(stream, pt, gt, a.res1, p[kLn2Weight].data, a.ln2_stat, acts_.dnarrow, dres,
                          g[kLn2Weight].data, g[kLn2Bias].data, r, d);
  // Attention branch: res1 = in + proj(attention(qkv(ln1(in)))).
  const BufferView& attn_proj = p[kAttnProjWeight];
  linear_backward(stream, a.att, attn_proj, dy_operand(dres, d, attn_proj.dtype, stream), dres, acts_.dnarrow,
                  g[kAttnProjWeight], &g[kAttnProjBias], d, d);
  attention_backward(stream, attention(a), acts_.dnarrow, acts_.dqkv, acts_.delta);
  const BufferView& qkv = p[kQkvWeight];
  linear_backward(stream, a.ln1, qkv, dy_operand(acts_.dqkv, 3 * d, qkv.dtype, stream), acts_.dqkv, acts_.dnarrow,
                  g[kQkvWeight], &g[kQkvBias], d, 3 * d);
  gpu::layernorm_backward(stream, pt, gt, in, p[kLn1Weight].data, a.ln1_stat, acts_.dnarrow, dres, g[kLn1Weight].data,
                          g[kLn1Bias].data, r, d);
}

void CudaGpt::backward_embed(cudaStream_t stream, std::span<const BufferView> g) {
  gpu::embedding_backward(stream, g[0].dtype, acts_.dresidual, token_rows(), g[0].data, g[1].data, batch(), len(),
                          config_.hidden);
}

}  // namespace

std::unique_ptr<UnitModel> make_cuda_gpt(const GptConfig& config, Device& device) {
  return std::make_unique<CudaGpt>(config, device);
}

bool cuda_gpt_available() {
  return true;
}

}  // namespace zero3::models
