// The CUDA GPT: the unit-by-unit forward and backward of GptModel (gpt.cpp) with the same formulas, on
// cuBLAS and the kernels of this folder. Precision: activations, LayerNorm statistics, softmax and losses are
// fp32. A linear layer's product takes A and B in its weight's dtype: with 16-bit weights the fp32 activation
// operand is rounded to that dtype first (as autocast does), and cuBLAS accumulates in fp32 into fp32 output.
// Attention's products (activation by activation) stay fp32; with 16-bit weights they may use tf32 tensor
// cores, still finer than the bf16 operands of the linear layers. Weight gradients accumulate in fp32 and are
// rounded once into the grads' dtype. Every reduction has a fixed order (embedding backward included: rows are
// grouped by token on the host, no atomics), so a run repeats bit for bit on one GPU and cuBLAS version.
//
// Memory: one cudaMalloc'd arena carved into named fp32 views per pass (train keeps every block's
// activations, eval one block's and two residual streams), grown never shrunk; 16-bit operand and fp32
// weight-gradient scratch only when the dtypes need them. Buffers are reused in stream order; before one is
// freed the host waits for the event recorded after the model's last call.
#include "zero3/models/gpt_cuda.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attention_softmax.cuh"
#include "cast.cuh"  // zero3::kernels::gpu::launch_cast (kernels/cuda)
#include "cross_entropy.cuh"
#include "cuda_resources.hpp"
#include "embedding.cuh"
#include "gelu.cuh"
#include "gemm.hpp"
#include "layernorm.cuh"
#include "linear_aux.cuh"
#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models {
namespace {

using gpu::Carver;
using gpu::CublasHandle;
using gpu::CudaArray;
using gpu::CudaEventHandle;
using gpu::DeviceGuard;
using gpu::GemmArgs;
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
  float* prob = nullptr;      // [batch, heads, len, len]
  float* att = nullptr;       // [rows, hidden]
  float* res1 = nullptr;      // [rows, hidden]
  float* ln2 = nullptr;
  float* ln2_stat = nullptr;
  float* fc = nullptr;    // [rows, 4 hidden] before GELU
  float* gelu = nullptr;  // [rows, 4 hidden]
};

struct Activations {
  // Train: residual[u] is the output of unit u (the input of unit u + 1); eval: residual[u % 2].
  std::vector<float*> residual;
  std::vector<BlockActs> blocks;  // train: one per block; eval: one, reused
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
  float* dprob = nullptr;      // one attention group's [count, len, len]
};

// Attention runs as `groups` strided-batched products of `count` (sequence, head) pairs each: per sequence
// batched over heads, or per head batched over sequences, whichever makes fewer cuBLAS calls.
struct AttentionGroups {
  int groups = 0;
  int count = 0;
  bool by_sequence = true;
  std::size_t len = 0;
  std::size_t hidden = 0;
  std::size_t heads = 0;
  std::size_t head_dim = 0;

  AttentionGroups(int batch, int seq, int num_heads, int dim)
      : groups(std::min(batch, num_heads)),
        count(std::max(batch, num_heads)),
        by_sequence(batch <= num_heads),
        len(sz(seq)),
        hidden(sz(num_heads) * sz(dim)),
        heads(sz(num_heads)),
        head_dim(sz(dim)) {}

  // Element offsets of group g's first pair, and strides between the pairs of a group, into qkv
  // [batch, len, 3 hidden], prob [batch, heads, len, len] and att [batch, len, hidden].
  std::size_t qkv_offset(int g) const { return by_sequence ? sz(g) * len * 3 * hidden : sz(g) * head_dim; }
  std::size_t prob_offset(int g) const { return by_sequence ? sz(g) * heads * len * len : sz(g) * len * len; }
  std::size_t att_offset(int g) const { return by_sequence ? sz(g) * len * hidden : sz(g) * head_dim; }
  long long qkv_stride() const { return static_cast<long long>(by_sequence ? head_dim : len * 3 * hidden); }
  long long prob_stride() const { return static_cast<long long>(by_sequence ? len * len : heads * len * len); }
  long long att_stride() const { return static_cast<long long>(by_sequence ? head_dim : len * hidden); }
};

class CudaGpt final : public UnitModel {
 public:
  CudaGpt(const GptConfig& config, Device& device);
  ~CudaGpt() override;
  CudaGpt(const CudaGpt&) = delete;
  CudaGpt& operator=(const CudaGpt&) = delete;

