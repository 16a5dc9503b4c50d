// zero3.model.hf_config: the shape of a Llama-family model read from a Hugging Face config.json
// (transformers' LlamaConfig, MistralConfig and Qwen2Config fields), for parse_model. Every problem is an
// error at zero3.model.hf_config naming the file and the field.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "parse_blocks.hpp"
#include "zero3/core/json_integer.hpp"

namespace zero3::config::detail {
namespace {

// The file's value of an optional field: nullptr when absent or null.
const Json* field(const Json& j, const char* name) {
  const auto it = j.find(name);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

}  // namespace

HfShape read_hf_config(ObjectReader& r, ModelSettings& m) {
  HfShape shape;
  const std::string& path = m.hf_config;
  bool ok = true;
  const auto fail = [&](const std::string& what) {
    r.error("hf_config", fmt::format("'{}': {}", path, what));
    ok = false;
    return HfShape{};
  };
  std::ifstream in(path);
  if (!in) return fail("cannot open the file");
  std::stringstream text;
  text << in.rdbuf();
  Json j;
  try {
    j = Json::parse(text.str());
  } catch (const Json::exception& e) {
    return fail(fmt::format("not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) return fail("not a JSON object");
  const Json* model_type = field(j, "model_type");
  if (model_type == nullptr || !model_type->is_string()) return fail("no \"model_type\" string");
  const std::string type = model_type->get<std::string>();
  if (type != "llama" && type != "mistral" && type != "qwen2") {
    return fail(fmt::format("model_type \"{}\": zero3 builds llama, mistral and qwen2 decoders", type));
  }
  const auto read_int = [&](const char* name, std::int64_t& out, const char* zero3_key, bool required) {
    const Json* v = field(j, name);
    if (v == nullptr) {
      if (required) fail(fmt::format("\"{}\" is missing", name));
      return;
    }
    // The zero3.model row's range, so that a size the model cannot hold is refused here, named by the file's key.
    const std::int64_t highest = int_highest(find_key(blocks::zero3_model, zero3_key)->type);
    const std::optional<std::int64_t> n = json_integer(*v);
    if (!n || *n < 1 || *n > highest) {
      fail(fmt::format("\"{}\" must be an integer in [1, {}], got {}", name, highest, v->dump()));
      return;
    }
    out = *n;
    shape.keys.insert(zero3_key);
  };
  read_int("num_hidden_layers", m.layers, "layers", true);
  read_int("hidden_size", m.hidden_size, "hidden_size", true);
  read_int("num_attention_heads", m.heads, "heads", true);
  read_int("vocab_size", m.vocab_size, "vocab_size", true);
  read_int("intermediate_size", m.intermediate_size, "intermediate_size", true);
  read_int("num_key_value_heads", m.kv_heads, "kv_heads", false);
  read_int("head_dim", m.head_dim, "head_dim", false);
  const auto read_number = [&](const Json* v, const char* name, double& out, const char* zero3_key) {
    if (v == nullptr) return;
    if (!v->is_number() || !(v->get<double>() > 0)) {
      fail(fmt::format("\"{}\" must be a positive number, got {}", name, v->dump()));
      return;
    }
    out = v->get<double>();
    shape.keys.insert(zero3_key);
  };
  read_number(field(j, "rms_norm_eps"), "rms_norm_eps", m.rms_norm_eps, "rms_norm_eps");
  read_number(field(j, "rope_theta"), "rope_theta", m.rope_theta, "rope_theta");
  // transformers 5 keeps the rotary settings in rope_parameters; only the default rotation is built.
  for (const char* name : {"rope_parameters", "rope_scaling"}) {
    const Json* rope = field(j, name);
    if (rope == nullptr) continue;
    const Json* rope_type = rope->is_object() ? field(*rope, "rope_type") : nullptr;
    if (rope_type == nullptr) rope_type = rope->is_object() ? field(*rope, "type") : nullptr;
    if (rope_type != nullptr && *rope_type != "default") {
      fail(fmt::format("\"{}\" of type {}: scaled rotary embeddings are not implemented", name, rope_type->dump()));
    }
    if (rope->is_object()) read_number(field(*rope, "rope_theta"), "rope_theta", m.rope_theta, "rope_theta");
  }
  const Json* act = field(j, "hidden_act");
  if (act != nullptr && *act != "silu") {
    fail(fmt::format("\"hidden_act\" {}: zero3's llama MLP is SwiGLU (silu)", act->dump()));
  }
  const auto flag = [&](const char* name) {
    const Json* v = field(j, name);
    if (v != nullptr && !v->is_boolean()) {
      fail(fmt::format("\"{}\" must be true or false, got {}", name, v->dump()));
      return false;
    }
    return v != nullptr && v->get<bool>();
  };
  if (flag("mlp_bias")) fail("\"mlp_bias\": true: biases in the MLP are not implemented");
  m.qkv_bias = type == "qwen2" || flag("attention_bias");
  m.o_bias = type != "qwen2" && flag("attention_bias");
  m.tie_word_embeddings = flag("tie_word_embeddings");
  shape.keys.insert({"qkv_bias", "o_bias", "tie_word_embeddings"});
  // Mistral attends within a sliding window; Qwen2 only when use_sliding_window is set.
  const Json* window = field(j, "sliding_window");
  if (window != nullptr && window->is_number_integer() && (type == "mistral" || flag("use_sliding_window"))) {
    shape.sliding_window = window->get<std::int64_t>();
  }
  return ok ? shape : HfShape{};
}

}  // namespace zero3::config::detail
