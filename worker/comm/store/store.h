#pragma once

// Store: the key-value store ranks use to bootstrap (exchange transport addresses, agree on
// ids) — torch.distributed's Store contract. Implementations: HashStore (in-process), FileStore
// (file://, fcntl-locked, many processes), TcpStore (tcp://host:port), PrefixStore (a namespace
// over another store), and the coordinator-backed store (cohort://host:port/<job>).
//
// Keys are strings; values are byte strings. All methods are thread-safe. Every blocking method
// takes a timeout and returns DEADLINE_EXCEEDED naming the missing keys when it runs out.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"

namespace cohort::comm {

class Store {
 public:
  virtual ~Store() = default;

  // Sets `key` to `value`, replacing any previous value, and wakes waiters on `key`.
  virtual Status set(std::string_view key, std::string_view value) = 0;

  // Returns the value of `key`, waiting up to `timeout` for it to be set.
  virtual StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) = 0;

  // Atomically adds `delta` to the decimal integer stored at `key` (a missing key counts as 0)
  // and returns the new value. INVALID_ARGUMENT if the stored value is not an integer.
  virtual StatusOr<int64_t> add(std::string_view key, int64_t delta) = 0;

  // Atomically: if `key`'s value equals `expected` (a missing key equals only an empty
  // `expected`), sets it to `desired`. Returns the value stored afterwards (`desired` on success,
  // the current value otherwise; an empty string when the key is missing and was not set).
  virtual StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                            std::string_view desired) = 0;

  // Waits until every key in `keys` exists, up to `timeout`.
  virtual Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) = 0;

  // True when every key in `keys` exists now. Non-blocking.
  virtual StatusOr<bool> check(const std::vector<std::string>& keys) = 0;

  // Deletes `key`; returns whether it existed.
  virtual StatusOr<bool> delete_key(std::string_view key) = 0;

  // The number of keys stored.
  virtual StatusOr<int64_t> num_keys() = 0;
};

}  // namespace cohort::comm
