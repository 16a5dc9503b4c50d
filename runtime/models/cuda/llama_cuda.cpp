// The CUDA Llama: the unit-by-unit forward and backward of LlamaModel (llama.cpp) with the same formulas,
// behind the calling contract of cuda_decoder.hpp, on cuBLAS and the kernels of this folder (rmsnorm,
// rope_gqa, swiglu; the GPT's attention, embedding and cross-entropy). Precision as the CUDA GPT's
// (gpt_cuda.cpp): fp32 activations, RMSNorm statistics, softmax and losses; a linear layer multiplies in its
// weight's dtype (the fp32 activation operand rounded to it first) with fp32 accumulation; weight gradients
// accumulate in fp32 and are rounded once into the grads' dtype; every reduction has a fixed order.
//
// Memory: one arena carved per pass (train keeps every layer's activations, eval one layer's and two
// residual streams), 16-bit operand and fp32 weight-gradient scratch when the dtypes need them, and the
// rotary table of the current len, computed on the host by llama_ops' rope_table and uploaded when len
// changes.
#include "zero3/models/llama_cuda.hpp"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cross_entropy.cuh"
#include "cuda_decoder.hpp"
#include "embedding.cuh"
#include "linear_aux.cuh"
#include "llama_ops.hpp"
#include "llama_params.hpp"
#include "rmsnorm.cuh"
#include "rope_gqa.cuh"
#include "swiglu.cuh"
#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models {
namespace {

using gpu::AttentionTensors;
using gpu::Carver;
using gpu::CudaArray;
using gpu::Operand;

std::size_t sz(int v) {
  return static_cast<std::size_t>(v);
}

// What one layer keeps from forward for its backward (rows = batch * len), as LlamaModel's LayerActs.
struct LayerActs {
  float* norm1 = nullptr;     // [rows, hidden] input_layernorm output
  float* inv1 = nullptr;      // [rows] its 1/rms
  float* qkv = nullptr;       // [rows, 3 heads dim] rotated q, k, v per query head
  float* attn_lse = nullptr;  // [batch, heads, len] attention rows' log-sum-exp
  float* att = nullptr;       // [rows, heads dim]
  float* res1 = nullptr;      // [rows, hidden] residual stream after attention
  float* norm2 = nullptr;     // [rows, hidden]
  float* inv2 = nullptr;      // [rows]
  float* gate = nullptr;      // [rows, intermediate] before SiLU
  float* up = nullptr;        // [rows, intermediate]
  float* swiglu = nullptr;    // [rows, intermediate] silu(gate) * up
};

struct Activations {
  // The residual stream: unit u's output in residual[residual_slot(u)] (CudaDecoder::residual_slot).
  std::vector<float*> residual;
  std::vector<LayerActs> layers;  // train: one per layer (Recompute::full: one, reused); eval: one, reused
  LayerActs recomputed;           // Recompute::selective: norm1, norm2, swiglu of the layer in hand
  float* normf = nullptr;         // [rows, hidden]
  float* invf = nullptr;          // [rows]
  float* logits = nullptr;        // [rows, vocab]; dlogits in place for fp32 weights
  float* lse = nullptr;           // [rows] logsumexp of each row of logits
  float* losses = nullptr;        // [rows]
  double* loss = nullptr;         // the mean
  float* q = nullptr;             // [rows, heads dim] projections before rotation (forward), their gradients
  float* k = nullptr;             // [rows, kv_heads dim]                              (backward)
  float* v = nullptr;
  // Backward scratch (train only).
  float* dresidual = nullptr;  // [rows, hidden] the gradient flowing down the residual stream
  float* dnarrow = nullptr;    // [rows, max(hidden, heads dim)]
  float* dgate = nullptr;      // [rows, intermediate]
  float* dup = nullptr;
  float* dqkv = nullptr;   // [rows, 3 heads dim]
  float* delta = nullptr;  // [batch, heads, len] attention backward's rowsum(dO O)
};

// The pass an arena is carved for.
struct PassShape {
  int batch = 0;
  int len = 0;
  bool train = true;
  Recompute recompute = Recompute::none;
  bool offload = false;  // cpu_checkpointing
  // Layer sets carved: one per layer for a train pass that keeps them, else one reused by every layer.
  std::size_t layer_sets(int layers) const {
    return train && recompute != Recompute::full ? static_cast<std::size_t>(layers) : 1;
  }
  // Selective recomputation: norm1, norm2 and swiglu live once, in Activations::recomputed.
  bool shared_norms() const { return train && recompute == Recompute::selective; }
};

// The views each unit takes, following LlamaModel's unit_params(): the layers' params as llama_units()
// declares them, and for the head exactly two, the final norm and an output matrix [vocab, hidden] checked
// by size only (its name is lm_head.weight's, or the embedding's when the head declares only the norm).
std::vector<std::vector<ParamSpec>> llama_views(const LlamaConfig& c, const std::vector<UnitSpec>& units) {
  std::vector<std::vector<ParamSpec>> views;
  views.reserve(units.size());
  for (std::size_t u = 0; u + 1 < units.size(); ++u) views.push_back(units[u].params);
  const std::vector<ParamSpec>& head = units.back().params;
  ParamSpec output = head.size() > kOutput ? head[kOutput] : units.front().params.front();
  output.shape = {c.vocab_size, c.hidden};
  views.push_back({head.at(kFinalNorm), output});
  return views;
}

class CudaLlama final : public gpu::CudaDecoder {
 public:
  CudaLlama(const LlamaConfig& config, Device& device);
  ~CudaLlama() override;
  CudaLlama(const CudaLlama&) = delete;
  CudaLlama& operator=(const CudaLlama&) = delete;

