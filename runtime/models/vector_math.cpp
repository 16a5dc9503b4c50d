// tanh_f32, exp_f32 and round_to_bf16 with an AVX-512 path chosen at run time (target attribute: the file needs no -m
// flags).
#include "vector_math.hpp"

#include <cmath>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics start from a self-initialized _mm512_undefined_*() that -W(maybe-)uninitialized
// flags once inlined (GCC bug 105593, fixed in GCC 13): not this file's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define ZERO3_VMATH_X86 1
#endif

namespace zero3::models::vmath {
namespace {

// The sum of 16 lanes, pairwise in a fixed order.
double pairwise16(const double* lane) {
  double half[8];
  for (int l = 0; l < 8; ++l) half[l] = lane[l] + lane[l + 8];
  return ((half[0] + half[1]) + (half[2] + half[3])) + ((half[4] + half[5]) + (half[6] + half[7]));
}

#if defined(ZERO3_VMATH_X86)

__attribute__((target("avx512f"))) __m512 exp_avx512(__m512 x) {
  // Past these, exp(x) is above FLT_MAX or below half the least subnormal: clamping keeps k finite (and
  // -Inf from making r a NaN) without changing any result. max_ps and min_ps return their second operand
  // when either is NaN: x goes second, so a NaN stays a NaN.
  x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-104.0f), x));
  // exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in two parts (|r| <= ln 2 / 2).
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428606765330187e-06f), r);
  // Taylor to r^7: the r^8 term is below 6e-9 relative on |r| <= 0.347.
  __m512 p = _mm512_set1_ps(1.0f / 5040.0f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // p * 2^k, exact while the result is a normal float, rounded once into the subnormals below that.
  return _mm512_scalef_ps(p, k);
}

__attribute__((target("avx512f"))) __m512 tanh_avx512(__m512 x) {
  // Bit operations on the integer view: the float forms need AVX512DQ.
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512i xi = _mm512_castps_si512(x);
  // |x| capped at 10, where tanh rounds to 1 in fp32 (and exp(2|x|) stays finite). min_ps returns its
  // second operand when either is NaN: |x| goes second, so a NaN stays a NaN.
  const __m512 a = _mm512_min_ps(_mm512_set1_ps(10.0f), _mm512_castsi512_ps(_mm512_andnot_si512(sign_mask, xi)));
  // Small |x|: tanh a = a + a^3 (-1/3 + a^2 (2/15 + a^2 (-17/315 + a^2 (62/2835 + a^2 (-1382/155925
  // + a^2 21844/6081075))))); the first omitted term is below 1e-7 relative for a < 0.5.
  const __m512 a2 = _mm512_mul_ps(a, a);
  __m512 q = _mm512_set1_ps(21844.0f / 6081075.0f);
  q = _mm512_fmadd_ps(q, a2, _mm512_set1_ps(-1382.0f / 155925.0f));
  q = _mm512_fmadd_ps(q, a2, _mm512_set1_ps(62.0f / 2835.0f));
  q = _mm512_fmadd_ps(q, a2, _mm512_set1_ps(-17.0f / 315.0f));
  q = _mm512_fmadd_ps(q, a2, _mm512_set1_ps(2.0f / 15.0f));
  q = _mm512_fmadd_ps(q, a2, _mm512_set1_ps(-1.0f / 3.0f));
  const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(q, a2), a, a);
  // Larger |x|: 1 - 2 / (exp(2a) + 1), no cancellation worse than a factor of 2 from a = 0.5 on.
  const __m512 e = exp_avx512(_mm512_add_ps(a, a));
  const __m512 large =
      _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_div_ps(_mm512_set1_ps(2.0f), _mm512_add_ps(e, _mm512_set1_ps(1.0f))));
  const __mmask16 is_small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.5f), _CMP_LT_OQ);
  const __m512 t = _mm512_mask_blend_ps(is_small, large, small);
  return _mm512_castsi512_ps(  // tanh is odd
      _mm512_or_si512(_mm512_castps_si512(t), _mm512_and_si512(xi, sign_mask)));
}

