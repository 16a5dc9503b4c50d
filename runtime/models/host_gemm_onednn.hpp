// The oneDNN side of host_gemm (private): matmul primitives, built once per shape and thread count and
// kept. host_gemm_onednn.cpp when the build links oneDNN, host_gemm_onednn_stub.cpp (throws) otherwise.
#pragma once

#include <cstddef>

namespace zero3::models::gemm::onednn {

bool built();
// The CPU multiplies bf16 natively as oneDNN sees it (its effective ISA includes AVX512-BF16; AMX implies it).
bool bf16_supported();
// C = alpha op(A) op(B) + beta C with C fp32 and A, B fp32 (bf16 == false) or bf16 bit patterns, on
// `threads` OpenMP threads of the calling thread (1: no parallel region at all).
void matmul(bool bf16, int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
            float alpha, const void* a, std::size_t lda, const void* b, std::size_t ldb, float beta, float* c,
            std::size_t ldc);
const char* impl(bool bf16, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k);

}  // namespace zero3::models::gemm::onednn
