// The device the engine tests run on, and host access to an engine's device buffers through explicit
// staging copies on the compute stream. ZERO3_TEST_DEVICE picks the device: "host" (the default), "cuda" or
// "auto"; mpi_main.cpp skips the whole program (exit code 77) when "cuda" is asked for and no CUDA device is
// usable. The staging path is used on every device, host included (a host-to-host copy there), so a host
// run exercises the same code a CUDA run does. Conversions between float and the buffer's dtype are exact
// round trips for values already in that dtype.
#pragma once

#include <cstdlib>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "zero3/core/buffer_view.hpp"
#include "zero3/core/dtype.hpp"
#include "zero3/core/memory.hpp"
#include "zero3/device/device.hpp"

namespace zero3::test {

// The value of ZERO3_TEST_DEVICE ("host" when unset or empty), for the config's "zero3": {"device": ...}.
inline std::string test_device_name() {
  const char* v = std::getenv("ZERO3_TEST_DEVICE");
  const std::string name = v == nullptr || *v == '\0' ? "host" : v;
  if (name != "host" && name != "cuda" && name != "auto") {
    throw std::runtime_error("ZERO3_TEST_DEVICE must be host, cuda or auto, not '" + name + "'");
  }
  return name;
}

// True when ZERO3_TEST_DEVICE asks for a CUDA device and none is usable.
inline bool test_device_unavailable() {
  return test_device_name() == "cuda" && cuda_device_count() == 0;
}

// The device kind the engine makes for test_device_name().
inline DeviceKind test_device_kind() {
  const std::string name = test_device_name();
  if (name == "cuda") return DeviceKind::cuda;
  if (name == "auto" && cuda_device_count() > 0) return DeviceKind::cuda;
  return DeviceKind::host;
}

// Copies `src` (device memory of any dtype) to the host as floats: device -> pageable staging buffer on
// `stream`, then waits for the stream (so everything enqueued on it before, e.g. a gather it waits for, is
// done) and widens each element.
inline std::vector<float> download_floats(Device& device, Stream& stream, ConstBufferView src) {
  std::vector<float> out(src.count);
  if (src.count == 0) return out;
  Buffer staging = device.allocate(src.count, src.dtype, MemoryKind::pageable_host, MemCategory::staging);
  device.copy_async(staging.view(), src, stream);
  stream.synchronize();
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = load_as_float(staging.data(), staging.dtype(), i);
  return out;
}

// Writes `values` into `dst` (device memory of any dtype): narrows them into a pageable staging buffer and
// copies it to `dst` on `stream`, in stream order; waits for the copy before the staging buffer is freed.
inline void upload_floats(Device& device, Stream& stream, BufferView dst, std::span<const float> values) {
  if (values.size() != dst.count) {
    throw std::runtime_error("upload_floats: " + std::to_string(values.size()) + " values for a view of " +
                             std::to_string(dst.count) + " elements");
  }
  if (dst.count == 0) return;
  Buffer staging = device.allocate(dst.count, dst.dtype, MemoryKind::pageable_host, MemCategory::staging);
  for (std::size_t i = 0; i < values.size(); ++i) store_from_float(staging.data(), staging.dtype(), i, values[i]);
  device.copy_async(dst, staging.cview(), stream);
  stream.synchronize();
}

}  // namespace zero3::test
