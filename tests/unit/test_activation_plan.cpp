// UnitModel::planned_activation_bytes against activation_bytes() of the host GPT, Llama and MLP (through their
// UnitModel adapters, as the trainer drives them) after the passes a job runs: train micro-batches, a
// held-out pass of another size (larger or smaller, or none), and train again; fp32 and bf16 params; each
// activation checkpointing mode the model offers, and full recomputation with the kept inputs in host memory
// (cpu_checkpointing). The plan must be the count exactly: the memory plan's activations category is this
// number (and the host store's, planned_offloaded_bytes). And the checkpointing modes' gradients, offloaded or
// not, are bitwise those of none.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/llama.hpp"
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
      for (std::size_t i = 0; i < p.numel(); ++i) {
        // Values in [-0.05, 0.05) that vary from element to element without a short period.
        const auto hash = static_cast<float>((i * 2654435761u + p.numel()) % 1000u);
        store_from_float(w.data(), dtype, i, 1e-4f * hash - 0.05f);
      }
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

void check(UnitModel& model, int len, int vocab, int micro, int eval, DType dtype,
           Recompute recompute = Recompute::none, bool offload = false) {
  const std::unique_ptr<Device> device = make_host_device();
  const std::unique_ptr<Stream> stream = device->create_stream("test");
  UnitBuffers b = make_buffers(*device, model, dtype);
  model.set_recompute(recompute);
  model.set_offload_kept_inputs(offload);
  pass(model, b, *stream, micro, len, vocab, true);
  if (eval > 0) pass(model, b, *stream, eval, len, vocab, false);
  pass(model, b, *stream, micro, len, vocab, true);
  const UnitModel::ActivationShape shape{.micro_batch = micro,
                                         .eval_batch = eval,
                                         .len = len,
                                         .params = dtype,
                                         .recompute = recompute,
                                         .offload_kept_inputs = offload};
  const std::size_t planned = model.planned_activation_bytes(shape);
  const std::size_t host = model.take_kept_inputs_offload().host_bytes;
  INFO(
      fmt::format("{}: micro-batch {}, held-out {}, {} params, recompute {}{}: planned {} bytes, held {}; host "
                  "store planned {}, held {}",
                  model.describe(), micro, eval, dtype_name(dtype), to_string(recompute), offload ? " (offloaded)" : "",
                  planned, model.activation_bytes(), model.planned_offloaded_bytes(shape), host));
  CHECK(planned == model.activation_bytes());
  CHECK(model.planned_offloaded_bytes(shape) == host);
  if (!offload) CHECK(host == 0);
}

// Every checkpointing configuration a host model offers: none, full, selective, and full offloaded.
struct Mode {
  Recompute recompute;
  bool offload;
};
constexpr Mode kModes[] = {
    {Recompute::none, false}, {Recompute::full, false}, {Recompute::selective, false}, {Recompute::full, true}};

// One train pass's loss and every gradient's bytes, from zeroed gradient buffers.
struct PassResult {
  double loss = 0;
  std::vector<std::vector<std::byte>> grads;
};

PassResult train_pass(UnitModel& model, UnitBuffers& b, Stream& stream, int batch, int len, int vocab) {
  for (auto& unit : b.grads) {
    for (Buffer& g : unit) std::memset(g.data(), 0, g.size_bytes());
  }
  pass(model, b, stream, batch, len, vocab, true);
  PassResult r;
  r.loss = model.loss(stream);
  for (auto& unit : b.grads) {
    for (Buffer& g : unit) {
      const auto* bytes = static_cast<const std::byte*>(g.data());
      r.grads.emplace_back(bytes, bytes + g.size_bytes());
    }
  }
  return r;
}

