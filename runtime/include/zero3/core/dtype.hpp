// Element types the runtime stores and communicates: fp32, fp16 (IEEE binary16) and bf16.
// Conversions round to nearest, ties to even, and keep NaN a NaN and Inf an Inf (a NaN payload is
// quieted, never rounded into Inf). Header-only and usable from host and device code alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace zero3 {

enum class DType : std::uint8_t { f32 = 0, f16 = 1, bf16 = 2 };

inline constexpr std::size_t size_of(DType t) {
  return t == DType::f32 ? 4 : 2;
}

inline constexpr std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "fp32";
    case DType::f16:
      return "fp16";
    case DType::bf16:
      return "bf16";
  }
  return "?";
}

// Accepts the DeepSpeed spellings: fp32/float32/float, fp16/float16/half, bf16/bfloat16 (and torch.* forms).
std::optional<DType> parse_dtype(std::string_view name);

// 16-bit storage types: plain bit patterns, so they are trivially copyable and layout-compatible with
// __half / __nv_bfloat16 on the device.
struct bf16_t {
  std::uint16_t bits;
};
struct fp16_t {
  std::uint16_t bits;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline bf16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {  // NaN: keep sign, force a quiet NaN
    return {static_cast<std::uint16_t>((u >> 16) | 0x0040u)};
  }
  std::uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;  // round to nearest even; overflow carries into Inf as IEEE requires
  return {static_cast<std::uint16_t>(u >> 16)};
}

inline float bf16_to_float(bf16_t h) {
  return bits_float(static_cast<std::uint32_t>(h.bits) << 16);
}

inline fp16_t float_to_fp16(float f) {
  std::uint32_t u = float_bits(f);
  std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return {static_cast<std::uint16_t>(sign | 0x7e00u)};   // NaN -> quiet NaN
  if (abs >= 0x477ff000u) return {static_cast<std::uint16_t>(sign | 0x7c00u)};  // >= 65520 rounds to Inf
  if (abs < 0x38800000u) {
    // Result is subnormal or zero in fp16: value = m * 2^-24, m = round(abs_value * 2^24).
    // Adding 0.5f shifts the mantissa into place and lets the FPU do the round-to-even.
    float a = bits_float(abs);
    float r = a + 0.5f;  // 0.5 = 2^-1 has ulp 2^-24, exactly fp16's subnormal step
    std::uint32_t rb = float_bits(r) - float_bits(0.5f);
    return {static_cast<std::uint16_t>(sign | rb)};
  }
  // Normal range: rebias exponent (127 -> 15) and round 23 mantissa bits down to 10, ties to even.
  std::uint32_t lsb = (abs >> 13) & 1u;
  abs += 0xfffu + lsb;
  abs -= (127u - 15u) << 23;
  return {static_cast<std::uint16_t>(sign | (abs >> 13))};
}

inline float fp16_to_float(fp16_t h) {
  std::uint32_t sign = static_cast<std::uint32_t>(h.bits & 0x8000u) << 16;
  std::uint32_t exp = (h.bits >> 10) & 0x1fu;
  std::uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (man << 13));  // Inf / NaN
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in fp32
    float v = static_cast<float>(man) * bits_float(0x33800000u);  // 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 127u - 15u) << 23) | (man << 13));
}

// The fp32 value of a stored element, overloaded per storage type, for loops templated on it.
inline float to_float(float v) {
  return v;
}
inline float to_float(bf16_t v) {
  return bf16_to_float(v);
}
inline float to_float(fp16_t v) {
  return fp16_to_float(v);
}

// Round-trip helpers by dtype tag, for code that handles all three types uniformly.
inline float load_as_float(const void* p, DType t, std::size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(p)[i];
    case DType::f16:
      return fp16_to_float(static_cast<const fp16_t*>(p)[i]);
    case DType::bf16:
      return bf16_to_float(static_cast<const bf16_t*>(p)[i]);
  }
  return 0.0f;
}
inline void store_from_float(void* p, DType t, std::size_t i, float v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(p)[i] = v;
      break;
    case DType::f16:
      static_cast<fp16_t*>(p)[i] = float_to_fp16(v);
      break;
    case DType::bf16:
      static_cast<bf16_t*>(p)[i] = float_to_bf16(v);
      break;
  }
}

}  // namespace zero3