  std::size_t activation_bytes() const override { return CudaDecoder::activation_bytes() + rope_.size_bytes(); }
  std::size_t planned_activation_bytes(const ActivationShape& shape) const override;

 private:
  std::size_t carve_pass(Activations& a, float* base, const PassShape& pass) const;
  std::size_t carve(float* base) override {
    return carve_pass(acts_, base, {batch(), len(), train(), recompute(), offload_kept_inputs()});
  }
  float* residual_stream(std::size_t u) override { return acts_.residual[residual_slot(u)]; }
  int hidden_size() const override { return config_.hidden; }
  // Layer `unit`'s buffers in this pass: its own set or the shared one, with the shared norms when selective.
  LayerActs layer_view(std::size_t unit) const;
  ScratchSizes scratch_sizes_for(std::size_t rows) const;
  ScratchSizes scratch_sizes() const override { return scratch_sizes_for(rows()); }
  const double* device_loss() const override { return acts_.loss; }
  void forward(std::size_t unit, std::span<const BufferView> params, cudaStream_t stream) override;
  void backward(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                float seed_scale, cudaStream_t stream) override;

  std::size_t q_width() const { return sz(config_.heads) * sz(config_.dim()); }
  std::size_t kv_width() const { return sz(config_.kv()) * sz(config_.dim()); }
  gpu::GqaShape gqa_shape() const {
    return {.rows = static_cast<int>(rows()),
            .len = len(),
            .heads = config_.heads,
            .kv_heads = config_.kv(),
            .head_dim = config_.dim()};
  }
  AttentionTensors attention(const LayerActs& a) const {
    return {.qkv = a.qkv, .lse = a.attn_lse, .att = a.att, .heads = config_.heads, .head_dim = config_.dim()};
  }
  const float* rope_cos() const { return rope_.as<const float>(); }
  const float* rope_sin() const { return rope_.as<const float>() + sz(len()) * sz(config_.dim() / 2); }
  const BufferView* optional(std::span<const BufferView> views, int k) const {
    return k < 0 ? nullptr : &views[static_cast<std::size_t>(k)];
  }

