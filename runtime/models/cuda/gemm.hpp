// Row-major matrix products of the CUDA GPT through cuBLAS (which is column-major): C = alpha op(A) op(B)
// + beta C with A and B of one dtype (f32, bf16 or f16), C fp32, fp32 accumulation. Enqueued on the
// handle's stream; arguments trusted (the model checks sizes once per call).
#pragma once

#include <cublas_v2.h>

#include "zero3/core/dtype.hpp"

namespace zero3::models::gpu {

// An operand in device memory: its elements and their dtype.
struct Operand {
  const void* data = nullptr;
  DType dtype = DType::f32;
};

struct GemmArgs {
  bool trans_a = false;  // op(A) = A^T
  bool trans_b = false;
  int m = 0;  // C is [m, n], op(A) [m, k], op(B) [k, n]
  int n = 0;
  int k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  int lda = 0;  // row strides of A, B and C as stored
  int ldb = 0;
  int ldc = 0;
  // CUBLAS_COMPUTE_32F, or CUBLAS_COMPUTE_32F_FAST_TF32 for fp32 operands where tf32 products are enough.
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
};

// C[m, n] = alpha op(A) op(B) + beta C. A and B must have the same dtype.
void gemm(cublasHandle_t handle, const GemmArgs& args, Operand a, Operand b, float* c);

// `count` independent products; matrix i of A starts at a + i * stride_a elements (likewise B and C).
void gemm_strided_batched(cublasHandle_t handle, const GemmArgs& args, Operand a, long long stride_a, Operand b,
                          long long stride_b, float* c, long long stride_c, int count);

}  // namespace zero3::models::gpu