  const std::vector<UnitSpec>& units() const override { return units_; }
  std::string describe() const override { return description_; }
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass) override;
  void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) override;
  double loss(Stream& stream) override;
  void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                     float seed_scale, Stream& stream) override;
  std::size_t activation_bytes() const override;
  MemoryKind activation_memory() const override { return MemoryKind::device; }

 private:
  std::size_t num_units() const { return units_.size(); }
  std::size_t rows() const { return sz(batch_) * sz(len_); }
  bool train() const { return pass_ == Pass::train; }
  std::string unit_name(std::size_t unit) const {
    return unit < units_.size() ? fmt::format("unit {} ({})", unit, units_[unit].name) : fmt::format("unit {}", unit);
  }

  // Argument checks, once per call.
  void check_views(const char* what, std::size_t unit, std::span<const BufferView> views, const char* kind) const;
  cudaStream_t bind_stream(Stream& stream, const char* what);

  // Buffers: sized before a call enqueues anything, so a reallocation may wait for the previous calls.
  std::size_t carve(Activations& acts, float* base) const;
  void wait_idle();
  void ensure(CudaArray& array, std::size_t size_bytes);
  void prepare_pass();
  void ensure_operands(DType weight_dtype, bool backward);
  void ensure_weight_grad_scratch(DType grad_dtype);
  void upload_batch(cudaStream_t stream);

  // x rounded to `dtype` into `scratch` (or x itself for f32), as a GEMM operand.
  Operand operand(const float* x, std::size_t count, DType dtype, void* scratch, cudaStream_t stream) const;
  // y[rows, out] = x[rows, in] W^T + beta y.
  void linear_forward(cudaStream_t stream, const float* x, const BufferView& w, float* y, int in, int out,
                      float beta) const;
  // dx = dy W (skipped when dx is null); dW += dy^T x; dbias += column sums of dy_f32 (when dbias is set).
  void linear_backward(cudaStream_t stream, const float* x, const BufferView& w, Operand dy, const float* dy_f32,
                       float* dx, const BufferView& dw, const BufferView* dbias, int in, int out) const;
  void attention_forward(cudaStream_t stream, const BlockActs& a, DType weight_dtype) const;
  void attention_backward(cudaStream_t stream, const BlockActs& a, DType weight_dtype) const;

  void forward_embed(cudaStream_t stream, std::span<const BufferView> p);
  void forward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p);
  void forward_head(cudaStream_t stream, std::span<const BufferView> p);
  void backward_head(cudaStream_t stream, std::span<const BufferView> p, std::span<const BufferView> g,
                     float seed_scale);
  void backward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p,
                      std::span<const BufferView> g);
  void backward_embed(cudaStream_t stream, std::span<const BufferView> g);

  GptConfig config_;
  std::vector<UnitSpec> units_;
  std::string description_;
  const Device* device_;  // identity only: the device streams must belong to
  int ordinal_ = 0;

  // Declared before the memory they guard, so they outlive it.
  std::optional<CudaEventHandle> done_;      // after the model's last call: its buffers are free
  std::optional<CudaEventHandle> uploaded_;  // after the last batch upload: the staging is free
  std::optional<CublasHandle> cublas_;
  cudaStream_t cublas_stream_ = nullptr;

  Pass pass_ = Pass::train;
  int batch_ = 0;
  int len_ = 0;
  bool batch_set_ = false;
  bool empty_ = false;  // batch 0 (eval only): every call checks its arguments and computes nothing
  std::size_t next_forward_ = 0;
  std::size_t next_backward_ = 0;  // one past the unit backward_unit expects next; 0: none
  bool loss_ready_ = false;

  // The batch as int32 words: tokens, targets, then the rows grouped by token for the embedding backward
  // (row_index [rows], uniq [num_uniq], offsets [num_uniq + 1]).
  CudaArray staging_;  // pinned
  std::size_t staged_words_ = 0;
  int num_uniq_ = 0;
  CudaArray loss_host_;  // pinned, one double
  CudaArray batch_words_;
  CudaArray arena_;
  CudaArray operands_a_;   // 16-bit copies of activation operands (x of a linear layer)
  CudaArray operands_b_;   // 16-bit copies of output gradients (dy of a linear layer, dlogits)
  CudaArray weight_grad_;  // fp32 dW before it is added into 16-bit grads
  Activations acts_;
  gpu::TokenRows token_rows_;
  const std::int32_t* tokens_dev_ = nullptr;
  const std::int32_t* targets_dev_ = nullptr;
};

