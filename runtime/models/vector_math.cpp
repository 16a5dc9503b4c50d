// tanh_f32 with an AVX-512 path chosen at run time (target attribute: the file needs no -m flags).
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

void tanh_scalar(const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
}

#if defined(ZERO3_VMATH_X86)

__attribute__((target("avx512f"))) __m512 exp_avx512(__m512 x) {
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
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
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

__attribute__((target("avx512f"))) void tanh_avx512_span(const float* x, float* y, std::size_t n) {
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, tanh_avx512(_mm512_loadu_ps(x + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m, tanh_avx512(_mm512_maskz_loadu_ps(m, x + i)));
  }
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
    tanh_avx512_span(x, y, n);
    return;
  }
#endif
  tanh_scalar(x, y, n);
}

}  // namespace zero3::models::vmath
