// Resizing the host models' activation buffers so that their capacity is the largest size each was asked
// for: std::vector's own growth may double it, which made the bytes held depend on the order of the sizes
// (a train pass, then a larger held-out pass) and not only on the sizes. The memory plan
// (UnitModel::planned_activation_bytes) counts on it.
#pragma once

#include <cstddef>

namespace zero3::models::detail {

template <typename Vector>
void resize_exact(Vector& v, std::size_t n) {
  if (n > v.capacity()) v.reserve(n);
  v.resize(n);
}

}  // namespace zero3::models::detail