CudaGpt::CudaGpt(const GptConfig& config, Device& device) : config_(config), device_(&device) {
  validate(config_);
  units_ = gpt_units(config_);
  if (device.kind() != DeviceKind::cuda) {
    throw ConfigError(fmt::format("zero3.device: the CUDA GPT needs a cuda device, got a {} device ({})",
                                  device_kind_name(device.kind()), device.description()));
  }
  const std::optional<std::string> pci = device.pci_bus_id();
  if (!pci) throw ConfigError(fmt::format("zero3.device: {} reports no PCI bus id", device.description()));
  ZERO3_CUDA_CHECK(cudaDeviceGetByPCIBusId(&ordinal_, pci->c_str()));
  description_ = fmt::format("GPT {} layers, hidden {}, {} heads, mlp {}, vocab {}, seq_len {} ({} params), CUDA on {}",
                             config_.layers, config_.hidden, config_.heads, config_.mlp_hidden(), config_.vocab_size,
                             config_.seq_len, gpt_num_params(config_), device.description());
  DeviceGuard guard(ordinal_);
  done_.emplace();
  uploaded_.emplace();
  cublas_.emplace();
  loss_host_ = CudaArray(sizeof(double), CudaArray::Kind::pinned);
}

CudaGpt::~CudaGpt() {
  // The trainer may have destroyed the Device (and its streams, drained) already: only CUDA calls here.
  try {
    DeviceGuard guard(ordinal_);
    ZERO3_CUDA_CHECK_NOTHROW(cudaEventSynchronize(done_->get()));
    ZERO3_CUDA_CHECK_NOTHROW(cudaEventSynchronize(uploaded_->get()));
    for (CudaArray* a : {&staging_, &loss_host_, &batch_words_, &arena_, &operands_a_, &operands_b_, &weight_grad_}) {
      a->reset();
    }
    cublas_.reset();
  } catch (...) {  // DeviceGuard failed: the members' own destructors still free what they hold
  }
}

// ---- checks ----------------------------------------------------------------------------------------------

void CudaGpt::check_views(const char* what, std::size_t unit, std::span<const BufferView> views,
                          const char* kind) const {
  const std::vector<ParamSpec>& specs = units_[unit].params;
  if (views.size() != specs.size()) {
    throw UsageError(
        fmt::format("CUDA GPT {}: {} takes {} {}s, got {}", what, unit_name(unit), specs.size(), kind, views.size()));
  }
  for (std::size_t k = 0; k < views.size(); ++k) {
    const BufferView& v = views[k];
    if (v.count != specs[k].numel() || v.data == nullptr) {
      throw UsageError(fmt::format("CUDA GPT {}: {} {} '{}' has {} elements at {}, expected {}", what, unit_name(unit),
                                   kind, specs[k].name, v.count, v.data, specs[k].numel()));
    }
    if (v.kind != MemoryKind::device) {
      throw UsageError(fmt::format("CUDA GPT {}: {} {} '{}' is in {} memory; the model computes on device memory", what,
                                   unit_name(unit), kind, specs[k].name, memory_kind_name(v.kind)));
    }
    if (v.dtype != views[0].dtype) {
      throw UsageError(fmt::format("CUDA GPT {}: {} {}s mix dtypes ('{}' is {}, '{}' is {})", what, unit_name(unit),
                                   kind, specs[0].name, dtype_name(views[0].dtype), specs[k].name,
                                   dtype_name(v.dtype)));
    }
  }
}

cudaStream_t CudaGpt::bind_stream(Stream& stream, const char* what) {
  if (&stream.device() != device_) {
    throw UsageError(fmt::format("CUDA GPT {}: stream '{}' belongs to another device ({})", what, stream.name(),
                                 stream.device().description()));
  }
  auto s = static_cast<cudaStream_t>(stream.native_handle());
  if (s != cublas_stream_) {
    ZERO3_CUBLAS_CHECK(cublasSetStream(cublas_->get(), s));
    cublas_stream_ = s;
  }
  return s;
}

// ---- buffers ---------------------------------------------------------------------------------------------

std::size_t CudaGpt::carve(Activations& a, float* base) const {
  Carver c(base);
  const std::size_t r = rows();
  const std::size_t d = sz(config_.hidden);
  const std::size_t f = sz(config_.mlp_hidden());
  const std::size_t len = sz(len_);
  const std::size_t layers = sz(config_.layers);
  a.residual.assign(train() ? layers + 1 : 2, nullptr);
  for (float*& p : a.residual) p = c.take(r * d);
  a.blocks.assign(train() ? layers : 1, BlockActs{});
  for (BlockActs& b : a.blocks) {
    b.ln1 = c.take(r * d);
    b.ln1_stat = c.take(2 * r);
    b.qkv = c.take(r * 3 * d);
    b.prob = c.take(sz(batch_) * sz(config_.heads) * len * len);
    b.att = c.take(r * d);
    b.res1 = c.take(r * d);
    b.ln2 = c.take(r * d);
    b.ln2_stat = c.take(2 * r);
    b.fc = c.take(r * f);
    b.gelu = c.take(r * f);
  }
  a.lnf = c.take(r * d);
  a.lnf_stat = c.take(2 * r);
  a.logits = c.take(r * sz(config_.vocab_size));
  a.lse = c.take(r);
  a.losses = c.take(r);
  a.loss = reinterpret_cast<double*>(c.take(2));  // 256-byte aligned
  if (train()) {
    const AttentionGroups groups(batch_, len_, config_.heads, config_.head_dim());
    a.dresidual = c.take(r * d);
    a.dwide = c.take(r * f);
    a.dnarrow = c.take(r * d);
    a.dqkv = c.take(r * 3 * d);
    a.dprob = c.take(sz(groups.count) * len * len);
  } else {
    a.dresidual = a.dwide = a.dnarrow = a.dqkv = a.dprob = nullptr;
  }
  return c.used();
}

