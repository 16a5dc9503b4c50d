// The AVX-512 path: 16 floats per vector, the loops of cpu_optimizer_paths.hpp over the operations
// below (16-bit master and state included). Compiled with -mavx512f/bw/vl/dq -mf16c and -ffp-contract=off
// (offload/CMakeLists.txt); only called when cpu_features.cpp found these extensions at run time. Every
// operation is the one correctly rounded IEEE fp32 operation of optim_math.hpp, and the 16-bit conversions
// give dtype.hpp's bits.
#include "cpu_optimizer_paths.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && defined(__F16C__)
#define ZERO3_OFFLOAD_AVX512 1
#include <immintrin.h>
// GCC 12's AVX-512 intrinsics start from a self-initialized _mm512_undefined_*() that -Wmaybe-uninitialized
// flags once inlined (GCC bug 105593, fixed in GCC 13): not our code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#else
#define ZERO3_OFFLOAD_AVX512 0
#endif

namespace zero3::offload::detail {

#if ZERO3_OFFLOAD_AVX512
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr std::size_t kWidth = 16;

  static F set1(float x) { return _mm512_set1_ps(x); }
  static __m512i set1i(int x) { return _mm512_set1_epi32(x); }

  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const bf16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  // F16C converts exactly (subnormals included) but quiets a signalling NaN; dtype.hpp keeps the
  // payload as it is, so NaN lanes are rebuilt from the bits: sign, all-ones exponent, payload << 13.
  static F load(const fp16_t* p) { return widen_fp16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F widen_fp16(__m256i h) {
    const __m512i e = _mm512_cvtepu16_epi32(h);
    const __m512i abs = _mm512_and_si512(e, set1i(0x7fff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(abs, set1i(0x7c00));
    const __m512i nan_bits = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(e, set1i(0x8000)), 16),
                                             _mm512_add_epi32(_mm512_slli_epi32(abs, 13), set1i(0x70000000)));
    return _mm512_mask_blend_ps(nan, _mm512_cvtph_ps(h), _mm512_castsi512_ps(nan_bits));
  }

  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static void store(bf16_t* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
  static void store(fp16_t* p, F x) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), to_fp16(x)); }
  // Non-temporal: p is 16-element aligned (64 bytes for float, 32 for the 16-bit types).
  static void stream(float* p, F x) { _mm512_stream_ps(p, x); }
  static void stream(bf16_t* p, F x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_bf16(x)); }
  static void stream(fp16_t* p, F x) { _mm256_stream_si256(reinterpret_cast<__m256i*>(p), to_fp16(x)); }
  static void stream(simd::NoParam*, F) {}
  static void fence() { _mm_sfence(); }
  // dtype.hpp's float_to_bf16 in the top half of each lane (the bf16 value widened back to fp32): round to
  // nearest even on the bits; NaN keeps its sign and top payload, quieted. Integer code rather than
  // AVX512-BF16's vcvtne2ps2bf16, which rounds the same but flushes subnormal inputs to zero, where
  // dtype.hpp keeps bf16's subnormals (second moments of small gradients are subnormal): its results would
  // differ from the scalar path's, and fixing those lanes up costs what the integer rounding does.
  static __m512i round_bf16_bits(F x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), set1i(1));
    const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(u, set1i(0x7fff)), lsb);
    const __m512i quiet = _mm512_or_si512(u, set1i(0x00400000));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_and_si512(_mm512_mask_blend_epi32(nan, rounded, quiet), set1i(static_cast<int>(0xffff0000u)));
  }
  static __m256i to_bf16(F x) { return top_halves(round_bf16_bits(x)); }
  static __m256i top_halves(__m512i u) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)); }
  // x rounded to the 16-bit type as store() rounds it, widened back to fp32 (exactly).
  static F round(const bf16_t*, F x) { return _mm512_castsi512_ps(round_bf16_bits(x)); }
  // to_fp16 makes every NaN the quiet sign | 0x7e00, which F16C widens as dtype.hpp does: no NaN fix-up.
  static F round(const fp16_t*, F x) { return _mm512_cvtph_ps(to_fp16(x)); }
  // Stores of values round() returned, so exact in the type: bf16 keeps the top halves, no rounding again.
  static void store_exact(bf16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), top_halves(_mm512_castps_si512(x)));
  }
  static void stream_exact(bf16_t* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), top_halves(_mm512_castps_si512(x)));
  }
  // A NaN that round() returned is sign | 0x7fc00000, which F16C narrows to sign | 0x7e00 as dtype.hpp does.
  static void store_exact(fp16_t* p, F x) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void stream_exact(fp16_t* p, F x) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // F16C rounds to nearest even with IEEE overflow to Inf and correctly rounded subnormals, as
  // float_to_fp16 does; NaN becomes sign | 0x7e00 there, F16C keeps payload bits, so NaN lanes are fixed.
  static __m256i to_fp16(F x) {
    const __m256i h = _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(x), 16), set1i(0x8000));
    const __m256i quiet = _mm512_cvtepi32_epi16(_mm512_or_si512(sign, set1i(0x7e00)));
    const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm256_mask_blend_epi16(nan, h, quiet);
  }
  static void store(simd::NoParam*, F) {}

  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F sqrt(F a) { return _mm512_sqrt_ps(a); }
  // optim_math.hpp's sign_of: +1, -1, +0 for +-0, and NaN passed through.
  static F sign_of(F x) {
    const F zero = _mm512_setzero_ps();
    F r = _mm512_mask_mov_ps(x, _mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), zero);
    r = _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, zero, _CMP_GT_OQ), set1(1.0f));
    return _mm512_mask_mov_ps(r, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), set1(-1.0f));
  }

  // Lanes 0-7 and 8-15 of the block of 16, as two vectors of 8 doubles.
  struct StatAcc {
    __m512d lo, hi;
    void load(const StatLanes& l) {
      lo = _mm512_loadu_pd(l.lane);
      hi = _mm512_loadu_pd(l.lane + 8);
    }
    void store(StatLanes& l) const {
      _mm512_storeu_pd(l.lane, lo);
      _mm512_storeu_pd(l.lane + 8, hi);
    }
    void add(F x, std::size_t) {
      const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
      const __m512d b = _mm512_cvtps_pd(_mm512_extractf32x8_ps(x, 1));
      lo = _mm512_add_pd(lo, _mm512_mul_pd(a, a));
      hi = _mm512_add_pd(hi, _mm512_mul_pd(b, b));
    }
  };
};

}  // namespace

constinit const CpuOptimizerKernels kAvx512Kernels = {
    .adam = &simd::adam<Avx512>,
    .lion = &simd::lion<Avx512>,
    .adagrad = &simd::adagrad<Avx512>,
    .accumulate = &simd::accumulate<Avx512>,
    .grad_stats = &simd::grad_stats<Avx512>,
    .compiled_in = true,
};

#else  // not built for AVX-512: no kernels, never selected (simd_path_supported is false).

constinit const CpuOptimizerKernels kAvx512Kernels = {
    .adam = nullptr,
    .lion = nullptr,
    .adagrad = nullptr,
    .accumulate = nullptr,
    .grad_stats = nullptr,
    .compiled_in = false,
};

#endif

}  // namespace zero3::offload::detail
