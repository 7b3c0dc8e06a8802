#pragma once

// HashStore: an in-process Store (c10d's HashStore) for ranks that are threads of one process —
// unit tests and single-process runs. All methods are thread-safe; get and wait block on a
// condition variable until the keys appear or the timeout passes.

#include <condition_variable>
#include <mutex>

#include "worker/comm/store/key_value_table.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

class HashStore : public Store {
 public:
  HashStore() = default;

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  StatusOr<int64_t> num_keys() override;

 private:
  // Blocks with `lock` held until `keys` all exist or `timeout` passes.
  Status wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                     Duration timeout);

  std::mutex mutex_;
  // Notified on every mutation that may create a key (set, add, compare_set).
  std::condition_variable key_added_;
  KeyValueTable table_;
};

}  // namespace cohort::comm
