// host_gemm's oneDNN side: one matmul primitive per (dtype, transposes, sizes, strides, alpha, beta,
// threads), created on first use and kept (creation costs far more than a product at these sizes).
// Operands are described by strides, so transposed and strided views need no copy. The scratchpad is
// the caller's (thread-local), so one primitive can run on several threads at once.
#include "host_gemm_onednn.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <pthread.h>

#include <csignal>
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "zero3/core/error.hpp"

namespace zero3::models::gemm::onednn {
namespace {

using dt = dnnl::memory::data_type;
using Dims = dnnl::memory::dims;

struct Key {
  bool bf16, trans_a, trans_b;
  std::size_t m, n, k, lda, ldb, ldc;
  float alpha, beta;
  int threads;
  auto tie() const { return std::tie(bf16, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, threads); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Prim {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul matmul;
  std::string impl;
  bool holds_signals = true;  // its kernel may move the stack pointer into the heap (AsyncSignalsHeld)
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::memory::dim dim(std::size_t v) {
  return static_cast<dnnl::memory::dim>(v);
}

// [rows, cols] as stored row-major with row stride ld, read transposed when trans.
dnnl::memory::desc operand(dt type, bool trans, std::size_t rows, std::size_t cols, std::size_t ld) {
  return trans ? dnnl::memory::desc(Dims{dim(rows), dim(cols)}, type, Dims{1, dim(ld)})
               : dnnl::memory::desc(Dims{dim(rows), dim(cols)}, type, Dims{dim(ld), 1});
}

std::unique_ptr<Prim> create(const Key& key) {
  const dt in = key.bf16 ? dt::bf16 : dt::f32;
  const dnnl::memory::desc a = operand(in, key.trans_a, key.m, key.k, key.lda);
  const dnnl::memory::desc b = operand(in, key.trans_b, key.k, key.n, key.ldb);
  const dnnl::memory::desc c(Dims{dim(key.m), dim(key.n)}, dt::f32, Dims{dim(key.ldc), 1});
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
  if (key.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(key.beta);
    attr.set_post_ops(po);
  }
  auto p = std::make_unique<Prim>();
  p->pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, engine());
  p->matmul = dnnl::matmul(p->pd);
  p->impl = p->pd.impl_info_str();
  // The brgemm kernels keep the stack pointer on the stack; every other implementation is held to be unsafe.
  p->holds_signals = p->impl.rfind("brg", 0) != 0;
  return p;
}

const Prim& primitive(const Key& key) {
  static std::mutex mutex;
  static std::map<Key, std::unique_ptr<Prim>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Prim>& slot = cache[key];
  if (!slot) {
    try {
      omp_set_num_threads(key.threads);  // oneDNN sizes its blocking for the threads it will run on
      slot = create(key);
    } catch (const dnnl::error& e) {
      cache.erase(key);
      throw UsageError(fmt::format("oneDNN matmul {}x{}x{} ({}, trans {} {}): {}", key.m, key.n, key.k,
                                   key.bf16 ? "bf16" : "f32", key.trans_a, key.trans_b, e.what()));
    }
  }
  return *slot;
}

// A primitive with its memory objects on one thread: a product rebinds their data handles instead of creating
// four memory objects (each an allocation) per call, and finds its primitive without the shared cache's lock.
struct Bound {
  const Prim* prim;
  dnnl::memory a, b, c, scratch;
};

Bound& bound(const Key& key) {
  thread_local std::map<Key, Bound> cache;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const Prim& p = primitive(key);
  Bound b{&p, dnnl::memory(p.pd.src_desc(), engine(), nullptr), dnnl::memory(p.pd.weights_desc(), engine(), nullptr),
          dnnl::memory(p.pd.dst_desc(), engine(), nullptr), dnnl::memory(p.pd.scratchpad_desc(), engine(), nullptr)};
  return cache.emplace(key, std::move(b)).first->second;
}

// Asynchronous signals held back on this thread for the scope (when `hold`); pending ones arrive when it
// ends. oneDNN's generated fp32 GEMM kernels (its "gemm:jit" matmul, up to oneDNN 3.10; Debian 12 ships
// 2.6) point the stack pointer at their workspace in the heap while they run, so a signal taken there
// writes its frame below that buffer: heap corruption, seen as "corrupted size vs. prev_size" after a
// SIGTERM during a product (oneDNN issue #4845, fixed in 3.11 by PR #4855; tests/unit/test_gemm_signals.cpp).
// Faults raised by the code itself (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT) stay
// deliverable. The models run every product on the calling thread (threads = 1); oneDNN's OpenMP workers,
// which only the benchmark's pooled products use, inherit the mask of the thread that starts them.
class AsyncSignalsHeld {
 public:
  explicit AsyncSignalsHeld(bool hold) noexcept : hold_(hold) {
    if (hold_) pthread_sigmask(SIG_BLOCK, &held(), &previous_);
  }
  ~AsyncSignalsHeld() {
    if (hold_) pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  AsyncSignalsHeld(const AsyncSignalsHeld&) = delete;
  AsyncSignalsHeld& operator=(const AsyncSignalsHeld&) = delete;

 private:
  static const sigset_t& held() {
    static const sigset_t set = [] {
      sigset_t s;
      sigfillset(&s);
      for (const int sync : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT}) sigdelset(&s, sync);
      return s;
    }();
    return set;
  }
  bool hold_;
  sigset_t previous_{};
};

}  // namespace

bool built() {
  return true;
}

bool bf16_supported() {
  // oneDNN's ISA values are nested bit sets: a CPU with AMX has every bit of avx512_core_bf16.
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return (isa & bf16) == bf16;
}

void matmul(bool bf16, int threads, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k,
            float alpha, const void* a, std::size_t lda, const void* b, std::size_t ldb, float beta, float* c,
            std::size_t ldc) {
  if (m == 0 || n == 0) return;
  Bound& x = bound({bf16, trans_a, trans_b, m, n, k, lda, ldb, ldc, alpha, beta, threads});
  thread_local dnnl::stream stream(engine());
  // The scratchpad of every primitive on this thread: grown when a primitive needs more, and rebound each call.
  thread_local std::vector<unsigned char> scratch;
  const std::size_t scratch_bytes = x.prim->pd.scratchpad_desc().get_size();
  if (scratch.size() < scratch_bytes) scratch.resize(scratch_bytes);
  // oneDNN reads the calling thread's OpenMP setting: 1 runs the product without a parallel region.
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  x.a.set_data_handle(const_cast<void*>(a));
  x.b.set_data_handle(const_cast<void*>(b));
  x.c.set_data_handle(c);
  x.scratch.set_data_handle(scratch.data());
  // Two system calls (about 0.5 us together): a few percent of the smallest products of a tiny model.
  const AsyncSignalsHeld held(x.prim->holds_signals);
  x.prim->matmul.execute(
      stream, {{DNNL_ARG_SRC, x.a}, {DNNL_ARG_WEIGHTS, x.b}, {DNNL_ARG_DST, x.c}, {DNNL_ARG_SCRATCHPAD, x.scratch}});
  stream.wait();
}

const char* impl(bool bf16, bool trans_a, bool trans_b, std::size_t m, std::size_t n, std::size_t k) {
  const std::size_t lda = trans_a ? m : k;
  const std::size_t ldb = trans_b ? k : n;
  return primitive({bf16, trans_a, trans_b, m, n, k, lda, ldb, n, 1.0f, 0.0f, 1}).impl.c_str();
}

}  // namespace zero3::models::gemm::onednn
