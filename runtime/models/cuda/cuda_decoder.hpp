// What the CUDA decoder models (the GPT of gpt_cuda.cpp, the Llama of llama_cuda.cpp) share: the UnitModel
// calling contract (call order, view checks, one stream per pass), the batch staged through pinned memory
// with its rows grouped by token for a deterministic embedding backward, the fp32 arena a model carves into
// named views per pass, 16-bit operand and fp32 weight-gradient scratch, and the two layers whose device
// code is architecture-free: the linear layer on cuBLAS and tiled causal attention over a packed qkv
// [rows, 3 heads head_dim]. A derived model declares its views and sizes and computes its units; one host
// thread drives a model, and every call enqueues its work on the stream it is given.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cuda_resources.hpp"
#include "embedding.cuh"
#include "gemm.hpp"
#include "kept_inputs_cuda.hpp"
#include "zero3/models/unit_model.hpp"

namespace zero3::models::gpu {

// One attention layer's tensors: q, k, v of every head side by side per row, the rows' log-sum-exp
// [batch, heads, len] (flash_attention.cuh), the heads' outputs [rows, heads head_dim].
struct AttentionTensors {
  const float* qkv = nullptr;
  float* lse = nullptr;
  float* att = nullptr;
  int heads = 0;
  int head_dim = 0;
};

class CudaDecoder : public UnitModel {
 public:
  ~CudaDecoder() override;
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  const std::vector<UnitSpec>& units() const final { return units_; }
  std::string describe() const final { return description_; }
  void set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch, int len,
                 Pass pass) final;
  void forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) final;
  double loss(Stream& stream) final;
  void backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                     float seed_scale, Stream& stream) final;
  std::size_t activation_bytes() const override;
  MemoryKind activation_memory() const final { return MemoryKind::device; }
  // Every mode: a derived model carves per recompute() and repeats its forward's kernels in backward.
  bool can_recompute(Recompute /*mode*/) const final { return true; }
  // Between passes; takes effect at the next set_batch (which carves the arena for it).
  void set_recompute(Recompute mode) final;
  // cpu_checkpointing with Recompute::full (kept_inputs_cuda.hpp): the layers' inputs take turns in two
  // buffers, those a later layer overwrites go to pinned memory on a copy stream and come back one layer ahead.
  bool can_offload_kept_inputs() const final { return true; }
  void set_offload_kept_inputs(bool on) final;
  KeptInputsOffload take_kept_inputs_offload() final;
  std::size_t planned_offloaded_bytes(const ActivationShape& shape) const final;

 protected:
  // Element counts of the scratch the current pass needs when weights (grads) are 16-bit: the widest
  // activation operand x and output gradient dy of a linear layer, and the largest weight matrix.
  struct ScratchSizes {
    std::size_t operand_a = 0;
    std::size_t operand_b = 0;
    std::size_t weight_grad = 0;
  };

  // `name` opens every error message ("CUDA GPT"); `views[u]` are the params (and grads) unit u takes, in
  // order, by name and element count; `units` what units() reports. Throws ConfigError for a device that
  // is not a CUDA device. Blocking: creates the cuBLAS handle and events.
  CudaDecoder(std::string name, Device& device, std::vector<UnitSpec> units, std::vector<std::vector<ParamSpec>> views,
              int vocab_size, int seq_len);

  // The residual stream's buffer for unit u's output (residual_slot) and its width (hidden size).
  virtual float* residual_stream(std::size_t u) = 0;
  virtual int hidden_size() const = 0;
  // The model's part, called with the model's device current and the cuBLAS handle on `stream`.
  // carve: the arena of the current pass from `base` (null: only count), returns the floats it uses.
  virtual std::size_t carve(float* base) = 0;
  virtual ScratchSizes scratch_sizes() const = 0;
  // The mean loss the head's forward writes (a double in the arena).
  virtual const double* device_loss() const = 0;
  // Unit 0 runs after the arena is carved and the batch uploaded on `stream`.
  virtual void forward(std::size_t unit, std::span<const BufferView> params, cudaStream_t stream) = 0;
  virtual void backward(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                        float seed_scale, cudaStream_t stream) = 0;

  void set_description(std::string description) { description_ = std::move(description); }
  const std::string& name() const { return name_; }
  std::size_t num_units() const { return units_.size(); }
  std::size_t rows() const { return static_cast<std::size_t>(batch_) * static_cast<std::size_t>(len_); }
  int batch() const { return batch_; }
  int len() const { return len_; }
  bool train() const { return pass_ == Pass::train; }
  Recompute recompute() const { return recompute_; }
  bool offload_kept_inputs() const { return copier_ != nullptr; }
  // Where the residual stream's unit-u output lives in this pass (u = layers: the head's input): a train pass
  // keeps one buffer per unit, or three when offloaded (two taking turns and the head's); eval two in turn.
  std::size_t residual_slot(std::size_t u) const;
  // The residual buffers a pass carves.
  static std::size_t residual_buffers(bool train, bool offload, int layers) {
    return !train ? 2 : offload ? 3 : static_cast<std::size_t>(layers) + 1;
  }
  const std::int32_t* tokens_dev() const { return tokens_dev_; }
  const std::int32_t* targets_dev() const { return targets_dev_; }
  const TokenRows& token_rows() const { return token_rows_; }
  void* output_grad_scratch() const { return operands_b_.data(); }  // the 16-bit dy operands (dlogits)

  // Waits for every call enqueued so far; grows `array` (device memory) to `size_bytes` when smaller.
  void wait_idle();
  void ensure(CudaArray& array, std::size_t size_bytes);
  // For destructors: waits for the model's last call and frees `arrays` with the model's device current;
  // never throws (the trainer may have destroyed the Device and its streams already).
  void release(std::initializer_list<CudaArray*> arrays) noexcept;

  // x rounded to `dtype` into `scratch` (or x itself for f32), as a GEMM operand.
  Operand operand(const float* x, std::size_t count, DType dtype, void* scratch, cudaStream_t stream) const;
  // dy of a linear layer with `out` outputs as its weight's GEMM operand (rounded into the dy scratch).
  Operand dy_operand(const float* dy, int out, DType w_dtype, cudaStream_t stream) const;
  // y[rows, out] = x[rows, in] W^T + beta y.
  void linear_forward(cudaStream_t stream, const float* x, const BufferView& w, float* y, int in, int out,
                      float beta) const;
  // dx = dy W, or dx += dy W with accumulate_dx (skipped when dx is null); dW += dy^T x; dbias += column sums
  // of dy_f32 (when dbias is set).
  void linear_backward(cudaStream_t stream, const float* x, const BufferView& w, Operand dy, const float* dy_f32,
                       float* dx, const BufferView& dw, const BufferView* dbias, int in, int out,
                       bool accumulate_dx = false) const;
  // att = softmax_causal(Q K^T / sqrt(head_dim)) V per (sequence, head), tiled without a len x len matrix
  // (flash_attention.cuh); lse kept for the backward. fp32 in every mode.
  void attention_forward(cudaStream_t stream, const AttentionTensors& t) const;
  // dqkv [rows, 3 heads head_dim] (written) from datt; delta is scratch of [batch, heads, len].
  void attention_backward(cudaStream_t stream, const AttentionTensors& t, const float* datt, float* dqkv,
                          float* delta) const;

 private:
  std::string unit_name(std::size_t unit) const;
  void check_views(const char* what, std::size_t unit, std::span<const BufferView> views, const char* kind) const;
  cudaStream_t bind_stream(Stream& stream, const char* what);
  void prepare_pass();
  void ensure_scratch(DType weight_dtype, DType grad_dtype, bool backward);
  void upload_batch(cudaStream_t stream);

  std::string name_;
  std::vector<UnitSpec> units_;
  std::vector<std::vector<ParamSpec>> views_;
  std::string description_;
  int vocab_size_ = 0;
  int seq_len_ = 0;
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
  Recompute recompute_ = Recompute::none;
  std::unique_ptr<KeptInputsCopier> copier_;  // cpu_checkpointing only

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
  TokenRows token_rows_;
  const std::int32_t* tokens_dev_ = nullptr;
  const std::int32_t* targets_dev_ = nullptr;
};

}  // namespace zero3::models::gpu