// Each checkpointing mode against none on the same model, params and batch: the same loss and gradient bits.
void check_recompute_bitwise(UnitModel& model, int len, int vocab, DType dtype) {
  const std::unique_ptr<Device> device = make_host_device();
  const std::unique_ptr<Stream> stream = device->create_stream("test");
  UnitBuffers b = make_buffers(*device, model, dtype);
  model.set_recompute(Recompute::none);
  const PassResult stored = train_pass(model, b, *stream, 3, len, vocab);
  for (const Mode mode : kModes) {
    if (mode.recompute == Recompute::none) continue;
    REQUIRE(model.can_recompute(mode.recompute));
    REQUIRE(model.can_offload_kept_inputs());
    model.set_offload_kept_inputs(false);
    model.set_recompute(mode.recompute);
    model.set_offload_kept_inputs(mode.offload);
    const PassResult again = train_pass(model, b, *stream, 3, len, vocab);
    INFO(fmt::format("{}, {} params, recompute {}{}", model.describe(), dtype_name(dtype), to_string(mode.recompute),
                     mode.offload ? " (offloaded)" : ""));
    CHECK(std::memcmp(&again.loss, &stored.loss, sizeof(double)) == 0);
    REQUIRE(again.grads.size() == stored.grads.size());
    for (std::size_t k = 0; k < stored.grads.size(); ++k) {
      INFO("gradient " << k);
      CHECK(again.grads[k] == stored.grads[k]);
    }
  }
}

models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.vocab_size = 96;
  c.seq_len = 80;  // more than one attention tile
  c.layers = 2;
  c.hidden = 64;
  c.heads = 4;
  c.kv_heads = 2;
  c.intermediate = 96;
  return c;
}

}  // namespace

TEST_CASE("the GPT's planned activations are the bytes it holds after a job's passes", "[models][plan]") {
  models::GptConfig c;
  c.vocab_size = 96;
  c.seq_len = 16;
  c.hidden = 64;
  c.heads = 4;
  for (const int layers : {1, 3}) {  // one block: the offloaded layout's edge; three: one input moves
    c.layers = layers;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const auto& [micro, eval] : std::vector<std::pair<int, int>>{{4, 0}, {4, 6}, {4, 24}, {8, 3}, {2, 2}}) {
        for (const Mode mode : kModes) {
          const std::unique_ptr<UnitModel> model = models::make_host_gpt(c);
          check(*model, c.seq_len, c.vocab_size, micro, eval, dtype, mode.recompute, mode.offload);
        }
      }
    }
  }
}

TEST_CASE("the Llama's planned activations are the bytes it holds after a job's passes", "[models][plan]") {
  const models::LlamaConfig c = small_llama();
  for (const DType dtype : {DType::f32, DType::bf16}) {
    for (const auto& [micro, eval] : std::vector<std::pair<int, int>>{{2, 0}, {2, 3}, {3, 1}}) {
      for (const Mode mode : kModes) {
        const std::unique_ptr<UnitModel> model = models::make_host_llama(c);
        check(*model, c.seq_len, c.vocab_size, micro, eval, dtype, mode.recompute, mode.offload);
      }
    }
  }
}

TEST_CASE("recomputed and offloaded activations give bitwise the gradients of stored ones", "[models][recompute]") {
  // Layers enough that the offload has inputs to move (those a later unit overwrites).
  models::GptConfig gpt;
  gpt.vocab_size = 96;
  gpt.seq_len = 80;
  gpt.layers = 4;
  gpt.hidden = 64;
  gpt.heads = 4;
  for (const DType dtype : {DType::f32, DType::bf16}) {
    check_recompute_bitwise(*models::make_host_gpt(gpt), gpt.seq_len, gpt.vocab_size, dtype);
    models::LlamaConfig llama = small_llama();
    llama.layers = 4;
    check_recompute_bitwise(*models::make_host_llama(llama), llama.seq_len, llama.vocab_size, dtype);
    models::MlpConfig mlp;
    mlp.vocab_size = 48;
    mlp.context = 4;
    mlp.layers = 5;
    mlp.hidden = 96;
    check_recompute_bitwise(*models::make_host_mlp(mlp), mlp.context + 2, mlp.vocab_size, dtype);
  }
}

TEST_CASE("the MLP's planned activations are the bytes it holds after a job's passes", "[models][plan]") {
  models::MlpConfig c;
  c.vocab_size = 48;
  c.context = 4;
  c.hidden = 96;
  for (const int layers : {1, 2, 3, 5}) {  // the offloaded layout's buffers come into use at 2, 3 and 4 layers
    c.layers = layers;
    for (const DType dtype : {DType::f32, DType::bf16}) {
      for (const auto& [micro, eval] : std::vector<std::pair<int, int>>{{4, 0}, {4, 6}, {8, 3}, {2, 12}}) {
        for (const Mode mode : kModes) {
          const std::unique_ptr<UnitModel> model = models::make_host_mlp(c);
          check(*model, c.context, c.vocab_size, micro, eval, dtype, mode.recompute, mode.offload);
        }
      }
    }
  }
}
