#include "zero3/core/error.hpp"

namespace zero3::detail {

void throw_check_failure(std::string_view kind, std::string_view statement, std::string_view detail, const char* file,
                         int line) {
  std::string msg;
  msg.append(kind).append(" failed: ").append(statement);
  if (!detail.empty()) msg.append(": ").append(detail);
  msg.append(" (").append(file).append(":").append(std::to_string(line)).append(")");
  throw UsageError(msg);
}

}  // namespace zero3::detail
