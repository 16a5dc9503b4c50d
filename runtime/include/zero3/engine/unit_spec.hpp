// What a trainer declares to the engine (Engine::add_unit): units, their params, and how each param's
// initial values are made.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace zero3 {

// How a param's initial values are made. Every element's value comes from a counter-based RNG keyed by
// (seed, param name, element index), so the model is identical for every world size and each rank
// materializes only the elements it keeps.
struct ParamInit {
  enum class Kind { normal, uniform, constant, custom };
  Kind kind = Kind::constant;
  double a = 0.0;  // normal: mean; uniform: low; constant: value
  double b = 0.0;  // normal: std; uniform: high
  // custom: fill out[i] with the value of flat (row-major) element `first + i` of the param.
  std::function<void(std::uint64_t first, std::span<float> out)> fill;

  static ParamInit normal(double std, double mean = 0.0) { return {Kind::normal, mean, std, {}}; }
  static ParamInit uniform(double low, double high) { return {Kind::uniform, low, high, {}}; }
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
};

}  // namespace zero3
