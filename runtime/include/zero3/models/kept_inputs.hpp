// The unit inputs full recomputation keeps, moved out of a host model's working memory (DeepSpeed's
// activation_checkpointing.cpu_checkpointing): a slot's values are copied into a host store after the forward
// that last reads them, so that the model's working buffers can take turns (two serve every unit's input and
// output), and copied back into a working buffer before the backward that reads them. On the host device the
// working memory is host memory too and
// there is no copy engine: a copy takes the cores and the memory bandwidth that compute would, so the copies
// run on the calling thread and all of their time is exposed (take_copy_ms). The values are copied exactly:
// gradients stay bitwise those of keeping the inputs in place.
//
//   KeptInputs<float> kept;
//   kept.set_enabled(true);
//   kept.offload(slot, working[slot % 2]);   // after the last forward that reads it
//   kept.restore(slot, working[slot % 2]);   // before the backward that reads it
#pragma once

#include <chrono>
#include <cstddef>
#include <utility>
#include <vector>

namespace zero3::models {

template <typename T>
class KeptInputs {
 public:
  bool enabled() const { return enabled_; }
  void set_enabled(bool on) {
    enabled_ = on;
    if (!on) host_ = {};
  }

  void offload(std::size_t slot, std::vector<T>& working) {
    const auto t0 = std::chrono::steady_clock::now();
    if (host_.size() <= slot) host_.resize(slot + 1);
    std::vector<T>& h = host_[slot];
    if (h.capacity() < working.size()) h.reserve(working.size());
    h.assign(working.begin(), working.end());
    copy_ms_ += ms_since(t0);
  }
  void restore(std::size_t slot, std::vector<T>& working) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<T>& h = host_.at(slot);
    if (working.capacity() < h.size()) working.reserve(h.size());
    working.assign(h.begin(), h.end());
    copy_ms_ += ms_since(t0);
  }

  std::size_t host_bytes() const {
    std::size_t n = 0;
    for (const std::vector<T>& h : host_) n += h.capacity();
    return n * sizeof(T);
  }
  double take_copy_ms() { return std::exchange(copy_ms_, 0.0); }

 private:
  static double ms_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  }

  bool enabled_ = false;
  std::vector<std::vector<T>> host_;
  double copy_ms_ = 0.0;
};

}  // namespace zero3::models
