// Activation checkpointing: what a model keeps from a unit's forward for its backward, and what it computes
// again there instead. Read from "zero3.model.activation_checkpointing" (config.hpp) and handed to a model
// (UnitModel::set_recompute), so both sides name the modes with this one enum.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace zero3 {

enum class Recompute : std::uint8_t {
  none,       // every intermediate of every unit is kept from forward to backward
  full,       // only each unit's input is kept; its forward runs again inside its backward
  selective,  // the outputs of matrix products and attention are kept; norms and activations run again
};

// "none", "full", "selective".
std::string_view to_string(Recompute mode);
// The mode a spelling names; nullopt for anything else.
std::optional<Recompute> parse_recompute(std::string_view text);

}  // namespace zero3