  void upload_rope(cudaStream_t stream);
  // y[rows, out] = x W^T (+ bias when the layer has one).
  void project(cudaStream_t stream, const float* x, std::span<const BufferView> p, std::size_t k, int bias, float* y,
               int in, int out) const;
  // with_output false stops after SwiGLU: what a full recomputation needs (backward never reads the output).
  void forward_layer(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p, bool with_output = true);
  void forward_head(cudaStream_t stream, std::span<const BufferView> p);
  void backward_head(cudaStream_t stream, std::span<const BufferView> p, std::span<const BufferView> g,
                     float seed_scale);
  void recompute_layer(cudaStream_t stream, std::size_t unit, const LayerActs& a, std::span<const BufferView> p);
  void backward_mlp(cudaStream_t stream, const LayerActs& a, std::span<const BufferView> p,
                    std::span<const BufferView> g);
  void backward_attention(cudaStream_t stream, const LayerActs& a, const float* in, std::span<const BufferView> p,
                          std::span<const BufferView> g);

  LlamaConfig config_;
  int q_bias_ = -1;  // param positions of the optional biases in a layer unit, -1 when absent
  int k_bias_ = -1;
  int v_bias_ = -1;
  int o_bias_ = -1;
  Activations acts_;
  CudaArray rope_;       // device: cos [len, dim / 2], then sin
  CudaArray rope_host_;  // pinned staging of the upload
  int rope_len_ = 0;     // the len rope_ holds the table of; 0: none
};

CudaLlama::CudaLlama(const LlamaConfig& config, Device& device)
    : CudaDecoder("CUDA Llama", device, llama_units(config), llama_views(config, llama_units(config)),
                  config.vocab_size, config.seq_len),
      config_(config) {
  set_description(fmt::format("{} ({} params), CUDA on {}", models::describe(config_), llama_num_params(config_),
                              device.description()));
  int next = kFixedLayerParams;
  if (config_.qkv_bias) {
    q_bias_ = next++;
    k_bias_ = next++;
    v_bias_ = next++;
  }
  if (config_.o_bias) o_bias_ = next;
}

CudaLlama::~CudaLlama() {
  release({&rope_, &rope_host_});
}

// ---- buffers ---------------------------------------------------------------------------------------------

std::size_t CudaLlama::carve_pass(Activations& a, float* base, const PassShape& pass) const {
  Carver c(base);
  const std::size_t r = sz(pass.batch) * sz(pass.len);
  const std::size_t d = sz(config_.hidden);
  const std::size_t f = sz(config_.intermediate);
  const std::size_t n = sz(pass.len);
  const std::size_t qw = q_width();
  a.residual.assign(residual_buffers(pass.train, pass.offload, config_.layers), nullptr);
  for (float*& p : a.residual) p = c.take(r * d);
  a.layers.assign(pass.layer_sets(config_.layers), LayerActs{});
  const auto norms = [&](LayerActs& l) {
    l.norm1 = c.take(r * d);
    l.norm2 = c.take(r * d);
    l.swiglu = c.take(r * f);
  };
  a.recomputed = LayerActs{};
  if (pass.shared_norms()) norms(a.recomputed);
  for (LayerActs& l : a.layers) {
    if (!pass.shared_norms()) norms(l);
    l.inv1 = c.take(r);
    l.qkv = c.take(r * 3 * qw);
    l.attn_lse = c.take(sz(pass.batch) * sz(config_.heads) * n);
    l.att = c.take(r * qw);
    l.res1 = c.take(r * d);
    l.inv2 = c.take(r);
    l.gate = c.take(r * f);
    l.up = c.take(r * f);
  }
  a.normf = c.take(r * d);
  a.invf = c.take(r);
  a.logits = c.take(r * sz(config_.vocab_size));
  a.lse = c.take(r);
  a.losses = c.take(r);
  a.loss = reinterpret_cast<double*>(c.take(2));  // 256-byte aligned
  a.q = c.take(r * qw);
  a.k = c.take(r * kv_width());
  a.v = c.take(r * kv_width());
  if (pass.train) {
    a.dresidual = c.take(r * d);
    a.dnarrow = c.take(r * std::max(d, qw));
    a.dgate = c.take(r * f);
    a.dup = c.take(r * f);
    a.dqkv = c.take(r * 3 * qw);
    a.delta = c.take(sz(pass.batch) * sz(config_.heads) * n);
  } else {
    a.dresidual = a.dnarrow = a.dgate = a.dup = a.dqkv = a.delta = nullptr;
  }
  return c.used();
}

CudaLlama::ScratchSizes CudaLlama::scratch_sizes_for(std::size_t rows) const {
  const std::size_t d = sz(config_.hidden);
  const std::size_t f = sz(config_.intermediate);
  const std::size_t vocab = sz(config_.vocab_size);
  const std::size_t qw = q_width();
  // x of a linear layer is [rows, hidden], [rows, heads dim] (o_proj) or [rows, intermediate] (down_proj); dy
  // has the layer's output width, the logits' included; the largest matrix is one of these widths by hidden.
  return {.operand_a = rows * std::max({d, qw, f}),
          .operand_b = rows * std::max({d, qw, f, vocab}),
          .weight_grad = d * std::max({qw, f, vocab})};
}

std::size_t CudaLlama::planned_activation_bytes(const ActivationShape& shape) const {
  if (shape.micro_batch <= 0 || shape.len <= 0) return 0;
  // What the passes grow the buffers to (CudaDecoder::ensure never shrinks): the larger arena of the two
  // passes, the batch words with every row's token distinct (3 rows + 2 uniq + 1 at most), operand scratch of
  // both passes but output-gradient and weight-gradient scratch of train passes only (the grads have the
  // params' dtype), and the rotary table.
  Activations sizing;
  const std::size_t train_rows = sz(shape.micro_batch) * sz(shape.len);
  const std::size_t eval_rows = shape.eval_batch > 0 ? sz(shape.eval_batch) * sz(shape.len) : 0;
  std::size_t arena =
      carve_pass(sizing, nullptr, {shape.micro_batch, shape.len, true, shape.recompute, shape.offload_kept_inputs});
  if (eval_rows > 0) arena = std::max(arena, carve_pass(sizing, nullptr, {shape.eval_batch, shape.len, false}));
  const std::size_t most_rows = std::max(train_rows, eval_rows);
  const std::size_t words = 3 * most_rows + 2 * std::min(most_rows, sz(config_.vocab_size)) + 1;
  std::size_t bytes = arena * sizeof(float) + words * sizeof(std::int32_t);
  if (shape.params != DType::f32) {
    const ScratchSizes train = scratch_sizes_for(train_rows);
    const ScratchSizes eval = scratch_sizes_for(eval_rows);
    bytes += (std::max(train.operand_a, eval.operand_a) + train.operand_b) * size_of(shape.params) +
             train.weight_grad * sizeof(float);
  }
  return bytes + 2 * sz(shape.len) * sz(config_.dim() / 2) * sizeof(float);
}

void CudaLlama::upload_rope(cudaStream_t stream) {
  if (rope_len_ == len()) return;
  std::vector<float> cos;
  std::vector<float> sin;
  ops::rope_table(sz(len()), sz(config_.dim()), config_.rope_theta, cos, sin);
  const std::size_t bytes = (cos.size() + sin.size()) * sizeof(float);
  wait_idle();  // earlier passes may still read the table or its staging
  rope_len_ = 0;
  if (rope_host_.size_bytes() < bytes) {
    rope_host_.reset();
    rope_host_ = CudaArray(bytes, CudaArray::Kind::pinned);
  }
  ensure(rope_, bytes);
  std::memcpy(rope_host_.data(), cos.data(), cos.size() * sizeof(float));
  std::memcpy(rope_host_.as<float>() + cos.size(), sin.data(), sin.size() * sizeof(float));
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(rope_.data(), rope_host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  rope_len_ = len();
}

LayerActs CudaLlama::layer_view(std::size_t unit) const {
  LayerActs a = acts_.layers[train() && recompute() != Recompute::full ? unit - 1 : 0];
  if (train() && recompute() == Recompute::selective) {
    a.norm1 = acts_.recomputed.norm1;
    a.norm2 = acts_.recomputed.norm2;
    a.swiglu = acts_.recomputed.swiglu;
  }
  return a;
}

// ---- units -----------------------------------------------------------------------------------------------

void CudaLlama::forward(std::size_t unit, std::span<const BufferView> params, cudaStream_t stream) {
  if (unit == 0) {
    upload_rope(stream);
    gpu::embedding_forward(stream, params[0].dtype, params[0].data, nullptr, tokens_dev(), residual_stream(0),
                           static_cast<int>(rows()), len(), config_.hidden);
  } else if (unit + 1 == num_units()) {
    forward_head(stream, params);
  } else {
    forward_layer(stream, unit, params);
  }
}

void CudaLlama::backward(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                         float seed_scale, cudaStream_t stream) {
  if (unit == 0) {
    // Rows sharing a token add into the same gradient row: grouped by token on the host, summed in row order.
    gpu::embedding_backward(stream, grads[0].dtype, acts_.dresidual, token_rows(), grads[0].data, nullptr, batch(),
                            len(), config_.hidden);
  } else if (unit + 1 == num_units()) {
    backward_head(stream, params, grads, seed_scale);
  } else {
    const LayerActs a = layer_view(unit);
    recompute_layer(stream, unit, a, params);
    backward_mlp(stream, a, params, grads);
    backward_attention(stream, a, residual_stream(unit - 1), params, grads);
  }
}

void CudaLlama::project(cudaStream_t stream, const float* x, std::span<const BufferView> p, std::size_t k, int bias,
                        float* y, int in, int out) const {
  if (bias >= 0) {  // bias first, then the product accumulates onto it
    gpu::bias_rows(stream, p[0].dtype, y, p[static_cast<std::size_t>(bias)].data, nullptr, static_cast<int>(rows()),
                   out);
  }
  linear_forward(stream, x, p[k], y, in, out, bias >= 0 ? 1.0f : 0.0f);
}

void CudaLlama::forward_layer(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p, bool with_output) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int f = config_.intermediate;
  const int qw = static_cast<int>(q_width());
  const int kvw = static_cast<int>(kv_width());
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const DType pt = p[0].dtype;
  const LayerActs a = layer_view(unit);
  const float* in = residual_stream(unit - 1);
  float* out = residual_stream(unit);
  const std::size_t stream_bytes = rows() * sz(d) * sizeof(float);
  // Attention: res1 = in + o_proj(attention(rope(q), rope(k), v)), q, k, v projections of norm1(in).
  gpu::rmsnorm_forward(stream, pt, in, p[kNorm1].data, a.norm1, a.inv1, r, d, eps);
  project(stream, a.norm1, p, kQProj, q_bias_, acts_.q, d, qw);
  project(stream, a.norm1, p, kKProj, k_bias_, acts_.k, d, kvw);
  project(stream, a.norm1, p, kVProj, v_bias_, acts_.v, d, kvw);
  gpu::gqa_pack(stream, gqa_shape(), acts_.q, acts_.k, acts_.v, a.qkv, rope_cos(), rope_sin());
  attention_forward(stream, attention(a));
  if (o_bias_ >= 0) {  // residual (+ bias), then += att W^T
    gpu::bias_rows(stream, pt, a.res1, p[sz(o_bias_)].data, in, r, d);
  } else {
    ZERO3_CUDA_CHECK(cudaMemcpyAsync(a.res1, in, stream_bytes, cudaMemcpyDeviceToDevice, stream));
  }
  linear_forward(stream, a.att, p[kOProj], a.res1, qw, d, 1.0f);
  // MLP: out = res1 + down(silu(gate(norm2)) * up(norm2)), norm2 = norm2(res1).
  gpu::rmsnorm_forward(stream, pt, a.res1, p[kNorm2].data, a.norm2, a.inv2, r, d, eps);
  linear_forward(stream, a.norm2, p[kGateProj], a.gate, d, f, 0.0f);
  linear_forward(stream, a.norm2, p[kUpProj], a.up, d, f, 0.0f);
  gpu::swiglu_forward(stream, a.gate, a.up, a.swiglu, rows() * sz(f));
  if (!with_output) return;
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(out, a.res1, stream_bytes, cudaMemcpyDeviceToDevice, stream));
  linear_forward(stream, a.swiglu, p[kDownProj], out, f, d, 1.0f);
}