void CudaGpt::wait_idle() {
  ZERO3_CUDA_CHECK(cudaEventSynchronize(done_->get()));
}

void CudaGpt::ensure(CudaArray& array, std::size_t size_bytes) {
  if (array.size_bytes() >= size_bytes) return;
  wait_idle();  // earlier calls may still read the old buffer
  array.reset();
  array = CudaArray(size_bytes, CudaArray::Kind::device);
}

void CudaGpt::prepare_pass() {
  Activations sizing;
  ensure(arena_, carve(sizing, nullptr) * sizeof(float));
  carve(acts_, arena_.as<float>());
  ensure(batch_words_, staged_words_ * sizeof(std::int32_t));
}

void CudaGpt::ensure_operands(DType weight_dtype, bool backward) {
  if (weight_dtype == DType::f32) return;
  const std::size_t r = rows();
  const std::size_t widest_out = std::max({sz(config_.vocab_size), sz(config_.mlp_hidden()), 3 * sz(config_.hidden)});
  ensure(operands_a_, r * sz(config_.mlp_hidden()) * size_of(weight_dtype));
  if (backward) ensure(operands_b_, r * widest_out * size_of(weight_dtype));
}

void CudaGpt::ensure_weight_grad_scratch(DType grad_dtype) {
  if (grad_dtype == DType::f32) return;
  const std::size_t d = sz(config_.hidden);
  const std::size_t largest = std::max({sz(config_.vocab_size) * d, sz(config_.mlp_hidden()) * d, 3 * d * d});
  ensure(weight_grad_, largest * sizeof(float));
}

void CudaGpt::upload_batch(cudaStream_t stream) {
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(batch_words_.data(), staging_.data(), staged_words_ * sizeof(std::int32_t),
                                   cudaMemcpyHostToDevice, stream));
  ZERO3_CUDA_CHECK(cudaEventRecord(uploaded_->get(), stream));
  const std::int32_t* words = batch_words_.as<const std::int32_t>();
  const std::size_t r = rows();
  tokens_dev_ = words;
  targets_dev_ = words + r;
  token_rows_.row_index = words + 2 * r;
  token_rows_.uniq = words + 3 * r;
  token_rows_.offsets = words + 3 * r + sz(num_uniq_);
  token_rows_.num_uniq = num_uniq_;
}

std::size_t CudaGpt::activation_bytes() const {
  std::size_t total = 0;
  for (const CudaArray* a : {&batch_words_, &arena_, &operands_a_, &operands_b_, &weight_grad_}) {
    total += a->size_bytes();
  }
  return total;
}

// ---- calls -----------------------------------------------------------------------------------------------

