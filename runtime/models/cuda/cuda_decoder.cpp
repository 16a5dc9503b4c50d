// The shared calling contract and layers of the CUDA decoders (cuda_decoder.hpp). Buffers are reused in
// stream order; before one is freed or regrown the host waits for the event recorded after the model's last
// call, and before the pinned batch staging is rewritten, for the event recorded after its upload.
#include "cuda_decoder.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "cast.cuh"  // zero3::kernels::gpu::launch_cast (kernels/cuda_common)
#include "flash_attention.cuh"
#include "linear_aux.cuh"
#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models::gpu {
namespace {

std::size_t sz(int v) {
  return static_cast<std::size_t>(v);
}

}  // namespace

CudaDecoder::CudaDecoder(std::string name, Device& device, std::vector<UnitSpec> units,
                         std::vector<std::vector<ParamSpec>> views, int vocab_size, int seq_len)
    : name_(std::move(name)),
      units_(std::move(units)),
      views_(std::move(views)),
      vocab_size_(vocab_size),
      seq_len_(seq_len),
      device_(&device) {
  if (device.kind() != DeviceKind::cuda) {
    throw ConfigError(fmt::format("zero3.device: the {} needs a cuda device, got a {} device ({})", name_,
                                  device_kind_name(device.kind()), device.description()));
  }
  const std::optional<std::string> pci = device.pci_bus_id();
  if (!pci) throw ConfigError(fmt::format("zero3.device: {} reports no PCI bus id", device.description()));
  ZERO3_CUDA_CHECK(cudaDeviceGetByPCIBusId(&ordinal_, pci->c_str()));
  DeviceGuard guard(ordinal_);
  done_.emplace();
  uploaded_.emplace();
  cublas_.emplace();
  loss_host_ = CudaArray(sizeof(double), CudaArray::Kind::pinned);
}

CudaDecoder::~CudaDecoder() {
  release({&staging_, &loss_host_, &batch_words_, &arena_, &operands_a_, &operands_b_, &weight_grad_});
  try {
    DeviceGuard guard(ordinal_);
    copier_.reset();
    cublas_.reset();
  } catch (...) {  // DeviceGuard failed: the members' own destructors still free what they hold
  }
}

void CudaDecoder::release(std::initializer_list<CudaArray*> arrays) noexcept {
  try {
    DeviceGuard guard(ordinal_);
    ZERO3_CUDA_CHECK_NOTHROW(cudaEventSynchronize(done_->get()));
    ZERO3_CUDA_CHECK_NOTHROW(cudaEventSynchronize(uploaded_->get()));
    for (CudaArray* a : arrays) a->reset();
  } catch (...) {  // DeviceGuard failed: the arrays' own destructors still free what they hold
  }
}

// ---- checks ----------------------------------------------------------------------------------------------

std::string CudaDecoder::unit_name(std::size_t unit) const {
  return unit < units_.size() ? fmt::format("unit {} ({})", unit, units_[unit].name) : fmt::format("unit {}", unit);
}

void CudaDecoder::check_views(const char* what, std::size_t unit, std::span<const BufferView> views,
                              const char* kind) const {
  const std::vector<ParamSpec>& specs = views_[unit];
  if (views.size() != specs.size()) {
    throw UsageError(
        fmt::format("{} {}: {} takes {} {}s, got {}", name_, what, unit_name(unit), specs.size(), kind, views.size()));
  }
  for (std::size_t k = 0; k < views.size(); ++k) {
    const BufferView& v = views[k];
    if (v.count != specs[k].numel() || v.data == nullptr) {
      throw UsageError(fmt::format("{} {}: {} {} '{}' has {} elements at {}, expected {}", name_, what, unit_name(unit),
                                   kind, specs[k].name, v.count, v.data, specs[k].numel()));
    }
    if (v.kind != MemoryKind::device) {
      throw UsageError(fmt::format("{} {}: {} {} '{}' is in {} memory; the model computes on device memory", name_,
                                   what, unit_name(unit), kind, specs[k].name, memory_kind_name(v.kind)));
    }
    if (v.dtype != views[0].dtype) {
      throw UsageError(fmt::format("{} {}: {} {}s mix dtypes ('{}' is {}, '{}' is {})", name_, what, unit_name(unit),
                                   kind, specs[0].name, dtype_name(views[0].dtype), specs[k].name,
                                   dtype_name(v.dtype)));
    }
  }
}

