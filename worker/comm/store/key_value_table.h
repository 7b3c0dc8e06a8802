#pragma once

// KeyValueTable: the Store semantics (set, add, compare_set, delete, ...) over an in-memory map,
// written once and shared by HashStore, the TcpStore server and FileStore's replayed log, so the
// three agree on every edge case (a missing key in add and compare_set, non-integer counters).
//
// Not thread-safe: each owner guards it with its own lock (or, in the tcp server, one thread).

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"

namespace cohort::comm {

class KeyValueTable {
 public:
  void set(std::string_view key, std::string_view value);

  // The value of `key`, or nullptr when missing. Valid until the next mutation.
  const std::string* find(std::string_view key) const;

  // Adds `delta` to the decimal integer at `key` (missing counts as 0), stores and returns the
  // sum. INVALID_ARGUMENT when the value is not an integer, OUT_OF_RANGE on int64 overflow; the
  // table is unchanged on error.
  StatusOr<int64_t> add(std::string_view key, int64_t delta);

  // Store::compare_set: sets `desired` when the value equals `expected` (a missing key equals
  // only an empty `expected`); returns the value afterwards ("" when missing and not set) and, in
  // `*swapped` when given, whether it set `desired`.
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired,
                          bool* swapped = nullptr);

  // Returns whether `key` existed.
  bool erase(std::string_view key);

  // The keys of `keys` that are missing, in the given order.
  std::vector<std::string> missing(const std::vector<std::string>& keys) const;
  bool contains_all(const std::vector<std::string>& keys) const;

  int64_t size() const { return static_cast<int64_t>(entries_.size()); }
  // Bytes of every key and value stored (what a limit on the store's size counts).
  size_t bytes() const { return bytes_; }
  void clear() {
    entries_.clear();
    bytes_ = 0;
  }

 private:
  size_t bytes_ = 0;
  // std::less<> makes lookups by string_view allocation-free.
  std::map<std::string, std::string, std::less<>> entries_;
};

}  // namespace cohort::comm