void CudaGpt::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                        Pass pass) {
  if (batch < 0 || (batch == 0 && pass == Pass::train)) {
    throw UsageError(
        fmt::format("CUDA GPT set_batch: batch must be >= 1 (0 only for an eval pass), got {} for a {} pass", batch,
                    pass == Pass::train ? "train" : "eval"));
  }
  if (batch > 0 && (len < 1 || len > config_.seq_len)) {
    throw UsageError(
        fmt::format("CUDA GPT set_batch: len must be in [1, zero3.model.seq_len = {}], got {}", config_.seq_len, len));
  }
  const std::size_t r = batch > 0 ? sz(batch) * sz(len) : 0;
  if (tokens.size() != r || targets.size() != r) {
    throw UsageError(fmt::format("CUDA GPT set_batch: tokens ({}) and targets ({}) must hold batch * len = {} ids",
                                 tokens.size(), targets.size(), r));
  }
  for (std::size_t i = 0; i < r; ++i) {
    for (const auto& [ids, what] : {std::pair{tokens, "tokens"}, std::pair{targets, "targets"}}) {
      if (ids[i] < 0 || ids[i] >= config_.vocab_size) {
        throw UsageError(
            fmt::format("CUDA GPT set_batch: {}[{}] (sequence {}, position {}) = {} is outside the vocabulary [0, {})",
                        what, i, i / sz(len), i % sz(len), ids[i], config_.vocab_size));
      }
    }
  }

  batch_set_ = false;  // until the batch is staged: a failed set_batch leaves no pass to run
  if (r > 0) {
    // Group the rows by token for a deterministic embedding backward (stable: rows stay in order).
    std::vector<std::int32_t> order(r);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) { return tokens[a] < tokens[b]; });
    std::vector<std::int32_t> uniq;
    std::vector<std::int32_t> offsets;
    for (std::size_t j = 0; j < r; ++j) {
      if (j == 0 || tokens[order[j]] != tokens[order[j - 1]]) {
        uniq.push_back(tokens[order[j]]);
        offsets.push_back(static_cast<std::int32_t>(j));
      }
    }
    offsets.push_back(static_cast<std::int32_t>(r));
    const std::size_t words = 3 * r + uniq.size() + offsets.size();
    DeviceGuard guard(ordinal_);
    ZERO3_CUDA_CHECK(cudaEventSynchronize(uploaded_->get()));  // the last upload has read the staging
    if (staging_.size_bytes() < words * sizeof(std::int32_t)) {
      staging_.reset();
      staging_ = CudaArray(words * sizeof(std::int32_t), CudaArray::Kind::pinned);
    }
    std::int32_t* w = staging_.as<std::int32_t>();
    std::memcpy(w, tokens.data(), r * sizeof(std::int32_t));
    std::memcpy(w + r, targets.data(), r * sizeof(std::int32_t));
    std::memcpy(w + 2 * r, order.data(), r * sizeof(std::int32_t));
    std::memcpy(w + 3 * r, uniq.data(), uniq.size() * sizeof(std::int32_t));
    std::memcpy(w + 3 * r + uniq.size(), offsets.data(), offsets.size() * sizeof(std::int32_t));
    staged_words_ = words;
    num_uniq_ = static_cast<int>(uniq.size());
  }
  pass_ = pass;
  batch_ = batch;
  len_ = batch > 0 ? len : 0;
  empty_ = batch == 0;
  batch_set_ = true;
  next_forward_ = 0;
  next_backward_ = 0;
  loss_ready_ = false;
}

void CudaGpt::forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) {
  if (!batch_set_ || unit != next_forward_ || unit >= num_units()) {
    throw UsageError(
        fmt::format("CUDA GPT forward_unit: {} called, but {}", unit_name(unit),
                    !batch_set_ ? std::string("no batch is set (call set_batch first)")
                    : next_forward_ < num_units()
                        ? fmt::format("{} is next (units run in order after set_batch)", unit_name(next_forward_))
                        : std::string("every unit has run (call set_batch for the next pass)")));
  }
  check_views("forward_unit", unit, params, "param");
  const bool head = unit + 1 == num_units();
  if (!empty_) {
    DeviceGuard guard(ordinal_);
    const cudaStream_t s = bind_stream(stream, "forward_unit");
    if (unit == 0) {
      prepare_pass();
      upload_batch(s);
      forward_embed(s, params);
    } else {
      ensure_operands(params[head ? kLmHeadWeight : std::size_t{kQkvWeight}].dtype, false);
      if (head) {
        forward_head(s, params);
      } else {
        forward_block(s, unit, params);
      }
    }
    ZERO3_CUDA_CHECK(cudaEventRecord(done_->get(), s));
  }
  ++next_forward_;
  if (head) {
    loss_ready_ = true;
    if (train()) next_backward_ = num_units();
  }
}

double CudaGpt::loss(Stream& stream) {
  if (!loss_ready_) {
    throw UsageError("CUDA GPT loss: the head's forward has not run since set_batch (run every unit's forward first)");
  }
  if (empty_) return 0.0;
  DeviceGuard guard(ordinal_);
  const cudaStream_t s = bind_stream(stream, "loss");
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(loss_host_.data(), acts_.loss, sizeof(double), cudaMemcpyDeviceToHost, s));
  stream.synchronize();
  return *loss_host_.as<const double>();
}

void CudaGpt::backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                            float seed_scale, Stream& stream) {
  if (!batch_set_ || !train()) {
    throw UsageError(fmt::format("CUDA GPT backward_unit: {} called {}", unit_name(unit),
                                 batch_set_ ? "after an eval pass (set_batch with Pass::train)" : "before set_batch"));
  }
  if (next_backward_ == 0 || unit + 1 != next_backward_) {
    throw UsageError(fmt::format(
        "CUDA GPT backward_unit: {} called, but {} (units run in reverse order after every forward)", unit_name(unit),
        next_backward_ == 0 ? std::string("no backward is due")
                            : fmt::format("{} is next", unit_name(next_backward_ - 1))));
  }
  check_views("backward_unit", unit, params, "param");
  check_views("backward_unit", unit, grads, "gradient");
  DeviceGuard guard(ordinal_);
  const cudaStream_t s = bind_stream(stream, "backward_unit");
  if (unit == 0) {
    backward_embed(s, grads);
  } else {
    ensure_operands(params[unit + 1 == num_units() ? kLmHeadWeight : std::size_t{kQkvWeight}].dtype, true);
    ensure_weight_grad_scratch(grads[0].dtype);
    if (unit + 1 == num_units()) {
      backward_head(s, params, grads, seed_scale);
    } else {
      backward_block(s, unit, params, grads);
    }
  }
  ZERO3_CUDA_CHECK(cudaEventRecord(done_->get(), s));
  --next_backward_;
}

