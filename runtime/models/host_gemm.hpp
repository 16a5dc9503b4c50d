// Matrix products of the host models, row-major: C[m, n] = alpha op(A) op(B) + beta C, op(X) = X^T when
// trans_x, lda/ldb/ldc the row strides as stored. fp32 products run on oneDNN's matmul where the build
// has it (f32_backend), else OpenBLAS; bf16 products (bf16 operands, fp32 accumulation and C) on oneDNN
// where the CPU multiplies bf16 natively; fp64 on OpenBLAS. No other file of the models sees a oneDNN or CBLAS header.
// gemm_f32/gemm_bf16 split C into fixed blocks of rows or columns (chosen from the shape alone) and run
// the blocks on the host pool (host_parallel.hpp) one backend call each, single-threaded: the result does
// not depend on the thread count, and no second thread pool competes with the pool's element-wise loops.
// Callable from any thread, also from inside a for_chunks loop (then on that thread alone: *_serial).
#pragma once

#include <cstddef>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gemm {

using Index = std::size_t;

enum class Backend { openblas, onednn };
const char* backend_name(Backend b);

// The build links oneDNN (CMake option ZERO3_WITH_ONEDNN and the library found).
bool onednn_built();
// bf16 products are available: oneDNN is built in and the CPU has AVX512-BF16 (or AMX-BF16) dot
// products. ZERO3_HOST_BF16_GEMM=0 in the environment turns them off (fp32 products instead).
bool bf16_native();
// The backend of gemm_f32: oneDNN when built, unless ZERO3_HOST_GEMM_F32=openblas.
Backend f32_backend();

// Must be called before any product, and again after a change of the thread count: makes the backends
// run single-threaded inside the host pool's blocks.
void configure_backends();

void gemm_f32(bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha, const float* a, Index lda,
              const float* b, Index ldb, float beta, float* c, Index ldc);
// Requires bf16_native() (throws UsageError otherwise).
void gemm_bf16(bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda,
               const bf16_t* b, Index ldb, float beta, float* c, Index ldc);
void gemm_f64(bool trans_a, bool trans_b, Index m, Index n, Index k, double alpha, const double* a, Index lda,
              const double* b, Index ldb, double beta, double* c, Index ldc);

// One backend call on the calling thread alone (the backend's own threading is set to 1 thread).
void gemm_f32_serial(Backend backend, bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha,
                     const float* a, Index lda, const float* b, Index ldb, float beta, float* c, Index ldc);
void gemm_bf16_serial(bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha, const bf16_t* a, Index lda,
                      const bf16_t* b, Index ldb, float beta, float* c, Index ldc);

// For the benchmark: one backend call on the backend's own thread pool (OpenBLAS's threads, oneDNN's
// OpenMP threads) with `threads` threads; the next configure_backends() restores the models' setting.
void gemm_f32_pooled(Backend backend, int threads, bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha,
                     const float* a, Index lda, const float* b, Index ldb, float beta, float* c, Index ldc);
void gemm_bf16_pooled(int threads, bool trans_a, bool trans_b, Index m, Index n, Index k, float alpha, const bf16_t* a,
                      Index lda, const bf16_t* b, Index ldb, float beta, float* c, Index ldc);
// The implementation oneDNN picked for a bf16 (or fp32) product of this shape ("brg:avx512_core_bf16", ...).
const char* onednn_impl(bool bf16, bool trans_a, bool trans_b, Index m, Index n, Index k);
// OpenBLAS's kernel family ("Haswell", "SkylakeX", ...; OPENBLAS_CORETYPE overrides its detection).
const char* openblas_core();

}  // namespace zero3::models::gemm
