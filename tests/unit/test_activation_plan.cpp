// UnitModel::planned_activation_bytes against activation_bytes() of the host GPT and MLP (through their
// UnitModel adapters, as the trainer drives them) after the passes a job runs: train micro-batches, a
// held-out pass of another size (larger or smaller, or none), and train again; fp32 and bf16 params. The
// plan must be the count exactly: the memory plan's activations category is this number.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <memory>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/mlp.hpp"

using namespace zero3;
using models::UnitModel;

namespace {

// Every unit's params (small values) and gradient buffers in `dtype`, on the host device.
struct UnitBuffers {
  std::vector<std::vector<Buffer>> params;
  std::vector<std::vector<Buffer>> grads;
};

UnitBuffers make_buffers(Device& device, const UnitModel& model, DType dtype) {
  UnitBuffers b;
  for (const UnitSpec& u : model.units()) {
    b.params.emplace_back();
    b.grads.emplace_back();
    for (const ParamSpec& p : u.params) {
      Buffer w = device.allocate(p.numel(), dtype, MemoryKind::device, MemCategory::param_gathered);
      for (std::size_t i = 0; i < p.numel(); ++i)
        store_from_float(w.data(), dtype, i, 0.01f * static_cast<float>(i % 7));
      b.params.back().push_back(std::move(w));
      b.grads.back().push_back(device.allocate(p.numel(), dtype, MemoryKind::device, MemCategory::grad_buffer));
    }
  }
  return b;
}

std::vector<BufferView> views(std::vector<Buffer>& buffers) {
  std::vector<BufferView> v;
  for (Buffer& b : buffers) v.push_back(b.view());
  return v;
}

void pass(UnitModel& model, UnitBuffers& b, Stream& stream, int batch, int len, int vocab, bool train) {
  const std::size_t n = static_cast<std::size_t>(batch) * static_cast<std::size_t>(len);
  std::vector<std::int32_t> tokens(n);
  std::vector<std::int32_t> targets(n);
  for (std::size_t i = 0; i < n; ++i) {
    tokens[i] = static_cast<std::int32_t>(i % static_cast<std::size_t>(vocab));
    targets[i] = static_cast<std::int32_t>((i + 1) % static_cast<std::size_t>(vocab));
  }
  model.set_batch(tokens, targets, batch, len, train ? models::Pass::train : models::Pass::eval);
  for (std::size_t u = 0; u < model.units().size(); ++u) model.forward_unit(u, views(b.params[u]), stream);
  if (!train) return;
  for (std::size_t u = model.units().size(); u-- > 0;) {
    model.backward_unit(u, views(b.params[u]), views(b.grads[u]), 1.0f, stream);
  }
}

void check(UnitModel& model, int len, int vocab, int micro, int eval, DType dtype) {
  const std::unique_ptr<Device> device = make_host_device();
  const std::unique_ptr<Stream> stream = device->create_stream("test");
  UnitBuffers b = make_buffers(*device, model, dtype);
  pass(model, b, *stream, micro, len, vocab, true);
  if (eval > 0) pass(model, b, *stream, eval, len, vocab, false);
  pass(model, b, *stream, micro, len, vocab, true);
  const std::size_t planned =
      model.planned_activation_bytes({.micro_batch = micro, .eval_batch = eval, .len = len, .params = dtype});
  INFO(fmt::format("{}: micro-batch {}, held-out {}, {} params: planned {} bytes, held {}", model.describe(), micro,
                   eval, dtype_name(dtype), planned, model.activation_bytes()));
  CHECK(planned == model.activation_bytes());
}

}  // namespace

TEST_CASE("the GPT's planned activations are the bytes it holds after a job's passes", "[models][plan]") {
  models::GptConfig c;
  c.vocab_size = 96;
  c.seq_len = 16;
  c.layers = 3;
  c.hidden = 64;
  c.heads = 4;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [micro, eval] : std::vector<std::pair<int, int>>{{4, 0}, {4, 6}, {4, 24}, {8, 3}, {2, 2}}) {
      const std::unique_ptr<UnitModel> model = models::make_host_gpt(c);
      check(*model, c.seq_len, c.vocab_size, micro, eval, dtype);
    }
  }
}

TEST_CASE("the MLP's planned activations are the bytes it holds after a job's passes", "[models][plan]") {
  models::MlpConfig c;
  c.vocab_size = 48;
  c.context = 4;
  c.layers = 3;
  c.hidden = 96;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [micro, eval] : std::vector<std::pair<int, int>>{{4, 0}, {4, 6}, {8, 3}, {2, 12}}) {
      const std::unique_ptr<UnitModel> model = models::make_host_mlp(c);
      check(*model, c.context, c.vocab_size, micro, eval, dtype);
    }
  }
}
