// The bound kernel and the unfused passes of `zero3-bench cpu-optimizer`, in scalar, AVX2 and AVX-512
// forms. The vector forms carry GCC/Clang target attributes, so this one file needs no -mavx* flags and
// the CPU check stays where zero3 makes it (offload::best_simd_path); each caller passes a supported path.
// The vector loops load and store unaligned, as the fused kernels may be handed any element offset. The
// bound loads every stream of a vector before storing any, as the fused loops do: the arrays share their
// low 12 address bits, and a load issued after a store to another stream at the same offset would stall
// on 4K aliasing, a cost the fused kernel does not pay.
#include "cpu_optimizer_bench.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
// GCC 12's AVX-512 intrinsics initialise their don't-care operands from themselves (_mm512_undefined_*),
// which -Wmaybe-uninitialized reports at every inlined use; the warning is about the header, not this file.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define ZERO3_BENCH_X86 1
#define ZERO3_TARGET_AVX2 __attribute__((target("avx2")))
#define ZERO3_TARGET_AVX512 __attribute__((target("avx512f,avx512bw")))
#endif

namespace zero3::tools {

std::string_view bench_optimizer_name(BenchOptimizer o) {
  switch (o) {
    case BenchOptimizer::adamw:
      return "adamw";
    case BenchOptimizer::adam:
      return "adam";
    case BenchOptimizer::lion:
      return "lion";
    case BenchOptimizer::adagrad:
      return "adagrad";
  }
  return "?";
}

bool uses_exp_avg(BenchOptimizer o) {
  return o != BenchOptimizer::adagrad;
}
bool uses_exp_avg_sq(BenchOptimizer o) {
  return o != BenchOptimizer::lion;
}

BytesPerParam fused_bytes(BenchOptimizer o) {
  const std::size_t states = (uses_exp_avg(o) ? 1 : 0) + (uses_exp_avg_sq(o) ? 1 : 0);
  // grad + master + states in; master + states + bf16 param out.
  return {4 + 4 + 4 * states, 4 + 4 * states + 2};
}

const std::vector<StepStorage>& step_storages() {
  static const std::vector<StepStorage> storages = {
      {"f32", DType::f32, DType::f32, DType::f32, DType::bf16},
      {"bf16-master", DType::bf16, DType::f32, DType::bf16, DType::bf16},
      {"bf16-master-states", DType::bf16, DType::bf16, DType::bf16, DType::bf16},
      {"fp16-master", DType::f16, DType::f32, DType::f16, DType::f16},
  };
  return storages;
}

BytesPerParam fused_bytes(BenchOptimizer o, const StepStorage& s) {
  const std::size_t states = (uses_exp_avg(o) ? 1 : 0) + (uses_exp_avg_sq(o) ? 1 : 0);
  const std::size_t state_bytes = states * size_of(s.state);
  return {size_of(s.grad) + size_of(s.master) + state_bytes, size_of(s.master) + state_bytes + size_of(s.param)};
}

BytesPerParam unfused_bytes(BenchOptimizer o) {
  const BytesPerParam f = fused_bytes(o);
  BytesPerParam b;
  b.loaded = 4 + 4 + f.loaded + 4;        // norm, unscale, optimizer, cast
  b.stored = 0 + 4 + (f.stored - 2) + 2;  // unscale, optimizer (no bf16 param), cast
  return b;
}

namespace {

std::uint16_t upper_half(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}

std::uint16_t to_bf16_rne(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

// The pointers of one bound step; m or v is null when the optimizer has no such stream.
struct BoundPtrs {
  const float* g;
  float* p;
  float* m;
  float* v;
  std::uint16_t* out;
};

template <bool kM, bool kV>
void bound_scalar(const BoundPtrs& b, std::size_t begin, std::size_t end, float zero) {
  for (std::size_t i = begin; i < end; ++i) {
    const float gz = b.g[i] * zero;
    const float p = b.p[i] + gz;
    b.p[i] = p;
    if constexpr (kM) b.m[i] = b.m[i] + gz;
    if constexpr (kV) b.v[i] = b.v[i] + gz;
    b.out[i] = upper_half(p);
  }
}

double sum_squares_scalar(const float* x, std::size_t begin, std::size_t end) {
  float acc = 0.0f;
  for (std::size_t i = begin; i < end; ++i) acc += x[i] * x[i];
  return acc;
}

#if defined(ZERO3_BENCH_X86)

template <bool kM, bool kV>
ZERO3_TARGET_AVX512 void bound_avx512(const BoundPtrs b, std::size_t n, float zero) {
  const __m512 z = _mm512_set1_ps(zero);
  std::size_t i = 0;
#pragma GCC unroll 2
  for (; i + 16 <= n; i += 16) {
    const __m512 gz = _mm512_mul_ps(_mm512_loadu_ps(b.g + i), z);
    const __m512 p = _mm512_add_ps(_mm512_loadu_ps(b.p + i), gz);
    [[maybe_unused]] __m512 m, v;
    if constexpr (kM) m = _mm512_add_ps(_mm512_loadu_ps(b.m + i), gz);
    if constexpr (kV) v = _mm512_add_ps(_mm512_loadu_ps(b.v + i), gz);
    _mm512_storeu_ps(b.p + i, p);
    if constexpr (kM) _mm512_storeu_ps(b.m + i, m);
    if constexpr (kV) _mm512_storeu_ps(b.v + i, v);
    const __m256i hi = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(p), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(b.out + i), hi);
  }
  bound_scalar<kM, kV>(b, i, n, zero);
}

template <bool kM, bool kV>
ZERO3_TARGET_AVX2 void bound_avx2(const BoundPtrs b, std::size_t n, float zero) {
  const __m256 z = _mm256_set1_ps(zero);
  std::size_t i = 0;
#pragma GCC unroll 2
  for (; i + 8 <= n; i += 8) {
    const __m256 gz = _mm256_mul_ps(_mm256_loadu_ps(b.g + i), z);
    const __m256 p = _mm256_add_ps(_mm256_loadu_ps(b.p + i), gz);
    [[maybe_unused]] __m256 m, v;
    if constexpr (kM) m = _mm256_add_ps(_mm256_loadu_ps(b.m + i), gz);
    if constexpr (kV) v = _mm256_add_ps(_mm256_loadu_ps(b.v + i), gz);
    _mm256_storeu_ps(b.p + i, p);
    if constexpr (kM) _mm256_storeu_ps(b.m + i, m);
    if constexpr (kV) _mm256_storeu_ps(b.v + i, v);
    const __m256i s = _mm256_srli_epi32(_mm256_castps_si256(p), 16);
    const __m128i hi = _mm_packus_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(b.out + i), hi);
  }
  bound_scalar<kM, kV>(b, i, n, zero);
}

// Four independent accumulators: the add latency, not the loads, would otherwise limit an L2-hot tile.
ZERO3_TARGET_AVX512 double sum_squares_avx512(const float* x, std::size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    const __m512 x0 = _mm512_loadu_ps(x + i), x1 = _mm512_loadu_ps(x + i + 16);
    const __m512 x2 = _mm512_loadu_ps(x + i + 32), x3 = _mm512_loadu_ps(x + i + 48);
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(x0, x0));
    a1 = _mm512_add_ps(a1, _mm512_mul_ps(x1, x1));
    a2 = _mm512_add_ps(a2, _mm512_mul_ps(x2, x2));
    a3 = _mm512_add_ps(a3, _mm512_mul_ps(x3, x3));
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 x0 = _mm512_loadu_ps(x + i);
    a0 = _mm512_add_ps(a0, _mm512_mul_ps(x0, x0));
  }
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  double sum = 0.0;
  for (float l : lanes) sum += l;
  return sum + sum_squares_scalar(x, i, n);
}

