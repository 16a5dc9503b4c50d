// The one exception hierarchy of zero3 and the CHECK macros every backend derives from.
// Messages say what failed, where (JSON path, file, rank, unit, step) and, where it helps, what to do.
// Library code throws; only the top-level failure policy (tools/, or a test) decides to end a process.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace zero3 {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};
class ConfigError : public Error {
  using Error::Error;
};
class UsageError : public Error {  // an API used out of its contract (wrong sizes, wrong order)
  using Error::Error;
};
class CommError : public Error {
  using Error::Error;
};
class CommTimeout : public CommError {
  using CommError::CommError;
};
class CudaError : public Error {
  using Error::Error;
};
class OutOfMemory : public Error {
  using Error::Error;
};
class CheckpointError : public Error {
  using Error::Error;
};
// A file of the NVMe offload (zero_optimization.offload_*.nvme_path) could not be created, sized, read or
// written: the message names the file, the byte offset and the system's reason or the short count.
class IoError : public Error {
  using Error::Error;
};
// Training cannot go on: non-finite gradients or loss under zero3.nonfinite's abort policy or past its
// max_consecutive, a non-finite held-out loss at the end of a run, or loss spikes past zero3.spike's limit.
class NonFiniteError : public Error {
  using Error::Error;
};

namespace detail {
// Builds "<call> failed: <detail> (file:line)"; kept out of line so the macros stay small.
[[noreturn]] void throw_check_failure(std::string_view kind, std::string_view statement, std::string_view detail,
                                      const char* file, int line);
}  // namespace detail

}  // namespace zero3

// ZERO3_CHECK(cond, msg): a broken internal or API contract; throws zero3::UsageError naming the condition.
#define ZERO3_CHECK(cond, msg)                                                                    \
  do {                                                                                            \
    if (!(cond)) ::zero3::detail::throw_check_failure("check", #cond, (msg), __FILE__, __LINE__); \
  } while (0)

// ZERO3_CHECK_CALL(ExceptionType, statement, ok_expr, describe_expr): the generic form behind
// ZERO3_CUDA_CHECK, ZERO3_NCCL_CHECK, ZERO3_MPI_CHECK and ZERO3_CUBLAS_CHECK. `status` holds the
// statement's result inside ok_expr and describe_expr.
#define ZERO3_CHECK_CALL(ExceptionType, statement, ok_expr, describe_expr)                                             \
  do {                                                                                                                 \
    auto status = (statement);                                                                                         \
    if (!(ok_expr)) {                                                                                                  \
      throw ExceptionType(std::string(#statement) + " failed: " + std::string(describe_expr) + " (" + __FILE__ + ":" + \
                          std::to_string(__LINE__) + ")");                                                             \
    }                                                                                                                  \
  } while (0)
