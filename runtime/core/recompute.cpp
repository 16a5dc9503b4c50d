#include "zero3/core/recompute.hpp"

namespace zero3 {

std::string_view to_string(Recompute mode) {
  switch (mode) {
    case Recompute::none:
      return "none";
    case Recompute::full:
      return "full";
    case Recompute::selective:
      return "selective";
  }
  return "?";
}

std::optional<Recompute> parse_recompute(std::string_view text) {
  for (Recompute mode : {Recompute::none, Recompute::full, Recompute::selective}) {
    if (to_string(mode) == text) return mode;
  }
  return std::nullopt;
}

}  // namespace zero3
