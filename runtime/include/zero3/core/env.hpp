// Every environment variable zero3 reads, declared once: its name, what it does, and what it takes. Code reads
// a variable through env::get(kName) and never spells a ZERO3_* name itself (tools/lint.sh checks it), and
// docs/environment.md lists the same rows (checked by the test unit.env_doc). Config keys belong in the JSON
// config; a variable here is for what must be chosen outside it (a port shared by two jobs, a debugging mode,
// a fault to inject in tests, a SIMD path to compare).
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>

namespace zero3::env {

struct Variable {
  std::string_view name;
  std::string_view values;   // what it takes
  std::string_view meaning;  // what it does, one sentence
};

inline constexpr std::string_view kCpuSimd = "ZERO3_CPU_SIMD";
inline constexpr std::string_view kFault = "ZERO3_FAULT";
inline constexpr std::string_view kGuardScopeMemory = "ZERO3_GUARD_SCOPE_MEMORY";
inline constexpr std::string_view kHostBf16Gemm = "ZERO3_HOST_BF16_GEMM";
inline constexpr std::string_view kHostGemmF32 = "ZERO3_HOST_GEMM_F32";
inline constexpr std::string_view kProgressAddr = "ZERO3_PROGRESS_ADDR";
inline constexpr std::string_view kProgressPort = "ZERO3_PROGRESS_PORT";

inline constexpr std::array kVariables = {
    Variable{kCpuSimd, "`scalar`, `avx2` or `avx512`",
             "The CPU optimizer's SIMD path, narrower than the widest this CPU supports (docs/offload.md)."},
    Variable{kFault, "`kind:rank=R:step=S[:unit=U]`",
             "Injects one communication fault for the watchdog's tests (docs/comm.md); never set in production."},
    Variable{kGuardScopeMemory, "`1` (on) or `0` (off)",
             "The host device traps host-thread access to gathered params and gradient buffers outside stream work "
             "(docs/device.md), where HostDeviceOptions leaves it unset."},
    Variable{kHostBf16Gemm, "`0`",
             "The host models compute bf16 matrix products in fp32 instead of oneDNN's bf16 kernels "
             "(docs/models.md)."},
    Variable{kHostGemmF32, "`openblas`",
             "The host models' fp32 matrix products on OpenBLAS instead of oneDNN (docs/models.md)."},
    Variable{kProgressAddr, "a numeric IPv4 or IPv6 address of rank 0's host",
             "Where rank 0's progress store listens, when its host name does not resolve to an address every rank "
             "reaches (docs/comm.md)."},
    Variable{kProgressPort, "a port number, 0-65535",
             "The progress store's port instead of an ephemeral one (docs/comm.md)."},
};

// The variable's value, or nullopt when it is unset. `name` must be one of kVariables (UsageError otherwise),
// so that every variable read is declared here. Read at start-up: zero3 never writes the environment.
std::optional<std::string> get(std::string_view name);

}  // namespace zero3::env