ZERO3_TARGET_AVX2 double sum_squares_avx2(const float* x, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  std::size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);
    const __m256 x2 = _mm256_loadu_ps(x + i + 16), x3 = _mm256_loadu_ps(x + i + 24);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(x0, x0));
    a1 = _mm256_add_ps(a1, _mm256_mul_ps(x1, x1));
    a2 = _mm256_add_ps(a2, _mm256_mul_ps(x2, x2));
    a3 = _mm256_add_ps(a3, _mm256_mul_ps(x3, x3));
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 x0 = _mm256_loadu_ps(x + i);
    a0 = _mm256_add_ps(a0, _mm256_mul_ps(x0, x0));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  double sum = 0.0;
  for (float l : lanes) sum += l;
  return sum + sum_squares_scalar(x, i, n);
}

ZERO3_TARGET_AVX512 void triad_avx512(float* a, const float* b, const float* c, float s, std::size_t n) {
  const __m512 sv = _mm512_set1_ps(s);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(a + i, _mm512_add_ps(_mm512_loadu_ps(b + i), _mm512_mul_ps(sv, _mm512_loadu_ps(c + i))));
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

ZERO3_TARGET_AVX2 void triad_avx2(float* a, const float* b, const float* c, float s, std::size_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(b + i), _mm256_mul_ps(sv, _mm256_loadu_ps(c + i))));
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
}

