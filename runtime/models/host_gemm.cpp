// host_gemm: the block split over the host pool, OpenBLAS for fp32 and fp64, oneDNN for bf16.
#include "host_gemm.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "host_gemm_onednn.hpp"
#include "host_parallel.hpp"
#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"

namespace zero3::models::gemm {
namespace {

// Rows (or columns) of C per block. 64 keeps 16 blocks for the 1024-row products of a small GPT (enough
// to balance 16 threads) while each block still amortizes packing the other operand.
constexpr Index kBlock = 64;
// Below this many multiply-adds a product runs as one call: a block split would cost more than it saves.
constexpr Index kMinSplitWork = Index{1} << 18;

blasint blas_dim(Index v) {
  ZERO3_CHECK(v <= static_cast<Index>(INT_MAX), "gemm: a dimension exceeds the BLAS integer range");
  return static_cast<blasint>(v);
}

CBLAS_TRANSPOSE blas_trans(bool trans) {
  return trans ? CblasTrans : CblasNoTrans;
}

void openblas_f32(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
                  Index ldb, float beta, float* c, Index ldc) {
  cblas_sgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), blas_dim(m), blas_dim(n), blas_dim(k), alpha, a,
              blas_dim(lda), b, blas_dim(ldb), beta, c, blas_dim(ldc));
}

// Splits C into kBlock-row blocks when it has at least as many rows as columns, else into column blocks,
// and runs call(m, n, a, b, c) per block with the operands offset to it. A block of rows of C reads the
// same rows of op(A) (for trans_a, columns of the stored A); a block of columns, the columns of op(B).
template <typename TA, typename TB, typename Call>
void split(bool ta, bool tb, Index m, Index n, Index k, const TA* a, Index lda, const TB* b, Index ldb, float* c,
           Index ldc, const Call& call) {
  // The split depends on the shape alone, never on the thread count: one thread runs the same blocks.
  if (m * n * k < kMinSplitWork) {
    call(m, n, a, b, c);
    return;
  }
  if (m >= n) {
    par::for_chunks(m, kBlock,
                    [&](Index, Index i0, Index i1) { call(i1 - i0, n, ta ? a + i0 : a + i0 * lda, b, c + i0 * ldc); });
  } else {
    par::for_chunks(n, kBlock,
                    [&](Index, Index j0, Index j1) { call(m, j1 - j0, a, tb ? b + j0 * ldb : b + j0, c + j0); });
  }
}

bool bf16_env_allows() {
  const std::optional<std::string> v = env::get(env::kHostBf16Gemm);
  return !v || *v != "0";
}

}  // namespace

const char* backend_name(Backend b) {
  return b == Backend::openblas ? "openblas" : "onednn";
}

bool onednn_built() {
  return onednn::built();
}

bool bf16_native() {
  static const bool native = onednn::built() && bf16_env_allows() && onednn::bf16_supported();
  return native;
}

Backend f32_backend() {
  // zero3-bench host-gemm on a Zen 5 (AVX-512): oneDNN's fp32 brgemm about 2x OpenBLAS 0.3.21's (Haswell
  // kernels) at a small GPT's shapes, single-threaded. ZERO3_HOST_GEMM_F32=openblas keeps OpenBLAS.
  static const Backend b = [] {
    const std::optional<std::string> v = env::get(env::kHostGemmF32);
    if (v && *v == "openblas") return Backend::openblas;
    return onednn::built() ? Backend::onednn : Backend::openblas;
  }();
  return b;
}

void configure_backends() {
  // The pool's blocks are the parallelism: OpenBLAS and oneDNN run single-threaded inside them, so their
  // own pools never start (OpenBLAS's threads would spin on the cores the pool's loops need).
  openblas_set_num_threads(1);
}

void gemm_f32(bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a, Index lda, const float* b,
              Index ldb, float beta, float* c, Index ldc) {
  if (m == 0 || n == 0) return;
  const Backend backend = f32_backend();
  split(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, [&](Index bm, Index bn, const float* ba, const float* bb, float* bc) {
    gemm_f32_serial(backend, ta, tb, bm, bn, k, alpha, ba, lda, bb, ldb, beta, bc, ldc);
  });
}

void gemm_bf16(bool ta, bool tb, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda, const bf16_t* b,
               Index ldb, float beta, float* c, Index ldc) {
  if (!bf16_native()) throw UsageError("host gemm: bf16 products need oneDNN and a CPU with AVX512-BF16");
  if (m == 0 || n == 0) return;
  split(ta, tb, m, n, k, a, lda, b, ldb, c, ldc,
        [&](Index bm, Index bn, const bf16_t* ba, const bf16_t* bb, float* bc) {
          onednn::matmul(true, 1, ta, tb, bm, bn, k, alpha, ba, lda, bb, ldb, beta, bc, ldc);
        });
}

void gemm_f64(bool ta, bool tb, Index m, Index n, Index k, double alpha, const double* a, Index lda, const double* b,
              Index ldb, double beta, double* c, Index ldc) {
  if (m == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), blas_dim(m), blas_dim(n), blas_dim(k), alpha, a,
              blas_dim(lda), b, blas_dim(ldb), beta, c, blas_dim(ldc));
}

void gemm_f32_serial(Backend backend, bool ta, bool tb, Index m, Index n, Index k, float alpha, const float* a,
                     Index lda, const float* b, Index ldb, float beta, float* c, Index ldc) {
  if (m == 0 || n == 0) return;
  if (backend == Backend::onednn) {
    onednn::matmul(false, 1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    openblas_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

void gemm_bf16_serial(bool ta, bool tb, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda,
                      const bf16_t* b, Index ldb, float beta, float* c, Index ldc) {
  onednn::matmul(true, 1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_f32_pooled(Backend backend, int threads, bool ta, bool tb, Index m, Index n, Index k, float alpha,
                     const float* a, Index lda, const float* b, Index ldb, float beta, float* c, Index ldc) {
  if (backend == Backend::onednn) {
    onednn::matmul(false, threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  openblas_set_num_threads(threads);
  openblas_f32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void gemm_bf16_pooled(int threads, bool ta, bool tb, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda,
                      const bf16_t* b, Index ldb, float beta, float* c, Index ldc) {
  onednn::matmul(true, threads, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

const char* onednn_impl(bool bf16, bool ta, bool tb, Index m, Index n, Index k) {
  return onednn::impl(bf16, ta, tb, m, n, k);
}

const char* openblas_core() {
  return openblas_get_corename();
}

}  // namespace zero3::models::gemm
