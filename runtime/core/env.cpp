#include "zero3/core/env.hpp"

#include <algorithm>
#include <cstdlib>

#include "zero3/core/error.hpp"

namespace zero3::env {

std::optional<std::string> get(std::string_view name) {
  const bool declared =
      std::any_of(kVariables.begin(), kVariables.end(), [&](const Variable& v) { return v.name == name; });
  if (!declared) throw UsageError("env::get: " + std::string(name) + " is not declared in zero3/core/env.hpp");
  const char* value = std::getenv(std::string(name).c_str());  // NOLINT(concurrency-mt-unsafe): zero3 never writes it
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

}  // namespace zero3::env
