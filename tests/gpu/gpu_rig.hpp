// A host device (the reference) and CUDA device 0, with a stream each and pinned staging between, for
// the tests that compare CUDA kernels with the host ones.
#pragma once

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "zero3/core/dtype.hpp"
#include "zero3/device/device.hpp"

namespace zero3::test {

struct GpuRig {
  std::unique_ptr<Device> host = make_host_device();
  std::unique_ptr<Stream> host_stream = host->create_stream("reference");
  std::unique_ptr<Device> gpu = make_cuda_device(0);
  std::unique_ptr<Stream> gpu_stream = gpu->create_stream("kernels-test");

  Buffer host_buffer(std::size_t n, DType t) {
    return host->allocate(n, t, MemoryKind::device, MemCategory::workspace);
  }

  // Copies a host-device buffer into a device buffer of the same dtype and count.
  void upload_into(Buffer& d, const Buffer& h) {
    if (h.count() == 0) return;
    Buffer staging = gpu->allocate(h.count(), h.dtype(), MemoryKind::pinned_host, MemCategory::staging);
    std::memcpy(staging.data(), h.data(), h.size_bytes());
    gpu->copy_async(d.view(), staging.cview(), *gpu_stream);
    gpu_stream->synchronize();
  }
  // A device copy of a host-device buffer.
  Buffer upload(const Buffer& h) {
    Buffer d = gpu->allocate(h.count(), h.dtype(), MemoryKind::device, MemCategory::workspace);
    upload_into(d, h);
    return d;
  }

  // The bytes of a device buffer, after everything enqueued on the GPU stream so far.
  std::vector<unsigned char> download(const Buffer& d) {
    std::vector<unsigned char> bytes(d.size_bytes());
    if (d.count() == 0) {
      gpu_stream->synchronize();
      return bytes;
    }
    Buffer staging = gpu->allocate(d.count(), d.dtype(), MemoryKind::pinned_host, MemCategory::staging);
    gpu->copy_async(staging.view(), d.cview(), *gpu_stream);
    gpu_stream->synchronize();
    std::memcpy(bytes.data(), staging.data(), bytes.size());
    return bytes;
  }
};

// Element-wise equality of a device result with the host one: bitwise, except that a NaN only has to
// be a NaN (GPU arithmetic makes canonical NaNs, x86 propagates the input's).
inline void check_same(const std::vector<unsigned char>& dev, const Buffer& ref) {
  REQUIRE(dev.size() == ref.size_bytes());
  const std::size_t w = size_of(ref.dtype());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < ref.count(); ++i) {
    const double want = load_as_float(ref.data(), ref.dtype(), i);
    const double got = load_as_float(dev.data(), ref.dtype(), i);
    const bool ok = std::isnan(want)
                        ? std::isnan(got)
                        : std::memcmp(dev.data() + i * w, static_cast<const char*>(ref.data()) + i * w, w) == 0;
    if (!ok && ++bad <= 5) {
      INFO("element " << i << ": device " << got << ", host " << want);
      CHECK(false);
    }
  }
  CHECK(bad == 0);
}

}  // namespace zero3::test
