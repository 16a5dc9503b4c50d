// A test helper: the logits of the host Llama for one token sequence, from a Hugging Face model directory,
// without the engine, for tests/mpi/hf_llama_test.py to compare element by element with its float64 numpy
// forward. The shape comes through zero3's own config path (hf_config), the weights through the safetensors
// reader, whole tensors.
// usage: llama_logits MODEL_DIR TOKENS(comma-separated) OUT   (OUT: len x vocab float32, little endian)
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "zero3/ckpt/safetensors.hpp"
#include "zero3/config/parse.hpp"
#include "zero3/models/llama.hpp"
#include "zero3/models/model_factory.hpp"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: llama_logits MODEL_DIR TOKENS OUT\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    std::vector<std::int32_t> tokens;
    std::stringstream list(argv[2]);
    for (std::string id; std::getline(list, id, ',');) tokens.push_back(std::stoi(id));
    const auto len = static_cast<int>(tokens.size());
    const std::string text = R"({"train_batch_size": 1, "zero_optimization": {"stage": 3},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.001}},
        "zero3": {"model": {"type": "llama", "hf_config": ")" +
                             dir + R"(/config.json", "seq_len": )" + std::to_string(len) + "}}}";
    const zero3::config::Config cfg = zero3::config::load_config_text_or_throw(text);
    const zero3::models::LlamaConfig c = zero3::models::llama_config(*cfg.zero3.model);

    const auto ckpt = zero3::ckpt::SafetensorsCheckpoint::open(dir);
    const std::vector<zero3::UnitSpec> units = zero3::models::llama_units(c);
    std::vector<std::vector<std::vector<float>>> values;
    for (const zero3::UnitSpec& unit : units) {
      auto& u = values.emplace_back();
      for (const zero3::ParamSpec& p : unit.params) {
        std::vector<float>& v = u.emplace_back(p.numel());
        ckpt.read(p.name, 0, v);
      }
    }
    zero3::models::LlamaModel<float> model(c);
    std::vector<std::int32_t> targets(tokens.size(), 0);
    model.set_batch(tokens, targets, 1, len, zero3::models::Pass::eval);
    for (std::size_t u = 0; u < units.size(); ++u) {
      std::vector<const float*> ptrs;  // the unit's params, then those of the units it borrows (tied weights)
      for (const std::size_t visited : zero3::visit_units(units, u)) {
        for (const auto& v : values[visited]) ptrs.push_back(v.data());
      }
      model.forward_unit(u, ptrs);
    }
    std::ofstream out(argv[3], std::ios::binary);
    out.write(reinterpret_cast<const char*>(model.logits().data()),
              static_cast<std::streamsize>(model.logits().size() * sizeof(float)));
    return out ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "llama_logits: %s\n", e.what());
    return 1;
  }
}