void CudaLlama::forward_head(cudaStream_t stream, std::span<const BufferView> p) {
  const int r = static_cast<int>(rows());
  const std::size_t layers = sz(config_.layers);
  const float* in = residual_stream(layers);
  gpu::rmsnorm_forward(stream, p[kFinalNorm].dtype, in, p[kFinalNorm].data, acts_.normf, acts_.invf, r, config_.hidden,
                       static_cast<float>(config_.rms_norm_eps));
  linear_forward(stream, acts_.normf, p[kOutput], acts_.logits, config_.hidden, config_.vocab_size, 0.0f);
  gpu::cross_entropy_forward(stream, acts_.logits, targets_dev(), acts_.lse, acts_.losses, acts_.loss, r,
                             config_.vocab_size);
}

void CudaLlama::backward_head(cudaStream_t stream, std::span<const BufferView> p, std::span<const BufferView> g,
                              float seed_scale) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int vocab = config_.vocab_size;
  const BufferView& w = p[kOutput];
  // dlogits = seed_scale / rows * (softmax - onehot), written as the GEMM operand: over the logits for fp32
  // weights (nothing reads them after this), else rounded into the 16-bit operand scratch.
  void* dlogits = w.dtype == DType::f32 ? static_cast<void*>(acts_.logits) : output_grad_scratch();
  gpu::cross_entropy_backward(stream, w.dtype, acts_.logits, acts_.lse, targets_dev(), dlogits, r, vocab,
                              seed_scale / static_cast<float>(r));
  // Added into g[kOutput] whatever buffer it is (lm_head's, or the tied embedding's, which unit 0 adds to).
  linear_backward(stream, acts_.normf, w, Operand{dlogits, w.dtype}, nullptr, acts_.dnarrow, g[kOutput], nullptr, d,
                  vocab);
  ZERO3_CUDA_CHECK(cudaMemsetAsync(acts_.dresidual, 0, rows() * sz(d) * sizeof(float), stream));
  gpu::rmsnorm_backward(stream, p[kFinalNorm].dtype, g[kFinalNorm].dtype, residual_stream(sz(config_.layers)),
                        p[kFinalNorm].data, acts_.invf, acts_.dnarrow, acts_.dresidual, g[kFinalNorm].data, r, d);
}

