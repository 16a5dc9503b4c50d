// Model sizes at the edges of what their types hold: param counts counted from one block equal the sum over
// every declared unit, and are computed for layer counts no memory could declare; a width, a count or an
// activation plan that would overflow is a ConfigError naming the quantity; a model past all memory is
// refused before it declares a unit.
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <limits>

#include "zero3/config/config.hpp"
#include "zero3/core/error.hpp"
#include "zero3/models/gpt.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/mlp.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/unit_trainer.hpp"

namespace {

using zero3::ConfigError;
using zero3::config::ModelSettings;
using zero3::config::ModelType;
namespace models = zero3::models;

constexpr int kIntMax = std::numeric_limits<int>::max();

std::size_t sum_over_units(const std::vector<zero3::UnitSpec>& units) {
  std::size_t total = 0;
  for (const auto& u : units) {
    for (const auto& p : u.params) total += p.numel();
  }
  return total;
}

ModelSettings gpt_settings(std::int64_t layers, std::int64_t hidden) {
  ModelSettings m;
  m.type = ModelType::gpt;
  m.layers = layers;
  m.hidden_size = hidden;
  m.heads = 4;
  m.vocab_size = 64;
  m.seq_len = 32;
  return m;
}

}  // namespace

TEST_CASE("param counts from one block equal the sum over every unit", "[models][sizes]") {
  for (int layers : {1, 2, 5}) {
    INFO("layers " << layers);
    const models::GptConfig gpt{.vocab_size = 50, .seq_len = 7, .layers = layers, .hidden = 24, .heads = 3};
    CHECK(models::gpt_num_params(gpt) == sum_over_units(models::gpt_units(gpt)));
    const models::MlpConfig mlp{.vocab_size = 11, .context = 3, .layers = layers, .hidden = 5};
    CHECK(models::mlp_num_params(mlp) == sum_over_units(models::mlp_units(mlp)));
    for (bool tied : {false, true}) {
      models::LlamaConfig llama;
      llama.vocab_size = 40;
      llama.seq_len = 8;
      llama.layers = layers;
      llama.hidden = 16;
      llama.heads = 4;
      llama.kv_heads = 2;
      llama.intermediate = 24;
      llama.qkv_bias = true;
      llama.o_bias = !tied;
      llama.tie_word_embeddings = tied;
      CHECK(models::llama_num_params(llama) == sum_over_units(models::llama_units(llama)));
    }
  }
}

TEST_CASE("a layer count no memory could declare is counted, not built", "[models][sizes]") {
  const auto start = std::chrono::steady_clock::now();
  const ModelSettings huge = gpt_settings(100'000'000, 64);
  const std::size_t one = models::train_model_params(gpt_settings(1, 64));
  const std::size_t two = models::train_model_params(gpt_settings(2, 64));
  CHECK(models::train_model_params(huge) == one + (two - one) * 99'999'999);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
}

TEST_CASE("a size set in code past an int is refused by key, not wrapped", "[models][sizes]") {
  CHECK_THROWS_MATCHES(models::validate_train_model(gpt_settings(4294967297LL, 64)), ConfigError,
                       Catch::Message("zero3.model.layers: 4294967297 is out of range (-2147483648 .. 2147483647, a "
                                      "32-bit integer)"));
  CHECK_THROWS_AS(models::train_model_params(gpt_settings(2, 4294967360LL)), ConfigError);
}

TEST_CASE("a width past an int is refused naming it", "[models][sizes]") {
  // 4 x 2^30 is the GPT's MLP width.
  CHECK_THROWS_WITH(
      models::validate(models::GptConfig{.vocab_size = 8, .seq_len = 8, .layers = 1, .hidden = 1 << 30, .heads = 4}),
      Catch::Contains("the MLP's width"));
  models::LlamaConfig llama;
  llama.vocab_size = 8;
  llama.seq_len = 8;
  llama.layers = 1;
  llama.hidden = 64;
  llama.heads = 1 << 16;
  llama.head_dim = 1 << 16;
  llama.intermediate = 8;
  CHECK_THROWS_WITH(models::validate(llama), Catch::Contains("the query width"));
  CHECK_THROWS_WITH(
      models::validate(models::MlpConfig{.vocab_size = 8, .context = 1 << 16, .layers = 1, .hidden = 1 << 16}),
      Catch::Contains("the first layer's input width"));
}

TEST_CASE("a param count past 64 bits is refused naming it", "[models][sizes]") {
  // 2^31 - 1 layers of ~ 12 x (2^28)^2 elements each.
  const ModelSettings m = gpt_settings(kIntMax, 1 << 28);
  CHECK_THROWS_AS(models::train_model_params(m), ConfigError);
}

TEST_CASE("an activation plan past 64 bits is refused, not wrapped", "[models][sizes]") {
  const models::GptModel<float> gpt(
      models::GptConfig{.vocab_size = 8, .seq_len = kIntMax, .layers = 4, .hidden = 1 << 20, .heads = 4});
  CHECK_THROWS_WITH(gpt.planned_activation_bytes(kIntMax, 0, kIntMax, false, zero3::Recompute::none, false),
                    Catch::Contains("a buffer of the activations"));
}

TEST_CASE("a model past all memory is refused before its units are declared", "[models][sizes][memory]") {
  const zero3::config::Config config;
  CHECK_NOTHROW(zero3::train::check_model_size(config, 1, 1, 1'000'000, 10, std::nullopt));
  CHECK_NOTHROW(zero3::train::check_model_size(config, 1, 1, 0, 0, std::nullopt));
  CHECK_THROWS_WITH(zero3::train::check_model_size(config, 1, 1, 5'000'000'000'000, 100'000'002, std::nullopt),
                    Catch::Contains("memory: the model does not fit"));
  // A shard of 2^62 params: its bytes overflow before any comparison.
  CHECK_THROWS_WITH(zero3::train::check_model_size(config, 1, 1, std::uint64_t{1} << 63, 3, std::nullopt),
                    Catch::Contains("the fp32 master weights of a rank's shard"));
}
