#pragma once

// KvStore: the in-memory key-value store behind one job attempt's `cohort://host:port/<job>` init
// method. Its operations and their semantics are torch.distributed's Store contract, the same as
// worker/comm's Store, so the gRPC adapter is a one-to-one mapping.
//
// Every blocking call takes a timeout and ends with DEADLINE_EXCEEDED naming the missing keys.
// close() ends the store for good: every waiter wakes at once and every later call returns the
// close reason — when an attempt fails, no rank is left waiting on a key its dead peer would
// have set.
//
// With a RendezvousJournal (a highly available coordinator, issue 16), every write is journaled
// before it becomes visible (see rendezvous_journal.h): a failed journal write changes nothing and
// returns UNAVAILABLE. Writes then take one journal round trip each, serialized per store (the
// journal's order is the store's order).
//
// Thread-safe: any number of threads (gRPC handlers) may call concurrently. Timeouts are real
// time (steady_clock): they bound real threads.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/rendezvous_journal.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Default wait for a key; as worker/comm's kDefaultStoreTimeout, generous because ranks of a large
// job may start minutes apart (image pulls, dataset staging).
inline constexpr Duration kDefaultStoreTimeout = std::chrono::minutes(5);

// Bounds of one attempt's store, so a buggy or hostile rank cannot grow the coordinator's memory
// without limit. A rendezvous needs a few short keys per rank (addresses, counters, NCCL ids of
// 128 bytes, UCX worker addresses of a few KiB): these leave room for jobs of many thousands of
// ranks. Over a limit, the call fails with RESOURCE_EXHAUSTED naming the limit.
inline constexpr size_t kMaxStoreKeyBytes = 4 * 1024;
inline constexpr size_t kMaxStoreValueBytes = 16 * 1024 * 1024;
inline constexpr size_t kMaxStoreKeys = 256 * 1024;
inline constexpr size_t kMaxStoreTotalBytes = 256 * 1024 * 1024;  // keys + values

// A request id (add / delete_key) is a client's own unique name for one call: a random client id
// and a counter fit in far less.
inline constexpr size_t kMaxRequestIdBytes = 128;

struct KvStoreLimits {
  size_t max_key_bytes = kMaxStoreKeyBytes;      // one key
  size_t max_value_bytes = kMaxStoreValueBytes;  // one value
  size_t max_keys = kMaxStoreKeys;               // keys held at once
  size_t max_total_bytes = kMaxStoreTotalBytes;  // every key and value together
};

class KvStore {
 public:
  // `name` appears in error messages ("store of job mnist-3 attempt 1").
  // `limits` bound its keys and values (tests shrink them). `journal` (not owned, may be null: memory
  // only) must outlive the store.
  explicit KvStore(std::string name, KvStoreLimits limits = {}, RendezvousJournal* journal = nullptr)
      : name_(std::move(name)), limits_(limits), journal_(journal) {}

  // Takes over a journal's contents (a coordinator taking over an attempt): keys, values and
  // answered requests. Call before any other method. Nothing is journaled.
  void restore(const RendezvousState& state);

  // Sets `key`, replacing any value, and wakes its waiters. RESOURCE_EXHAUSTED over a limit
  // (nothing changes then); the writing calls below check the same limits. Non-blocking.
  Status set(const std::string& key, std::string value);

  // The value of `key`, waiting up to `timeout` for it to be set. Blocking.
  StatusOr<std::string> get(const std::string& key, Duration timeout = kDefaultStoreTimeout);

  // Adds `delta` to the decimal integer at `key` (missing counts as 0) and returns the new value.
  // INVALID_ARGUMENT when the value is not an integer; OUT_OF_RANGE on overflow. Non-blocking.
  // `request_id` (empty: none) makes it safe to send again: a request id already answered gets
  // that answer back and adds nothing (the newest kMaxAnsweredRequests ids are remembered).
  StatusOr<int64_t> add(const std::string& key, int64_t delta, const std::string& request_id = "");

  // If `key` holds `expected` (a missing key matches only an empty `expected`), stores `desired`.
  // Returns the value afterwards: `desired` when swapped, else the current value ("" if missing).
  // Sent again after it swapped, it answers `desired` again (the key holds it), so it needs no
  // request id. Non-blocking.
  StatusOr<std::string> compare_set(const std::string& key, const std::string& expected, std::string desired);

  // Waits up to `timeout` until every key exists. Blocking.
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout);

  // Whether every key exists now. Non-blocking.
  StatusOr<bool> check(const std::vector<std::string>& keys) const;

  // Deletes `key`; returns whether it existed. `request_id` as for add(). Non-blocking.
  StatusOr<bool> delete_key(const std::string& key, const std::string& request_id = "");

  // The number of keys. Non-blocking.
  StatusOr<int64_t> num_keys() const;

  // Ends the store: waiters return `reason` now, later calls return it too. The first reason
  // wins; an OK reason becomes CANCELLED. Non-blocking.
  void close(Status reason);

 private:
  // Blocks until every key exists, the store closes, or the deadline passes. `op` names the
  // calling operation for the timeout message.
  Status wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                     Duration timeout, std::string_view op);
  bool has_all_locked(const std::vector<std::string>& keys) const;
  // OK when storing `value` at `key` keeps the store within its limits; `op` names the call.
  Status check_limits_locked(std::string_view op, const std::string& key, size_t value_size) const;
  // Stores `value` at `key`, keeping total_bytes_ current.
  void put_locked(const std::string& key, std::string value);
  // The answer remembered for `request_id`, if any. INVALID_ARGUMENT for an id over
  // kMaxRequestIdBytes.
  StatusOr<const std::string*> answered_locked(std::string_view op, const std::string& request_id) const;
  // Journals `key` := `value` (nullopt: deleted) with `request_id`'s `answer` (when the id is not
  // empty); OK without a journal. UNAVAILABLE naming `op` when the journal write fails. On success
  // the answer is remembered (evicting the oldest beyond kMaxAnsweredRequests).
  Status journal_locked(std::string_view op, const std::string& key, const std::optional<std::string>& value,
                        const std::string& request_id, const std::string& answer);

  const std::string name_;
  const KvStoreLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // notified on set / add / compare_set / close
  std::map<std::string, std::string> data_;
  size_t total_bytes_ = 0;  // sum of key and value sizes in data_
  Status closed_;           // OK while open
  RendezvousJournal* const journal_;             // null: memory only
  std::map<std::string, std::string> answered_;  // request id -> answer
  std::deque<std::string> answered_order_;       // request ids, oldest first
};

}  // namespace cohort::coordinator
