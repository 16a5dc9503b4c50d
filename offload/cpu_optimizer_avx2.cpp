// The AVX2 path: 8 floats per vector, the loops of cpu_optimizer_paths.hpp over the operations below
// (16-bit master and state included).
// Compiled with -mavx2 -mf16c, without -mfma, and with -ffp-contract=off (offload/CMakeLists.txt); only
// called when cpu_features.cpp found AVX2 and F16C at run time. Every operation is the one correctly
// rounded IEEE fp32 operation of optim_math.hpp, and the 16-bit conversions give dtype.hpp's bits.
#include "cpu_optimizer_paths.hpp"

#if defined(__AVX2__) && defined(__F16C__)
#define ZERO3_OFFLOAD_AVX2 1
#include <immintrin.h>
#else
#define ZERO3_OFFLOAD_AVX2 0
#endif

namespace zero3::offload::detail {

#if ZERO3_OFFLOAD_AVX2
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr std::size_t kWidth = 8;

  static F set1(float x) { return _mm256_set1_ps(x); }
  static __m256i set1i(int x) { return _mm256_set1_epi32(x); }
  // 8 x 32-bit lanes (each holding a 16-bit value) to 8 x 16-bit, in order.
  static __m128i narrow(__m256i v) {
    return _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  }

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const bf16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  // F16C converts exactly (subnormals included) but quiets a signalling NaN; dtype.hpp keeps the
  // payload as it is, so NaN lanes are rebuilt from the bits: sign, all-ones exponent, payload << 13.
  static F load(const fp16_t* p) { return widen_fp16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F widen_fp16(__m128i h) {
    const __m256i e = _mm256_cvtepu16_epi32(h);
    const __m256i abs = _mm256_and_si256(e, set1i(0x7fff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, set1i(0x7c00));
    const __m256i nan_bits = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(e, set1i(0x8000)), 16),
                                             _mm256_add_epi32(_mm256_slli_epi32(abs, 13), set1i(0x70000000)));
    return _mm256_blendv_ps(_mm256_cvtph_ps(h), _mm256_castsi256_ps(nan_bits), _mm256_castsi256_ps(nan));
  }

  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static void store(bf16_t* p, F x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
  static void store(fp16_t* p, F x) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), to_fp16(x)); }
  // Non-temporal: p is 8-element aligned (32 bytes for float, 16 for the 16-bit types).
  static void stream(float* p, F x) { _mm256_stream_ps(p, x); }
  static void stream(bf16_t* p, F x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_bf16(x)); }
  static void stream(fp16_t* p, F x) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), to_fp16(x)); }
  static void stream(simd::NoParam*, F) {}
  static void fence() { _mm_sfence(); }
  // dtype.hpp's float_to_bf16 in the top half of each lane (the bf16 value widened back to fp32): round to
  // nearest even on the bits; NaN keeps its sign and top payload, quieted.
  static __m256i round_bf16_bits(F x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), set1i(1));
    const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(u, set1i(0x7fff)), lsb);
    const __m256i quiet = _mm256_or_si256(u, set1i(0x00400000));
    const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_and_si256(_mm256_blendv_epi8(rounded, quiet, nan), set1i(static_cast<int>(0xffff0000u)));
  }
  static __m128i to_bf16(F x) { return narrow(_mm256_srli_epi32(round_bf16_bits(x), 16)); }
  // x rounded to the 16-bit type as store() rounds it, widened back to fp32 (exactly).
  static F round(const bf16_t*, F x) { return _mm256_castsi256_ps(round_bf16_bits(x)); }
  // to_fp16 makes every NaN the quiet sign | 0x7e00, which F16C widens as dtype.hpp does: no NaN fix-up.
  static F round(const fp16_t*, F x) { return _mm256_cvtph_ps(to_fp16(x)); }
  // Stores of values round() returned, so exact in the type: bf16 keeps the top halves, no rounding again.
  static void store_exact(bf16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), narrow(_mm256_srli_epi32(_mm256_castps_si256(x), 16)));
  }
  static void stream_exact(bf16_t* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), narrow(_mm256_srli_epi32(_mm256_castps_si256(x), 16)));
  }
  // A NaN that round() returned is sign | 0x7fc00000, which F16C narrows to sign | 0x7e00 as dtype.hpp does.
  static void store_exact(fp16_t* p, F x) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  static void stream_exact(fp16_t* p, F x) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
  }
  // F16C rounds to nearest even with IEEE overflow to Inf and correctly rounded subnormals, as
  // float_to_fp16 does; NaN becomes sign | 0x7e00 there, F16C keeps payload bits, so NaN lanes are fixed.
  static __m128i to_fp16(F x) {
    const __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), set1i(0x8000));
    const __m128i quiet = narrow(_mm256_or_si256(sign, set1i(0x7e00)));
    const __m256i nan32 = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    const __m128i nan = _mm_packs_epi32(_mm256_castsi256_si128(nan32), _mm256_extracti128_si256(nan32, 1));
    return _mm_blendv_epi8(h, quiet, nan);
  }
  static void store(simd::NoParam*, F) {}

  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F sqrt(F a) { return _mm256_sqrt_ps(a); }
  // optim_math.hpp's sign_of: +1, -1, +0 for +-0, and NaN passed through.
  static F sign_of(F x) {
    const F zero = _mm256_setzero_ps();
    F r = _mm256_blendv_ps(x, zero, _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
    r = _mm256_blendv_ps(r, set1(1.0f), _mm256_cmp_ps(x, zero, _CMP_GT_OQ));
    return _mm256_blendv_ps(r, set1(-1.0f), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
  }

  // The 16 lanes of a block as four vectors of 4 doubles; vector k of the block (floats 8k..8k+7) feeds
  // acc[2k] and acc[2k + 1].
  struct StatAcc {
    __m256d acc[4];
    void load(const StatLanes& l) {
      for (std::size_t j = 0; j < 4; ++j) acc[j] = _mm256_loadu_pd(l.lane + 4 * j);
    }
    void store(StatLanes& l) const {
      for (std::size_t j = 0; j < 4; ++j) _mm256_storeu_pd(l.lane + 4 * j, acc[j]);
    }
    void add(F x, std::size_t k) {
      const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
      const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
      acc[2 * k] = _mm256_add_pd(acc[2 * k], _mm256_mul_pd(a, a));
      acc[2 * k + 1] = _mm256_add_pd(acc[2 * k + 1], _mm256_mul_pd(b, b));
    }
  };
};

}  // namespace

constinit const CpuOptimizerKernels kAvx2Kernels = {
    .adam = &simd::adam<Avx2>,
    .lion = &simd::lion<Avx2>,
    .adagrad = &simd::adagrad<Avx2>,
    .accumulate = &simd::accumulate<Avx2>,
    .grad_stats = &simd::grad_stats<Avx2>,
    .compiled_in = true,
};

#else  // not built for AVX2: no kernels, never selected (simd_path_supported is false).

constinit const CpuOptimizerKernels kAvx2Kernels = {
    .adam = nullptr,
    .lion = nullptr,
    .adagrad = nullptr,
    .accumulate = nullptr,
    .grad_stats = nullptr,
    .compiled_in = false,
};

#endif

}  // namespace zero3::offload::detail
