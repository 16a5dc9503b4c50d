#include "zero3/config/model_types.hpp"

#include <algorithm>
#include <iterator>

#include "zero3/core/error.hpp"

namespace zero3::config {

namespace {

// The first row is the default type.
constexpr ModelTypeSpec kModelTypes[] = {
    {ModelType::gpt, "gpt", /*sequence_model=*/true, /*heads_divide_hidden=*/true, /*decoder_options=*/false},
    {ModelType::mlp, "mlp", /*sequence_model=*/false, /*heads_divide_hidden=*/false, /*decoder_options=*/false},
    {ModelType::llama, "llama", /*sequence_model=*/true, /*heads_divide_hidden=*/false, /*decoder_options=*/true},
};

}  // namespace

std::span<const ModelTypeSpec> model_types() {
  return kModelTypes;
}

const ModelTypeSpec* find_model_type(std::string_view name) {
  const auto* it = std::find_if(std::begin(kModelTypes), std::end(kModelTypes),
                                [&](const ModelTypeSpec& s) { return s.name == name; });
  return it == std::end(kModelTypes) ? nullptr : it;
}

const ModelTypeSpec& model_type_spec(ModelType type) {
  for (const ModelTypeSpec& s : kModelTypes) {
    if (s.type == type) return s;
  }
  throw UsageError("a model type without a row in the model type table");
}

std::string_view to_string(ModelType v) {
  return model_type_spec(v).name;
}

}  // namespace zero3::config