// ---- building blocks -------------------------------------------------------------------------------------

Operand CudaGpt::operand(const float* x, std::size_t count, DType dtype, void* scratch, cudaStream_t stream) const {
  if (dtype == DType::f32) return {x, DType::f32};
  if (count > 0) {
    kernels::gpu::launch_cast(stream, BufferView{scratch, count, dtype, MemoryKind::device},
                              ConstBufferView{x, count, DType::f32, MemoryKind::device});
  }
  return {scratch, dtype};
}

void CudaGpt::linear_forward(cudaStream_t stream, const float* x, const BufferView& w, float* y, int in, int out,
                             float beta) const {
  const int r = static_cast<int>(rows());
  const Operand xo = operand(x, rows() * sz(in), w.dtype, operands_a_.data(), stream);
  GemmArgs g;
  g.trans_b = true;
  g.m = r;
  g.n = out;
  g.k = in;
  g.beta = beta;
  g.lda = in;
  g.ldb = in;
  g.ldc = out;
  gpu::gemm(cublas_->get(), g, xo, Operand{w.data, w.dtype}, y);
}

void CudaGpt::linear_backward(cudaStream_t stream, const float* x, const BufferView& w, Operand dy, const float* dy_f32,
                              float* dx, const BufferView& dw, const BufferView* dbias, int in, int out) const {
  const int r = static_cast<int>(rows());
  if (dx != nullptr) {  // dx[rows, in] = dy[rows, out] W[out, in]
    GemmArgs g;
    g.m = r;
    g.n = in;
    g.k = out;
    g.lda = out;
    g.ldb = in;
    g.ldc = in;
    gpu::gemm(cublas_->get(), g, dy, Operand{w.data, w.dtype}, dx);
  }
  // dW[out, in] += dy^T x, in fp32: straight into fp32 grads, else into scratch and then rounded once.
  const Operand xo = operand(x, rows() * sz(in), w.dtype, operands_a_.data(), stream);
  const bool direct = dw.dtype == DType::f32;
  GemmArgs g;
  g.trans_a = true;
  g.m = out;
  g.n = in;
  g.k = r;
  g.beta = direct ? 1.0f : 0.0f;
  g.lda = out;
  g.ldb = in;
  g.ldc = in;
  gpu::gemm(cublas_->get(), g, dy, xo, direct ? dw.as<float>() : weight_grad_.as<float>());
  if (!direct) gpu::add_into(stream, dw.dtype, dw.data, weight_grad_.as<const float>(), sz(out) * sz(in));
  if (dbias != nullptr) gpu::bias_grad(stream, dbias->dtype, dy_f32, dbias->data, r, out);
}

void CudaGpt::attention_forward(cudaStream_t stream, const BlockActs& a, DType weight_dtype) const {
  const AttentionGroups ag(batch_, len_, config_.heads, config_.head_dim());
  const int d = config_.hidden;
  const cublasComputeType_t compute = weight_dtype == DType::f32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  GemmArgs scores;  // S = Q K^T / sqrt(head_dim)
  scores.trans_b = true;
  scores.m = len_;
  scores.n = len_;
  scores.k = config_.head_dim();
  scores.alpha = 1.0f / std::sqrt(static_cast<float>(config_.head_dim()));
  scores.lda = 3 * d;
  scores.ldb = 3 * d;
  scores.ldc = len_;
  scores.compute = compute;
  for (int grp = 0; grp < ag.groups; ++grp) {
    const float* q = a.qkv + ag.qkv_offset(grp);
    gpu::gemm_strided_batched(cublas_->get(), scores, Operand{q}, ag.qkv_stride(), Operand{q + d}, ag.qkv_stride(),
                              a.prob + ag.prob_offset(grp), ag.prob_stride(), ag.count);
  }
  gpu::causal_softmax_forward(stream, a.prob, batch_ * config_.heads, len_);
  GemmArgs mix;  // A = P V
  mix.m = len_;
  mix.n = config_.head_dim();
  mix.k = len_;
  mix.lda = len_;
  mix.ldb = 3 * d;
  mix.ldc = d;
  mix.compute = compute;
  for (int grp = 0; grp < ag.groups; ++grp) {
    const float* v = a.qkv + ag.qkv_offset(grp) + 2 * sz(d);
    gpu::gemm_strided_batched(cublas_->get(), mix, Operand{a.prob + ag.prob_offset(grp)}, ag.prob_stride(), Operand{v},
                              ag.qkv_stride(), a.att + ag.att_offset(grp), ag.att_stride(), ag.count);
  }
}

