// Row-major on column-major: a row-major [m, n] matrix with row stride ld is, to cuBLAS, the column-major
// [n, m] matrix of its transpose with the same leading dimension. So row-major C = op(A) op(B) is computed
// as column-major C^T = op(B)^T op(A)^T: B first, A second, m and n swapped, the transpose flags kept.
#include "gemm.hpp"

#include "zero3/core/error.hpp"
#include "zero3_cuda_check.hpp"

namespace zero3::models::gpu {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f32:
      return CUDA_R_32F;
    case DType::f16:
      return CUDA_R_16F;
    case DType::bf16:
      return CUDA_R_16BF;
  }
  throw UsageError("gemm: unknown dtype");
}

cublasOperation_t op(bool trans) {
  return trans ? CUBLAS_OP_T : CUBLAS_OP_N;
}

}  // namespace

void gemm(cublasHandle_t handle, const GemmArgs& g, Operand a, Operand b, float* c) {
  ZERO3_CHECK(a.dtype == b.dtype, "gemm: A and B must have the same dtype");
  if (g.m == 0 || g.n == 0) return;
  ZERO3_CUBLAS_CHECK(cublasGemmEx(handle, op(g.trans_b), op(g.trans_a), g.n, g.m, g.k, &g.alpha, b.data,
                                  cuda_type(b.dtype), g.ldb, a.data, cuda_type(a.dtype), g.lda, &g.beta, c, CUDA_R_32F,
                                  g.ldc, g.compute, CUBLAS_GEMM_DEFAULT));
}

void gemm_strided_batched(cublasHandle_t handle, const GemmArgs& g, Operand a, long long stride_a, Operand b,
                          long long stride_b, float* c, long long stride_c, int count) {
  ZERO3_CHECK(a.dtype == b.dtype, "gemm_strided_batched: A and B must have the same dtype");
  if (g.m == 0 || g.n == 0 || count == 0) return;
  ZERO3_CUBLAS_CHECK(cublasGemmStridedBatchedEx(handle, op(g.trans_b), op(g.trans_a), g.n, g.m, g.k, &g.alpha, b.data,
                                                cuda_type(b.dtype), g.ldb, stride_b, a.data, cuda_type(a.dtype), g.lda,
                                                stride_a, &g.beta, c, CUDA_R_32F, g.ldc, stride_c, count, g.compute,
                                                CUBLAS_GEMM_DEFAULT));
}

}  // namespace zero3::models::gpu
