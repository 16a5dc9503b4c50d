#include "zero3/units/unit_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "zero3/core/error.hpp"

namespace zero3 {

std::vector<std::size_t> visit_units(std::span<const UnitSpec> units, std::size_t unit) {
  if (unit >= units.size()) throw UsageError(fmt::format("visit_units: unit {} of {}", unit, units.size()));
  std::vector<std::size_t> out = {unit};
  for (const std::string& name : units[unit].borrows) {
    const auto it = std::find_if(units.begin(), units.end(), [&](const UnitSpec& u) { return u.name == name; });
    if (it == units.end()) {
      throw UsageError(
          fmt::format("unit '{}' borrows unit '{}', which is not among the units", units[unit].name, name));
    }
    out.push_back(static_cast<std::size_t>(it - units.begin()));
  }
  return out;
}

std::size_t ParamSpec::numel() const {
  std::size_t n = 1;
  for (const std::int64_t extent : shape) {
    if (extent < 0) {
      throw UsageError(fmt::format("param '{}' has a negative extent ({}) in its shape", name, extent));
    }
    const auto e = static_cast<std::size_t>(extent);
    if (e != 0 && n > std::numeric_limits<std::size_t>::max() / e) {
      throw UsageError(fmt::format("param '{}': the element count of its shape overflows", name));
    }
    n *= e;
  }
  return n;
}

}  // namespace zero3
