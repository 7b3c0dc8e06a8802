#include "worker/comm/store/hash_store.h"

#include "worker/comm/store/store_wait.h"

namespace cohort::comm {
namespace {

constexpr std::string_view kHashStoreName = "hash store";

}  // namespace

Status HashStore::set(std::string_view key, std::string_view value) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    table_.set(key, value);
  }
  key_added_.notify_all();
  return ok_status();
}

StatusOr<std::string> HashStore::get(std::string_view key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  COHORT_RETURN_IF_ERROR(wait_locked(lock, {std::string(key)}, timeout));
  return *table_.find(key);
}

StatusOr<int64_t> HashStore::add(std::string_view key, int64_t delta) {
  StatusOr<int64_t> sum = [&] {
    std::lock_guard<std::mutex> lock(mutex_);
    return table_.add(key, delta);
  }();
  if (!sum.ok()) return sum.status().with_context(kHashStoreName);
  key_added_.notify_all();
  return sum;
}

StatusOr<std::string> HashStore::compare_set(std::string_view key, std::string_view expected,
                                             std::string_view desired) {
  std::string after;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    after = table_.compare_set(key, expected, desired);
  }
  key_added_.notify_all();
  return after;
}

Status HashStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  return wait_locked(lock, keys, timeout);
}

StatusOr<bool> HashStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.contains_all(keys);
}

StatusOr<bool> HashStore::delete_key(std::string_view key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.erase(key);
}

StatusOr<int64_t> HashStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  return table_.size();
}

Status HashStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                              Duration timeout) {
  const Deadline deadline = store_deadline(timeout);
  const bool all_present =
      key_added_.wait_until(lock, deadline.at(), [&] { return table_.contains_all(keys); });
  if (all_present) return ok_status();
  return keys_timeout_error(kHashStoreName, table_.missing(keys), keys.size(), timeout);
}

}  // namespace cohort::comm