// What a layer's backward needs and its forward did not keep, by the forward's own kernels on the same inputs
// (so the same bits): the whole forward up to SwiGLU (Recompute::full), or
// the norms and SwiGLU (Recompute::selective).
void CudaLlama::recompute_layer(cudaStream_t stream, std::size_t unit, const LayerActs& a,
                                std::span<const BufferView> p) {
  if (recompute() == Recompute::full) {
    forward_layer(stream, unit, p, /*with_output=*/false);
    return;
  }
  if (recompute() != Recompute::selective) return;
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const DType pt = p[0].dtype;
  gpu::rmsnorm_forward(stream, pt, residual_stream(unit - 1), p[kNorm1].data, a.norm1, a.inv1, r, d, eps);
  gpu::rmsnorm_forward(stream, pt, a.res1, p[kNorm2].data, a.norm2, a.inv2, r, d, eps);
  gpu::swiglu_forward(stream, a.gate, a.up, a.swiglu, rows() * sz(config_.intermediate));
}

// out = res1 + down(silu(gate(norm2)) * up(norm2)): dres (dL/d out) gains the norm2 path, becoming dL/d res1.
void CudaLlama::backward_mlp(cudaStream_t stream, const LayerActs& a, std::span<const BufferView> p,
                             std::span<const BufferView> g) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int f = config_.intermediate;
  float* dres = acts_.dresidual;
  const BufferView& down = p[kDownProj];
  linear_backward(stream, a.swiglu, down, dy_operand(dres, d, down.dtype, stream), dres, acts_.dgate, g[kDownProj],
                  nullptr, f, d);
  gpu::swiglu_backward(stream, a.gate, a.up, acts_.dgate, acts_.dgate, acts_.dup, rows() * sz(f));
  const BufferView& gate = p[kGateProj];
  linear_backward(stream, a.norm2, gate, dy_operand(acts_.dgate, f, gate.dtype, stream), acts_.dgate, acts_.dnarrow,
                  g[kGateProj], nullptr, d, f);
  const BufferView& up = p[kUpProj];
  linear_backward(stream, a.norm2, up, dy_operand(acts_.dup, f, up.dtype, stream), acts_.dup, acts_.dnarrow, g[kUpProj],
                  nullptr, d, f, /*accumulate_dx=*/true);
  gpu::rmsnorm_backward(stream, p[0].dtype, g[0].dtype, a.res1, p[kNorm2].data, a.inv2, acts_.dnarrow, dres,
                        g[kNorm2].data, r, d);
}

