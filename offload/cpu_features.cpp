// Which SIMD path the CPU optimizer may use: compiled in (x86-64 builds carry all three) and supported by
// this CPU, asked through GCC's __builtin_cpu_supports, which also checks that the OS saves the wide
// registers (XGETBV). ZERO3_CPU_SIMD may narrow the choice, e.g. to compare paths on one machine.
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "cpu_optimizer_paths.hpp"
#include "zero3/core/env.hpp"
#include "zero3/core/error.hpp"
#include "zero3/offload/cpu_optimizer.hpp"

namespace zero3::offload {
namespace {

constexpr SimdPath kAllPaths[] = {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512};

// F16C (cpuid leaf 1, ECX bit 29), read directly: not every compiler's __builtin_cpu_supports knows it.
bool cpu_has_f16c() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & (1u << 29)) != 0;
#else
  return false;
#endif
}

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && cpu_has_f16c();
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_f16c();
#else
  return false;
#endif
}

std::string supported_list() {
  std::string out;
  for (SimdPath p : kAllPaths) {
    if (!simd_path_supported(p)) continue;
    if (!out.empty()) out += ", ";
    out += simd_path_name(p);
  }
  return out;
}

}  // namespace

std::string_view simd_path_name(SimdPath path) {
  switch (path) {
    case SimdPath::scalar:
      return "scalar";
    case SimdPath::avx2:
      return "avx2";
    case SimdPath::avx512:
      return "avx512";
  }
  return "unknown";
}

bool simd_path_supported(SimdPath path) {
  // Fixed for the life of the process: computed once.
  static const bool avx2 = detail::kAvx2Kernels.compiled_in && cpu_has_avx2();
  static const bool avx512 = detail::kAvx512Kernels.compiled_in && cpu_has_avx512();
  switch (path) {
    case SimdPath::scalar:
      return true;
    case SimdPath::avx2:
      return avx2;
    case SimdPath::avx512:
      return avx512;
  }
  return false;
}

SimdPath best_simd_path() {
  SimdPath widest = SimdPath::scalar;
  for (SimdPath p : kAllPaths) {
    if (simd_path_supported(p)) widest = p;
  }
  const std::optional<std::string> asked_env = env::get(env::kCpuSimd);
  if (!asked_env || asked_env->empty()) return widest;
  const std::string_view asked(*asked_env);
  for (SimdPath p : kAllPaths) {
    if (asked != simd_path_name(p)) continue;
    if (!simd_path_supported(p)) {
      throw Error(fmt::format("{}={} asks for a SIMD path this CPU (or this build) does not support; it supports: {}",
                              env::kCpuSimd, asked, supported_list()));
    }
    return p;
  }
  throw Error(fmt::format("{}='{}' is not a SIMD path: use scalar, avx2 or avx512 (this CPU supports: {})",
                          env::kCpuSimd, asked, supported_list()));
}

}  // namespace zero3::offload