void CudaGpt::attention_backward(cudaStream_t stream, const BlockActs& a, DType weight_dtype) const {
  const AttentionGroups ag(batch_, len_, config_.heads, config_.head_dim());
  const int d = config_.hidden;
  const int hd = config_.head_dim();
  const long long square = static_cast<long long>(len_) * len_;
  const cublasComputeType_t compute = weight_dtype == DType::f32 ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32F_FAST_TF32;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const float* datt = acts_.dnarrow;
  float* dprob = acts_.dprob;

  GemmArgs dp;  // dP = dA V^T
  dp.trans_b = true;
  dp.m = len_;
  dp.n = len_;
  dp.k = hd;
  dp.lda = d;
  dp.ldb = 3 * d;
  dp.ldc = len_;
  dp.compute = compute;
  GemmArgs dv;  // dV = P^T dA
  dv.trans_a = true;
  dv.m = len_;
  dv.n = hd;
  dv.k = len_;
  dv.lda = len_;
  dv.ldb = d;
  dv.ldc = 3 * d;
  dv.compute = compute;
  GemmArgs dq;  // dQ = dS K / sqrt(head_dim)
  dq.m = len_;
  dq.n = hd;
  dq.k = len_;
  dq.alpha = scale;
  dq.lda = len_;
  dq.ldb = 3 * d;
  dq.ldc = 3 * d;
  dq.compute = compute;
  GemmArgs dk = dq;  // dK = dS^T Q / sqrt(head_dim)
  dk.trans_a = true;

  for (int grp = 0; grp < ag.groups; ++grp) {
    const std::size_t qo = ag.qkv_offset(grp);
    const float* q = a.qkv + qo;
    const float* k = q + d;
    const float* v = q + 2 * sz(d);
    float* dqp = acts_.dqkv + qo;
    float* dkp = dqp + d;
    float* dvp = dqp + 2 * sz(d);
    const float* p = a.prob + ag.prob_offset(grp);
    const float* da = datt + ag.att_offset(grp);
    gpu::gemm_strided_batched(cublas_->get(), dp, Operand{da}, ag.att_stride(), Operand{v}, ag.qkv_stride(), dprob,
                              square, ag.count);
    gpu::gemm_strided_batched(cublas_->get(), dv, Operand{p}, ag.prob_stride(), Operand{da}, ag.att_stride(), dvp,
                              ag.qkv_stride(), ag.count);
    gpu::causal_softmax_backward(stream, p, ag.prob_stride(), dprob, square, ag.count, len_);
    gpu::gemm_strided_batched(cublas_->get(), dq, Operand{dprob}, square, Operand{k}, ag.qkv_stride(), dqp,
                              ag.qkv_stride(), ag.count);
    gpu::gemm_strided_batched(cublas_->get(), dk, Operand{dprob}, square, Operand{q}, ag.qkv_stride(), dkp,
                              ag.qkv_stride(), ag.count);
  }
}

// ---- units -----------------------------------------------------------------------------------------------

void CudaGpt::forward_embed(cudaStream_t stream, std::span<const BufferView> p) {
  gpu::embedding_forward(stream, p[0].dtype, p[0].data, p[1].data, tokens_dev_, acts_.residual[0],
                         static_cast<int>(rows()), len_, config_.hidden);
}

void CudaGpt::forward_block(cudaStream_t stream, std::size_t unit, std::span<const BufferView> p) {
  const int r = static_cast<int>(rows());
  const int d = config_.hidden;
  const int f = config_.mlp_hidden();
  const DType pt = p[0].dtype;
  BlockActs& a = acts_.blocks[train() ? unit - 1 : 0];
  const float* in = acts_.residual[train() ? unit - 1 : (unit - 1) % 2];
  float* out = acts_.residual[train() ? unit : unit % 2];
  gpu::layernorm_forward(stream, pt, in, p[kLn1Weight].data, p[kLn1Bias].data, a.ln1, a.ln1_stat, r, d);
  gpu::bias_rows(stream, pt, a.qkv, p[kQkvBias].data, nullptr, r, 3 * d);
  linear_forward(stream, a.ln1, p[kQkvWeight], a.qkv, d, 3 * d, 1.0f);
  attention_forward(stream, a, pt);
  gpu::bias_rows(stream, pt, a.res1, p[kAttnProjBias].data, in, r, d);  // residual + bias, then += att W^T
  linear_forward(stream, a.att, p[kAttnProjWeight], a.res1, d, d, 1.0f);
  gpu::layernorm_forward(stream, pt, a.res1, p[kLn2Weight].data, p[kLn2Bias].data, a.ln2, a.ln2_stat, r, d);
  gpu::bias_rows(stream, pt, a.fc, p[kFcBias].data, nullptr, r, f);
  linear_forward(stream, a.ln2, p[kFcWeight], a.fc, d, f, 1.0f);
  gpu::gelu_forward(stream, a.fc, a.gelu, rows() * sz(f));
  gpu::bias_rows(stream, pt, out, p[kMlpProjBias].data, a.res1, r, d);
  linear_forward(stream, a.gelu, p[kMlpProjWeight], out, f, d, 1.0f);
}