// res1 = in + o_proj(attention(rope(q), rope(k), v)): dres (dL/d res1) gains the norm1 path, becoming dL/d in.
void CudaLlama::backward_attention(cudaStream_t stream, const LayerActs& a, const float* in,
                                   std::span<const BufferView> p, std::span<const BufferView> g) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int qw = static_cast<int>(q_width());
  const int kvw = static_cast<int>(kv_width());
  float* dres = acts_.dresidual;
  const BufferView& o = p[kOProj];
  linear_backward(stream, a.att, o, dy_operand(dres, d, o.dtype, stream), dres, acts_.dnarrow, g[kOProj],
                  optional(g, o_bias_), qw, d);
  attention_backward(stream, attention(a), acts_.dnarrow, acts_.dqkv, acts_.delta);
  // dq, dk, dv (rotations undone, dk and dv summed over each kv head's query heads) over the forward's q, k, v.
  gpu::gqa_unpack(stream, gqa_shape(), acts_.dqkv, acts_.q, acts_.k, acts_.v, rope_cos(), rope_sin());
  const BufferView& wq = p[kQProj];
  linear_backward(stream, a.norm1, wq, dy_operand(acts_.q, qw, wq.dtype, stream), acts_.q, acts_.dnarrow, g[kQProj],
                  optional(g, q_bias_), d, qw);
  const BufferView& wk = p[kKProj];
  linear_backward(stream, a.norm1, wk, dy_operand(acts_.k, kvw, wk.dtype, stream), acts_.k, acts_.dnarrow, g[kKProj],
                  optional(g, k_bias_), d, kvw, /*accumulate_dx=*/true);
  const BufferView& wv = p[kVProj];
  linear_backward(stream, a.norm1, wv, dy_operand(acts_.v, kvw, wv.dtype, stream), acts_.v, acts_.dnarrow, g[kVProj],
                  optional(g, v_bias_), d, kvw, /*accumulate_dx=*/true);
  gpu::rmsnorm_backward(stream, p[0].dtype, g[0].dtype, in, p[kNorm1].data, a.inv1, acts_.dnarrow, dres, g[kNorm1].data,
                        r, d);
}

}  // namespace

std::unique_ptr<UnitModel> make_cuda_llama(const LlamaConfig& config, Device& device) {
  return std::make_unique<CudaLlama>(config, device);
}

bool cuda_llama_available() {
  return true;
}

}  // namespace zero3::models
