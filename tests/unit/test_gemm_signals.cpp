// A signal that interrupts a host matrix product runs its handler on the interrupted thread's own stack.
// oneDNN's generated fp32 GEMM kernels (its "gemm:jit" matmul, oneDNN up to 3.10) point the stack pointer
// at their heap workspace while they run; a signal taken there writes its frame below that buffer, into
// the heap (oneDNN issue #4845, fixed by PR #4855 in 3.11). zero3 train then ended in "corrupted size vs.
// prev_size" after SIGTERM. Here one thread runs products while another sends it signals: each handler
// checks that its own frame lies inside the thread's stack. The detector itself is checked first, with a
// handler put on an alternate stack in the heap on purpose.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "host_gemm.hpp"

namespace {

namespace gemm = zero3::models::gemm;

// The stack of the thread the signals go to, and what its handlers saw. Lock-free atomics only.
std::atomic<std::uintptr_t> g_stack_low{0};
std::atomic<std::uintptr_t> g_stack_high{0};
std::atomic<int> g_on_stack{0};
std::atomic<int> g_off_stack{0};

extern "C" void on_probe_signal(int) {
  volatile char here = 0;
  const auto at = reinterpret_cast<std::uintptr_t>(&here);
  if (at >= g_stack_low.load() && at < g_stack_high.load()) {
    g_on_stack.fetch_add(1);
  } else {
    g_off_stack.fetch_add(1);
  }
}

void record_own_stack() {
  pthread_attr_t attr;
  REQUIRE(pthread_getattr_np(pthread_self(), &attr) == 0);
  void* low = nullptr;
  std::size_t size = 0;
  REQUIRE(pthread_attr_getstack(&attr, &low, &size) == 0);
  pthread_attr_destroy(&attr);
  g_stack_low.store(reinterpret_cast<std::uintptr_t>(low));
  g_stack_high.store(reinterpret_cast<std::uintptr_t>(low) + size);
}

// SIGUSR1 -> on_probe_signal for the scope (flags as given), the previous action restored after.
class ProbeHandler {
 public:
  explicit ProbeHandler(int flags) {
    struct sigaction action {};
    action.sa_handler = on_probe_signal;
    action.sa_flags = flags;
    sigemptyset(&action.sa_mask);
    REQUIRE(sigaction(SIGUSR1, &action, &previous_) == 0);
    g_on_stack = 0;
    g_off_stack = 0;
  }
  ~ProbeHandler() { sigaction(SIGUSR1, &previous_, nullptr); }
  ProbeHandler(const ProbeHandler&) = delete;
  ProbeHandler& operator=(const ProbeHandler&) = delete;

 private:
  struct sigaction previous_ {};
};

// Runs work() on a new thread until it returns, sending that thread SIGUSR1 every 20 us meanwhile.
template <typename Work>
void run_under_signals(const Work& work) {
  std::atomic<bool> done{false};
  std::atomic<bool> started{false};
  std::thread worker([&] {
    record_own_stack();
    started = true;
    work();
    done = true;
  });
  while (!started) std::this_thread::yield();
  while (!done) {
    pthread_kill(worker.native_handle(), SIGUSR1);
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  worker.join();
}

std::vector<float> filled(std::size_t n, float v) {
  return std::vector<float>(n, v);
}

}  // namespace

TEST_CASE("the detector sees a handler that runs off the thread's stack") {
  const ProbeHandler probe(SA_RESTART | SA_ONSTACK);
  run_under_signals([] {
    // An alternate signal stack in the heap, where the GEMM kernel's stack pointer points.
    std::vector<char> heap_stack(std::size_t{64} * 1024);
    stack_t alt{};
    alt.ss_sp = heap_stack.data();
    alt.ss_size = heap_stack.size();
    REQUIRE(sigaltstack(&alt, nullptr) == 0);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (std::chrono::steady_clock::now() < until) {
    }
    stack_t off{};
    off.ss_flags = SS_DISABLE;
    REQUIRE(sigaltstack(&off, nullptr) == 0);
  });
  CHECK(g_off_stack.load() > 0);
}

TEST_CASE("signals during oneDNN and OpenBLAS products run their handlers on the thread's stack") {
  if (!gemm::onednn_built()) return;
  gemm::configure_backends();
  // The shapes of the small GPT's linear layers whose held-out pass crashed (a 64-row block of C).
  struct Shape {
    bool ta, tb;
    gemm::Index m, n, k;
  };
  const std::vector<Shape> shapes = {
      {false, true, 64, 64, 256}, {false, true, 64, 256, 64}, {false, false, 64, 64, 256}, {true, false, 64, 256, 64}};
  for (const gemm::Backend backend : {gemm::Backend::onednn, gemm::Backend::openblas}) {
    for (const Shape& s : shapes) {
      const std::string impl = backend == gemm::Backend::onednn ? gemm::onednn_impl(false, s.ta, s.tb, s.m, s.n, s.k)
                                                                : gemm::openblas_core();
      INFO(gemm::backend_name(backend) << " " << impl << ": " << s.m << "x" << s.n << "x" << s.k << " trans " << s.ta
                                       << s.tb);
      const ProbeHandler probe(SA_RESTART);
      const std::vector<float> a = filled(s.m * s.k, 0.5f);
      const std::vector<float> b = filled(s.k * s.n, 0.25f);
      std::vector<float> c = filled(s.m * s.n, 0.0f);
      const gemm::Index lda = s.ta ? s.m : s.k;
      const gemm::Index ldb = s.tb ? s.k : s.n;
      // Products until 300 signals were handled (or 20 s passed, which fails below).
      constexpr int kSignals = 300;
      run_under_signals([&] {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (g_on_stack.load() + g_off_stack.load() < kSignals && std::chrono::steady_clock::now() < until) {
          gemm::gemm_f32_serial(backend, s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f, c.data(),
                                s.n);
        }
      });
      CHECK(g_on_stack.load() + g_off_stack.load() >= kSignals);
      CHECK(g_off_stack.load() == 0);
      CHECK(c[0] == 0.125f * static_cast<float>(s.k));
    }
  }
}