cudaStream_t CudaDecoder::bind_stream(Stream& stream, const char* what) {
  if (&stream.device() != device_) {
    throw UsageError(fmt::format("{} {}: stream '{}' belongs to another device ({})", name_, what, stream.name(),
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

void CudaDecoder::wait_idle() {
  ZERO3_CUDA_CHECK(cudaEventSynchronize(done_->get()));
}

void CudaDecoder::ensure(CudaArray& array, std::size_t size_bytes) {
  if (array.size_bytes() >= size_bytes) return;
  wait_idle();  // earlier calls may still read the old buffer
  array.reset();
  array = CudaArray(size_bytes, CudaArray::Kind::device);
}

void CudaDecoder::set_recompute(Recompute mode) {
  if (next_backward_ != 0) {
    throw UsageError(fmt::format("{} set_recompute: called between a train pass's forward and its backward", name_));
  }
  recompute_ = mode;
  batch_set_ = false;  // the arena of the last set_batch was carved for the old mode: set_batch again
}

void CudaDecoder::set_offload_kept_inputs(bool on) {
  if (next_backward_ != 0) {
    throw UsageError(
        fmt::format("{} set_offload_kept_inputs: called between a train pass's forward and its backward", name_));
  }
  if (on && recompute_ != Recompute::full) {
    throw UsageError(
        fmt::format("{}: cpu_checkpointing offloads the inputs full recomputation keeps, and the model "
                    "recomputes \"{}\" (zero3.model.activation_checkpointing \"full\")",
                    name_, to_string(recompute_)));
  }
  if (on == offload_kept_inputs()) return;
  DeviceGuard guard(ordinal_);
  wait_idle();
  copier_ = on ? std::make_unique<KeptInputsCopier>() : nullptr;
  batch_set_ = false;  // the arena of the last set_batch was carved for the old layout: set_batch again
}

UnitModel::KeptInputsOffload CudaDecoder::take_kept_inputs_offload() {
  if (!copier_) return {};
  DeviceGuard guard(ordinal_);
  return {.host_bytes = copier_->host_bytes(), .exposed_copy_ms = copier_->take_exposed_ms()};
}

std::size_t CudaDecoder::planned_offloaded_bytes(const ActivationShape& shape) const {
  if (!shape.offload_kept_inputs) return 0;
  const std::size_t layers = num_units() - 2;  // the inputs a later layer overwrites: 0 .. layers - 3
  return (layers >= 3 ? layers - 2 : 0) * sz(shape.micro_batch) * sz(shape.len) * sz(hidden_size()) * sizeof(float);
}

std::size_t CudaDecoder::residual_slot(std::size_t u) const {
  if (!train()) return u % 2;
  if (!copier_) return u;
  return u == num_units() - 2 ? 2 : u % 2;
}

void CudaDecoder::prepare_pass() {
  ensure(arena_, carve(nullptr) * sizeof(float));
  carve(arena_.as<float>());
  ensure(batch_words_, staged_words_ * sizeof(std::int32_t));
}

void CudaDecoder::ensure_scratch(DType weight_dtype, DType grad_dtype, bool backward) {
  const ScratchSizes sizes = scratch_sizes();
  if (weight_dtype != DType::f32) {
    ensure(operands_a_, sizes.operand_a * size_of(weight_dtype));
    if (backward) ensure(operands_b_, sizes.operand_b * size_of(weight_dtype));
  }
  if (backward && grad_dtype != DType::f32) ensure(weight_grad_, sizes.weight_grad * sizeof(float));
}

void CudaDecoder::upload_batch(cudaStream_t stream) {
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

std::size_t CudaDecoder::activation_bytes() const {
  std::size_t total = 0;
  for (const CudaArray* a : {&batch_words_, &arena_, &operands_a_, &operands_b_, &weight_grad_}) {
    total += a->size_bytes();
  }
  return total;
}

// ---- calls -----------------------------------------------------------------------------------------------

void CudaDecoder::set_batch(std::span<const std::int32_t> tokens, std::span<const std::int32_t> targets, int batch,
                            int len, Pass pass) {
  if (batch < 0 || (batch == 0 && pass == Pass::train)) {
    throw UsageError(fmt::format("{} set_batch: batch must be >= 1 (0 only for an eval pass), got {} for a {} pass",
                                 name_, batch, pass == Pass::train ? "train" : "eval"));
  }
  if (batch > 0 && (len < 1 || len > seq_len_)) {
    throw UsageError(
        fmt::format("{} set_batch: len must be in [1, zero3.model.seq_len = {}], got {}", name_, seq_len_, len));
  }
  const std::size_t r = batch > 0 ? sz(batch) * sz(len) : 0;
  if (tokens.size() != r || targets.size() != r) {
    throw UsageError(fmt::format("{} set_batch: tokens ({}) and targets ({}) must hold batch * len = {} ids", name_,
                                 tokens.size(), targets.size(), r));
  }
  for (std::size_t i = 0; i < r; ++i) {
    for (const auto& [ids, what] : {std::pair{tokens, "tokens"}, std::pair{targets, "targets"}}) {
      if (ids[i] < 0 || ids[i] >= vocab_size_) {
        throw UsageError(
            fmt::format("{} set_batch: {}[{}] (sequence {}, position {}) = {} is outside the vocabulary [0, {})", name_,
                        what, i, i / sz(len), i % sz(len), ids[i], vocab_size_));
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

void CudaDecoder::forward_unit(std::size_t unit, std::span<const BufferView> params, Stream& stream) {
  if (!batch_set_ || unit != next_forward_ || unit >= num_units()) {
    throw UsageError(
        fmt::format("{} forward_unit: {} called, but {}", name_, unit_name(unit),
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
      if (copier_ && train()) copier_->prepare(num_units() - 2, rows() * sz(hidden_size()));
    } else {
      ensure_scratch(params[0].dtype, DType::f32, false);  // a unit's params share one dtype (check_views)
    }
    const bool layer = unit > 0 && !head;
    if (layer && copier_ && train()) copier_->before_forward(unit, s);
    forward(unit, params, s);
    if (layer && copier_ && train()) copier_->after_forward(unit, residual_stream(unit - 1), s);
    ZERO3_CUDA_CHECK(cudaEventRecord(done_->get(), s));
  }
  ++next_forward_;
  if (head) {
    loss_ready_ = true;
    if (train()) next_backward_ = num_units();
  }
}

double CudaDecoder::loss(Stream& stream) {
  if (!loss_ready_) {
    throw UsageError(
        fmt::format("{} loss: the head's forward has not run since set_batch (run every unit's forward first)", name_));
  }
  if (empty_) return 0.0;
  DeviceGuard guard(ordinal_);
  const cudaStream_t s = bind_stream(stream, "loss");
  ZERO3_CUDA_CHECK(cudaMemcpyAsync(loss_host_.data(), device_loss(), sizeof(double), cudaMemcpyDeviceToHost, s));
  stream.synchronize();
  return *loss_host_.as<const double>();
}

void CudaDecoder::backward_unit(std::size_t unit, std::span<const BufferView> params, std::span<const BufferView> grads,
                                float seed_scale, Stream& stream) {
  if (!batch_set_ || !train()) {
    throw UsageError(fmt::format("{} backward_unit: {} called {}", name_, unit_name(unit),
                                 batch_set_ ? "after an eval pass (set_batch with Pass::train)" : "before set_batch"));
  }
  if (next_backward_ == 0 || unit + 1 != next_backward_) {
    throw UsageError(fmt::format("{} backward_unit: {} called, but {} (units run in reverse order after every forward)",
                                 name_, unit_name(unit),
                                 next_backward_ == 0 ? std::string("no backward is due")
                                                     : fmt::format("{} is next", unit_name(next_backward_ - 1))));
  }
  check_views("backward_unit", unit, params, "param");
  check_views("backward_unit", unit, grads, "gradient");
  DeviceGuard guard(ordinal_);
  const cudaStream_t s = bind_stream(stream, "backward_unit");
  if (unit != 0) ensure_scratch(params[0].dtype, grads[0].dtype, true);
  if (copier_ && unit > 0 && unit + 1 < num_units()) {
    copier_->before_backward(unit, unit >= 2 ? residual_stream(unit - 2) : nullptr, s);
  }
  backward(unit, params, grads, seed_scale, s);
  ZERO3_CUDA_CHECK(cudaEventRecord(done_->get(), s));
  --next_backward_;
}

// ---- layers ----------------------------------------------------------------------------------------------

Operand CudaDecoder::operand(const float* x, std::size_t count, DType dtype, void* scratch, cudaStream_t stream) const {
  if (dtype == DType::f32) return {x, DType::f32};
  if (count > 0) {
    kernels::gpu::launch_cast(stream, BufferView{scratch, count, dtype, MemoryKind::device},
                              ConstBufferView{x, count, DType::f32, MemoryKind::device});
  }
  return {scratch, dtype};
}

Operand CudaDecoder::dy_operand(const float* dy, int out, DType w_dtype, cudaStream_t stream) const {
  return operand(dy, rows() * sz(out), w_dtype, operands_b_.data(), stream);
}

void CudaDecoder::linear_forward(cudaStream_t stream, const float* x, const BufferView& w, float* y, int in, int out,
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
  gemm(cublas_->get(), g, xo, Operand{w.data, w.dtype}, y);
}

void CudaDecoder::linear_backward(cudaStream_t stream, const float* x, const BufferView& w, Operand dy,
                                  const float* dy_f32, float* dx, const BufferView& dw, const BufferView* dbias, int in,
                                  int out, bool accumulate_dx) const {
  const int r = static_cast<int>(rows());
  if (dx != nullptr) {  // dx[rows, in] = dy[rows, out] W[out, in] (+ dx)
    GemmArgs g;
    g.m = r;
    g.n = in;
    g.k = out;
    g.beta = accumulate_dx ? 1.0f : 0.0f;
    g.lda = out;
    g.ldb = in;
    g.ldc = in;
    gemm(cublas_->get(), g, dy, Operand{w.data, w.dtype}, dx);
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
  gemm(cublas_->get(), g, dy, xo, direct ? dw.as<float>() : weight_grad_.as<float>());
  if (!direct) add_into(stream, dw.dtype, dw.data, weight_grad_.as<const float>(), sz(out) * sz(in));
  if (dbias != nullptr) bias_grad(stream, dbias->dtype, dy_f32, dbias->data, r, out);
}

void CudaDecoder::attention_forward(cudaStream_t stream, const AttentionTensors& t) const {
  flash_attention_forward(stream, t.qkv, t.lse, t.att, batch_, len_, t.heads, t.head_dim);
}

void CudaDecoder::attention_backward(cudaStream_t stream, const AttentionTensors& t, const float* datt, float* dqkv,
                                     float* delta) const {
  flash_attention_backward(stream, t.qkv, t.att, t.lse, datt, dqkv, delta, batch_, len_, t.heads, t.head_dim);
}

}  // namespace zero3::models::gpu
