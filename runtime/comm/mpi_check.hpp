// ZERO3_MPI_CHECK(call): throws CommError naming the call, MPI's error string, file and line when an
// MPI function does not return MPI_SUCCESS (our communicators use MPI_ERRORS_RETURN, so errors come
// back instead of aborting). ZERO3_MPI_CHECK_NOTHROW logs instead, for destructors. Private to comm/.
#pragma once

#include <mpi.h>

#include <string>

#include "zero3/core/error.hpp"
#include "zero3/core/log.hpp"

namespace zero3::comm::detail {

inline std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length)) + " (MPI error " + std::to_string(code) + ")";
}

}  // namespace zero3::comm::detail

#define ZERO3_MPI_CHECK(call) \
  ZERO3_CHECK_CALL(::zero3::CommError, call, status == MPI_SUCCESS, ::zero3::comm::detail::mpi_error_string(status))

#define ZERO3_MPI_CHECK_NOTHROW(call)                                                                               \
  do {                                                                                                              \
    const int status = (call);                                                                                      \
    if (status != MPI_SUCCESS) {                                                                                    \
      ::zero3::log::warn("{} failed: {} ({}:{})", #call, ::zero3::comm::detail::mpi_error_string(status), __FILE__, \
                         __LINE__);                                                                                 \
    }                                                                                                               \
  } while (0)