ZERO3_TARGET_AVX512 void scale_avx512(float* x, float alpha, std::size_t n) {
  const __m512 a = _mm512_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), a));
  for (; i < n; ++i) x[i] *= alpha;
}

ZERO3_TARGET_AVX2 void scale_avx2(float* x, float alpha, std::size_t n) {
  const __m256 a = _mm256_set1_ps(alpha);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), a));
  for (; i < n; ++i) x[i] *= alpha;
}

ZERO3_TARGET_AVX512 void cast_bf16_avx512(const float* src, std::uint16_t* dst, std::size_t n) {
  const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff);
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  const __m512i quiet = _mm512_set1_epi32(0x0040);
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = _mm512_castps_si512(_mm512_loadu_ps(src + i));
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i rounded =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, bias), _mm512_and_si512(hi, one)), 16);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, _mm512_or_si512(hi, quiet));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi32_epi16(r));
  }
  for (; i < n; ++i) dst[i] = to_bf16_rne(src[i]);
}

ZERO3_TARGET_AVX2 void cast_bf16_avx2(const float* src, std::uint16_t* dst, std::size_t n) {
  const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  const __m256i quiet = _mm256_set1_epi32(0x0040);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i u = _mm256_castps_si256(_mm256_loadu_ps(src + i));
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i rounded =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, bias), _mm256_and_si256(hi, one)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan);
    const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = to_bf16_rne(src[i]);
}

#endif  // ZERO3_BENCH_X86

template <bool kM, bool kV>
void bound_dispatch(offload::SimdPath path, const BoundPtrs& b, std::size_t n, float zero) {
  switch (path) {
#if defined(ZERO3_BENCH_X86)
    case offload::SimdPath::avx512:
      return bound_avx512<kM, kV>(b, n, zero);
    case offload::SimdPath::avx2:
      return bound_avx2<kM, kV>(b, n, zero);
#endif
    default:
      return bound_scalar<kM, kV>(b, 0, n, zero);
  }
}

}  // namespace

void bound_range(offload::SimdPath path, BenchOptimizer o, const offload::StepSpan& span, float zero) {
  const BoundPtrs b{static_cast<const float*>(span.grad), static_cast<float*>(span.master),
                    static_cast<float*>(span.exp_avg), static_cast<float*>(span.exp_avg_sq),
                    static_cast<std::uint16_t*>(span.param)};
  const bool m = uses_exp_avg(o);
  const bool v = uses_exp_avg_sq(o);
  if (m && v) return bound_dispatch<true, true>(path, b, span.count, zero);
  if (m) return bound_dispatch<true, false>(path, b, span.count, zero);
  return bound_dispatch<false, true>(path, b, span.count, zero);
}

double sum_squares_range(offload::SimdPath path, const float* x, std::size_t count) {
  switch (path) {
#if defined(ZERO3_BENCH_X86)
    case offload::SimdPath::avx512:
      return sum_squares_avx512(x, count);
    case offload::SimdPath::avx2:
      return sum_squares_avx2(x, count);
#endif
    default:
      return sum_squares_scalar(x, 0, count);
  }
}

void triad_range(offload::SimdPath path, float* a, const float* b, const float* c, float s, std::size_t count) {
  switch (path) {
#if defined(ZERO3_BENCH_X86)
    case offload::SimdPath::avx512:
      return triad_avx512(a, b, c, s, count);
    case offload::SimdPath::avx2:
      return triad_avx2(a, b, c, s, count);
#endif
    default:
      for (std::size_t i = 0; i < count; ++i) a[i] = b[i] + s * c[i];
  }
}

void scale_range(offload::SimdPath path, float* x, float alpha, std::size_t count) {
  switch (path) {
#if defined(ZERO3_BENCH_X86)
    case offload::SimdPath::avx512:
      return scale_avx512(x, alpha, count);
    case offload::SimdPath::avx2:
      return scale_avx2(x, alpha, count);
#endif
    default:
      for (std::size_t i = 0; i < count; ++i) x[i] *= alpha;
  }
}

void cast_bf16_range(offload::SimdPath path, const float* src, std::uint16_t* dst, std::size_t count) {
  switch (path) {
#if defined(ZERO3_BENCH_X86)
    case offload::SimdPath::avx512:
      return cast_bf16_avx512(src, dst, count);
    case offload::SimdPath::avx2:
      return cast_bf16_avx2(src, dst, count);
#endif
    default:
      for (std::size_t i = 0; i < count; ++i) dst[i] = to_bf16_rne(src[i]);
  }
}

}  // namespace zero3::tools
