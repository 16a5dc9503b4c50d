// What a trainer declares to the engine (Engine::add_unit) and a model computes unit by unit: units, their
// params, and how each param's initial values are made. Below the engine (target zero3_units), so that models
// and planners describe their units without linking the engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero3 {

// A field that an aggregate's designated initializer must name: it has no default, so leaving it out does
// not compile (`ParamInit::normal({.mean = 0.0})` is an error, not a std of 0).
template <typename T>
struct Required {
  Required(T v) : value(v) {}  // NOLINT(google-explicit-constructor): `.std = 0.02` converts implicitly
  T value;
};

// How a param's initial values are made. Every element's value comes from a counter-based RNG keyed by
// (seed, param name, element index), so the model is identical for every world size and each rank
// materializes only the elements it keeps.
//
// The arguments are named, so their order cannot be confused (PyTorch's normal_ takes (mean, std)):
//   ParamInit::normal({.std = 0.02})                // mean 0
//   ParamInit::normal({.mean = 1.0, .std = 0.02})
//   ParamInit::uniform({.low = -0.1, .high = 0.1})
// Engine::add_unit throws UsageError naming the param for a negative or non-finite std, low > high, or
// non-finite values.
struct ParamInit {
  struct Normal {  // NOLINT(cppcoreguidelines-pro-type-member-init): std has no default, by design
    double mean = 0.0;
    Required<double> std;  // no default: must be named
  };
  struct Uniform {
    Required<double> low;
    Required<double> high;
  };

  enum class Kind { normal, uniform, constant, custom };
  Kind kind = Kind::constant;
  // The stored arguments (set by the factories below): normal: a = mean, b = std; uniform: a = low,
  // b = high; constant: a = value.
  double a = 0.0;
  double b = 0.0;
  // custom: fill out[i] with the value of flat (row-major) element `first + i` of the param.
  std::function<void(std::uint64_t first, std::span<float> out)> fill;

  static ParamInit normal(Normal args) { return {Kind::normal, args.mean, args.std.value, {}}; }
  static ParamInit uniform(Uniform args) { return {Kind::uniform, args.low.value, args.high.value, {}}; }
  static ParamInit zeros() { return {Kind::constant, 0.0, 0.0, {}}; }
  static ParamInit ones() { return {Kind::constant, 1.0, 0.0, {}}; }
  static ParamInit constant(double v) { return {Kind::constant, v, 0.0, {}}; }
  static ParamInit custom(std::function<void(std::uint64_t, std::span<float>)> f) {
    return {Kind::custom, 0.0, 0.0, std::move(f)};
  }
};

struct ParamSpec {
  std::string name;                 // unique in the model, e.g. "layers.3.attn.qkv.weight"
  std::vector<std::int64_t> shape;  // row-major; an empty shape is a scalar, a 0 extent a zero-size param
  ParamInit init = ParamInit::zeros();
  bool trainable = true;     // frozen params: sharded and gathered, but no gradient and no optimizer state
  bool weight_decay = true;  // false for biases and norms
  double lr_scale = 1.0;     // multiplies the scheduled lr for this param

  std::size_t numel() const;
};

struct UnitSpec {
  std::string name;  // unique, e.g. "layers.3"
  std::vector<ParamSpec> params;
  // Units declared before this one whose params this unit also reads: tied weights, such as an output
  // layer that is the input embedding. Each param keeps one shard, one master copy and one optimizer
  // state. A unit walk (zero3/train/unit_walk.hpp) gathers the borrowed units with this one and hands
  // their params after its own, and in backward their gradient buffers after its own; each of those
  // reduces into the borrowed unit's accumulators, so the step applies the sum over every use.
  std::vector<std::string> borrows = {};
};

// The units a visit of units[unit] reaches: `unit` itself, then those it borrows, as indices into `units`.
// UsageError naming both for a borrowed name that is not among them.
std::vector<std::size_t> visit_units(std::span<const UnitSpec> units, std::size_t unit);

}  // namespace zero3