// y[i] = F(x[i]) over 16 floats at a time, the tail through a masked load and store.
template <__m512 (*F)(__m512)>
__attribute__((target("avx512f"))) void map_avx512(const float* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, F(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, F(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

// float_to_bf16 on 16 lanes of the integer view, each result in the low half of its lane:
// (u + 0x7fff + lsb) >> 16 rounds to nearest even (a carry out of the significand steps the exponent, up
// to Inf); a NaN keeps its top bits with the quiet bit set.
__attribute__((target("avx512f"))) __m512i bf16_lanes(__m512i u) {
  const __m512i high = _mm512_srli_epi32(u, 16);
  const __m512i lsb = _mm512_and_si512(high, _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet = _mm512_or_si512(high, _mm512_set1_epi32(0x40));
  const __mmask16 nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_mask_blend_epi32(nan, rounded, quiet);
}

__attribute__((target("avx512f"))) void round_to_bf16_avx512(const float* x, bf16_t* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i),
                        _mm512_cvtepi32_epi16(bf16_lanes(_mm512_loadu_si512(x + i))));
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_cvtepi32_storeu_epi16(y + i, m, bf16_lanes(_mm512_maskz_loadu_epi32(m, x + i)));
  }
}

__attribute__((target("avx512f"))) float max_avx512(const float* x, std::size_t n) {
  __m512 m = _mm512_set1_ps(-INFINITY);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) m = _mm512_max_ps(m, _mm512_loadu_ps(x + i));
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + i));
  }
  return _mm512_reduce_max_ps(m);
}

// Adds lanes 0-7 of e to low and 8-15 to high, in double.
__attribute__((target("avx512f"))) void add_lanes(__m512 e, __m512d& low, __m512d& high) {
  low = _mm512_add_pd(low, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
  high = _mm512_add_pd(high, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
}

// Lanes 0-7 of the sum in `low`, 8-15 in `high`, as the scalar path's lane i % 16.
__attribute__((target("avx512f"))) double exp_shifted_sum_avx512(const float* x, float* y, std::size_t n, float shift) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512d low = _mm512_setzero_pd();
  __m512d high = _mm512_setzero_pd();
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 e = exp_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), s));
    _mm512_storeu_ps(y + i, e);
    add_lanes(e, low, high);
  }
  if (i < n) {
    const __mmask16 k = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 e = _mm512_maskz_mov_ps(k, exp_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), s)));
    _mm512_mask_storeu_ps(y + i, k, e);
    add_lanes(e, low, high);
  }
  alignas(64) double lane[16];
  _mm512_store_pd(lane, low);
  _mm512_store_pd(lane + 8, high);
  return pairwise16(lane);
}

bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

#endif

}  // namespace

void tanh_f32(const float* x, float* y, std::size_t n) {
#if defined(ZERO3_VMATH_X86)
  if (has_avx512()) {
    map_avx512<tanh_avx512>(x, y, n);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

void exp_f32(const float* x, float* y, std::size_t n) {
#if defined(ZERO3_VMATH_X86)
  if (has_avx512()) {
    map_avx512<exp_avx512>(x, y, n);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

float max_f32(const float* x, std::size_t n) {
#if defined(ZERO3_VMATH_X86)
  if (has_avx512()) return max_avx512(x, n);
#endif
  float m = -INFINITY;
  for (std::size_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

double exp_shifted_sum_f32(const float* x, float* y, std::size_t n, float shift) {
#if defined(ZERO3_VMATH_X86)
  if (has_avx512()) return exp_shifted_sum_avx512(x, y, n, shift);
#endif
  double lane[16] = {};
  for (std::size_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - shift);
    lane[i % 16] += y[i];
  }
  return pairwise16(lane);
}

void round_to_bf16(const float* x, bf16_t* y, std::size_t n) {
#if defined(ZERO3_VMATH_X86)
  if (has_avx512()) {
    round_to_bf16_avx512(x, y, n);
    return;
  }
#endif
  for (std::size_t i = 0; i < n; ++i) y[i] = float_to_bf16(x[i]);
}

}  // namespace zero3::models::vmath
