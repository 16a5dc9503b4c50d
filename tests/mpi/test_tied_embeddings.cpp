// A Llama whose lm_head is its embedding (UnitSpec::borrows), trained through the engine at world sizes
// 1-4: after one micro-batch every param's accumulated gradient equals the float64 model's over the same
// params and tokens, the embedding's being the sum of its two uses (the lookup and the output layer), with
// the engine's in-place path at world size 1 and without it. The reference adds the two uses' gradients
// itself; the engine gets there by reducing the embedding's gradient buffers of the head's visit and of its
// own into one accumulator. Every rank trains on the same tokens, so the average over ranks is the model's
// gradient.
#include <fmt/format.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "mpi_test_env.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/core/rng.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/model_factory.hpp"
#include "zero3/train/unit_trainer.hpp"

using namespace zero3;

namespace {

test::MpiTestEnv& env() {
  return test::mpi_env();
}

constexpr int kMicroBatch = 3;

config::Config tied_config(bool in_place) {
  const int n = env().world.size;
  const std::string text = fmt::format(
      R"({{"train_batch_size": {}, "train_micro_batch_size_per_gpu": {},
          "optimizer": {{"type": "AdamW", "params": {{"lr": 0.001}}}},
          "zero_optimization": {{"stage": 3, "stage3_param_persistence_threshold": 0}},
          "zero3": {{"seed": 11, "device": "host", "single_rank_in_place": {},
                    "model": {{"type": "llama", "layers": 2, "hidden_size": 16, "heads": 4, "kv_heads": 2,
                              "intermediate_size": 24, "vocab_size": 40, "seq_len": 6,
                              "tie_word_embeddings": true}}}}}})",
      kMicroBatch * n, kMicroBatch, in_place ? "true" : "false");
  config::ParseOptions o;
  o.world_size = n;
  o.world_size_source = "test";
  return config::load_config_text_or_throw(text, o);
}

using Tensors = std::vector<std::vector<std::vector<double>>>;  // [unit][param][element]

// The float64 model's gradients of every unit's own params, each borrowed param's share of a visit added
// to its owner's.
Tensors reference_gradients(const models::LlamaConfig& c, const std::vector<UnitSpec>& units, const Tensors& params,
                            const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& targets,
                            double& loss) {
  models::LlamaModel<double> model(c);
  const auto views = [&](std::size_t u) {
    std::vector<const double*> out;
    for (const std::size_t v : visit_units(units, u)) {
      for (const auto& p : params[v]) out.push_back(p.data());
    }
    return out;
  };
  model.set_batch(tokens, targets, kMicroBatch, c.seq_len);
  for (std::size_t u = 0; u < units.size(); ++u) model.forward_unit(u, views(u));
  loss = model.loss();
  Tensors grads;
  for (const auto& unit : params) {
    auto& g = grads.emplace_back();
    for (const auto& p : unit) g.emplace_back(p.size(), 0.0);
  }
  for (std::size_t u = units.size(); u-- > 0;) {
    const std::vector<std::size_t> visit = visit_units(units, u);
    Tensors share;  // this visit's gradients, by visited unit
    std::vector<double*> out;
    for (const std::size_t v : visit) {
      auto& s = share.emplace_back();
      for (const auto& p : params[v]) out.push_back(s.emplace_back(p.size(), 0.0).data());
    }
    model.backward_unit(u, views(u), out, 1.0);
    for (std::size_t i = 0; i < visit.size(); ++i) {
      for (std::size_t k = 0; k < share[i].size(); ++k) {
        for (std::size_t e = 0; e < share[i][k].size(); ++e) grads[visit[i]][k][e] += share[i][k][e];
      }
    }
  }
  return grads;
}

}  // namespace

TEST_CASE("a tied embedding's gradient through the engine is the sum of its two uses", "[train][tied]") {
  for (const bool in_place : {true, false}) {
    const config::Config cfg = tied_config(in_place);
    const config::ModelSettings& ms = *cfg.zero3.model;
    const models::LlamaConfig lc = models::llama_config(ms);
    train::UnitTrainer trainer(cfg, env().world, env().bootstrap,
                               [&](Device& d) { return models::make_train_model(ms, d); },
                               {.eval_batch = 0,
                                .len = static_cast<int>(ms.seq_len),
                                .device_memory_bytes = std::nullopt,
                                .checkpoint_staging_bytes = 0});
    Engine& engine = trainer.engine();
    const std::vector<UnitSpec> units = models::llama_units(lc);

    // One param, not two: the head declares only its norm and borrows the embedding.
    CHECK(engine.unit_params("head").size() == 1);
    CHECK(engine.unit_params("embed").size() == 1);

    Tensors params;
    for (const UnitSpec& u : units) {
      auto& values = params.emplace_back();
      for (const ParamSpec& p : u.params) {
        const std::vector<float> v = engine.gather_tensor(p.name, TensorKind::param);
        values.emplace_back(v.begin(), v.end());
      }
    }
    const CounterRng rng(19, hash_name("test_tied_embeddings.batch"));
    std::vector<std::int32_t> tokens;
    std::vector<std::int32_t> targets;
    const auto vocab = static_cast<std::uint64_t>(lc.vocab_size);
    for (std::uint64_t i = 0; i < static_cast<std::uint64_t>(kMicroBatch * lc.seq_len); ++i) {
      tokens.push_back(static_cast<std::int32_t>(rng.bits(i, 0) % vocab));
      targets.push_back(static_cast<std::int32_t>(rng.bits(i, 1) % vocab));
    }
    const double loss = trainer.micro_batch(tokens, targets, kMicroBatch, lc.seq_len);
    double ref_loss = 0;
    const Tensors ref = reference_gradients(lc, units, params, tokens, targets, ref_loss);
    std::vector<std::string> lines;
    std::vector<std::pair<double, double>> errors;  // (max |grad - reference|, max |reference|) per param
    for (std::size_t u = 0; u < units.size(); ++u) {
      for (std::size_t k = 0; k < units[u].params.size(); ++k) {
        const std::string& name = units[u].params[k].name;
        const std::vector<float> g = engine.gather_tensor(name, TensorKind::grad);
        double err = 0;
        double scale = 0;
        for (std::size_t e = 0; e < g.size(); ++e) {
          err = std::max(err, std::fabs(static_cast<double>(g[e]) - ref[u][k][e]));
          scale = std::max(scale, std::fabs(ref[u][k][e]));
        }
        errors.emplace_back(err, scale);
        lines.push_back(fmt::format("{}: max |grad - float64| {:.3e} of max |grad| {:.3e}", name, err, scale));
      }
    }
    INFO(fmt::format("[np{}] in place {}: loss {} (float64 {})", env().world.size, in_place, loss, ref_loss));
    CHECK(std::fabs(loss - ref_loss) <= 1e-5 * std::fabs(ref_loss));
    for (std::size_t i = 0; i < errors.size(); ++i) {
      INFO(lines[i]);
      CHECK(errors[i].second > 0.0);
      CHECK(errors[i].first <= 1e-5 * errors[i].second);
    }
    // Without the head's share the embedding's gradient would be the lookup's alone: far from the sum.
    if (env().world.rank == 0) {
      fmt::print("[np{}] in place {}: {}\n", env().world.size, in_place, lines.front());
      std::fflush(stdout);
    }
    trainer.step();
  }
}
