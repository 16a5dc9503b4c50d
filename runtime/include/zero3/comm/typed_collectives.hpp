// Typed exchanges over the Bootstrap: a value (or an equal-length vector, or a string) from every rank,
// sums in rank order, a root's value on every rank. The byte packing lives here once instead of at each
// call site. Same contract as the Bootstrap calls they make: blocking, collective over all ranks, in the
// same order on every rank. Values are trivially copyable and travel as their bytes (every rank runs the
// same build on the same architecture).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "zero3/comm/communicator.hpp"

namespace zero3::comm {

// Every rank's `values` (the same length on every rank), concatenated in rank order: rank r's at
// [r * values.size(), (r + 1) * values.size()). One Bootstrap::all_gather.
template <class T>
std::vector<T> all_gather_vectors(Bootstrap& bootstrap, const std::vector<T>& values) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> mine(values.size() * sizeof(T));
  if (!mine.empty()) std::memcpy(mine.data(), values.data(), mine.size());
  const std::vector<std::byte> all = bootstrap.all_gather(mine);
  std::vector<T> out(all.size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), all.data(), out.size() * sizeof(T));
  return out;
}

// Every rank's `value`, in rank order. One Bootstrap::all_gather.
template <class T>
std::vector<T> all_gather_values(Bootstrap& bootstrap, const T& value) {
  return all_gather_vectors(bootstrap, std::vector<T>{value});
}

// The sum of every rank's `value`, added in rank order: the same bits on every rank.
template <class T>
T sum_over_ranks(Bootstrap& bootstrap, T value) {
  T sum{};
  for (const T& v : all_gather_values(bootstrap, value)) sum += v;
  return sum;
}

// Root's `value` on every rank. One Bootstrap::broadcast.
template <class T>
T broadcast_value(Bootstrap& bootstrap, const T& value, int root) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> bytes(sizeof(T));
  std::memcpy(bytes.data(), &value, sizeof(T));
  bootstrap.broadcast(bytes, root);
  T out;
  std::memcpy(&out, bytes.data(), sizeof(T));
  return out;
}

// Every rank's string, in rank order (any lengths): the lengths, then the strings padded to the longest
// (the second all_gather only when some string is not empty).
inline std::vector<std::string> all_gather_strings(Bootstrap& bootstrap, const std::string& mine) {
  const std::vector<std::uint64_t> lengths = all_gather_values<std::uint64_t>(bootstrap, mine.size());
  const std::uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<char> padded(static_cast<std::size_t>(longest));
  std::copy(mine.begin(), mine.end(), padded.begin());
  const std::vector<char> all = longest == 0 ? std::vector<char>{} : all_gather_vectors(bootstrap, padded);
  std::vector<std::string> out;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    const char* at = longest == 0 ? nullptr : all.data() + r * longest;
    out.emplace_back(at, at == nullptr ? 0 : static_cast<std::size_t>(lengths[r]));
  }
  return out;
}

// Root's string on every rank: its length, then its bytes (two Bootstrap::broadcast calls).
inline std::string broadcast_string(Bootstrap& bootstrap, const std::string& value, int root) {
  const auto length = broadcast_value<std::uint64_t>(bootstrap, value.size(), root);
  std::vector<std::byte> bytes(static_cast<std::size_t>(length));
  if (bootstrap.rank() == root && length > 0) std::memcpy(bytes.data(), value.data(), value.size());
  if (length > 0) bootstrap.broadcast(bytes, root);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace zero3::comm