void CudaGpt::forward_head(cudaStream_t stream, std::span<const BufferView> p) {
  const int r = static_cast<int>(rows());
  const std::size_t layers = sz(config_.layers);
  const float* in = acts_.residual[train() ? layers : layers % 2];
  gpu::layernorm_forward(stream, p[kLnfWeight].dtype, in, p[kLnfWeight].data, p[kLnfBias].data, acts_.lnf,
                         acts_.lnf_stat, r, config_.hidden);
  linear_forward(stream, acts_.lnf, p[kLmHeadWeight], acts_.logits, config_.hidden, config_.vocab_size, 0.0f);
  gpu::cross_entropy_forward(stream, acts_.logits, targets_dev_, acts_.lse, acts_.losses, acts_.loss, r,
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
  void* dlogits = w.dtype == DType::f32 ? static_cast<void*>(acts_.logits) : operands_b_.data();
  gpu::cross_entropy_backward(stream, w.dtype, acts_.logits, acts_.lse, targets_dev_, dlogits, r, vocab,
                              seed_scale / static_cast<float>(r));
  linear_backward(stream, acts_.lnf, w, Operand{dlogits, w.dtype}, nullptr, acts_.dnarrow, g[kLmHeadWeight], nullptr, d,
                  vocab);
  ZERO3_CUDA_CHECK(cudaMemsetAsync(acts_.dresidual, 0, rows() * sz(d) * sizeof(float), stream));
  gpu::layernorm_backward(stream, p[kLnfWeight].dtype, g[kLnfWeight].dtype, acts_.residual[sz(config_.layers)],
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
  const BlockActs& a = acts_.blocks[unit - 1];
  const float* in = acts_.residual[unit - 1];
  float* dres = acts_.dresidual;  // dL/d(block output) now; dL/d(block input) when done
  auto dy_operand = [&](const float* dy, int out, DType w_dtype) {
    return operand(dy, rows() * sz(out), w_dtype, operands_b_.data(), stream);
  };
  // MLP branch: out = res1 + proj(gelu(fc(ln2(res1)))).
  const BufferView& mlp_proj = p[kMlpProjWeight];
  linear_backward(stream, a.gelu, mlp_proj, dy_operand(dres, d, mlp_proj.dtype), dres, acts_.dwide, g[kMlpProjWeight],
                  &g[kMlpProjBias], f, d);
  gpu::gelu_backward(stream, a.fc, acts_.dwide, acts_.dwide, rows() * sz(f));
  const BufferView& fc = p[kFcWeight];
  linear_backward(stream, a.ln2, fc, dy_operand(acts_.dwide, f, fc.dtype), acts_.dwide, acts_.dnarrow, g[kFcWeight],
                  &g[kFcBias], d, f);
  gpu::layernorm_backward(stream, pt, gt, a.res1, p[kLn2Weight].data, a.ln2_stat, acts_.dnarrow, dres,
                          g[kLn2Weight].data, g[kLn2Bias].data, r, d);
  // Attention branch: res1 = in + proj(attention(qkv(ln1(in)))).
  const BufferView& attn_proj = p[kAttnProjWeight];
  linear_backward(stream, a.att, attn_proj, dy_operand(dres, d, attn_proj.dtype), dres, acts_.dnarrow,
                  g[kAttnProjWeight], &g[kAttnProjBias], d, d);
  attention_backward(stream, a, pt);
  const BufferView& qkv = p[kQkvWeight];
  linear_backward(stream, a.ln1, qkv, dy_operand(acts_.dqkv, 3 * d, qkv.dtype), acts_.dqkv, acts_.dnarrow,
                  g[kQkvWeight], &g[kQkvBias], d, 3 * d);
  gpu::layernorm_backward(stream, pt, gt, in, p[kLn1Weight].data, a.ln1_stat, acts_.dnarrow, dres, g[kLn1Weight].data,
                          g[kLn1Bias].data, r, d);
}

void CudaGpt::backward_embed(cudaStream_t stream, std::span<const BufferView> g) {
  gpu::embedding_backward(stream, g[0].dtype, acts_.dresidual, token_rows_, g[0].data, g[1].data, batch_, len_,
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
