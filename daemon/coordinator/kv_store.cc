#include "daemon/coordinator/kv_store.h"

#include <charconv>
#include <utility>

namespace cohort::coordinator {

Status KvStore::set(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  data_[key] = std::move(value);
  changed_.notify_all();
  return ok_status();
}

StatusOr<std::string> KvStore::get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  COHORT_RETURN_IF_ERROR(wait_locked(lock, {key}, timeout, "get"));
  return data_.at(key);
}

StatusOr<int64_t> KvStore::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  int64_t value = 0;
  auto it = data_.find(key);
  if (it != data_.end()) {
    const std::string& text = it->second;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return invalid_argument_error("add('{}') on {}: the key holds '{}', not a decimal integer", key, name_,
                                    text);
    }
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(value, delta, &sum)) {
    return out_of_range_error("add('{}', {}) on {}: {} + {} overflows int64", key, delta, name_, value,
                              delta);
  }
  data_[key] = std::to_string(sum);
  changed_.notify_all();
  return sum;
}

StatusOr<std::string> KvStore::compare_set(const std::string& key, const std::string& expected,
                                           std::string desired) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  auto it = data_.find(key);
  const bool matches = it == data_.end() ? expected.empty() : it->second == expected;
  if (!matches) return it == data_.end() ? std::string() : it->second;
  data_[key] = desired;
  changed_.notify_all();
  return desired;
}

Status KvStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return wait_locked(lock, keys, timeout, "wait");
}

StatusOr<bool> KvStore::check(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  return has_all_locked(keys);
}

StatusOr<bool> KvStore::delete_key(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  return data_.erase(key) != 0;
}

StatusOr<int64_t> KvStore::num_keys() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  return static_cast<int64_t>(data_.size());
}

void KvStore::close(Status reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return;
  closed_ = reason.ok() ? cancelled_error("{} was closed", name_) : std::move(reason);
  changed_.notify_all();
}

bool KvStore::has_all_locked(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (data_.count(key) == 0) return false;
  }
  return true;
}

Status KvStore::wait_locked(std::unique_lock<std::mutex>& lock, const std::vector<std::string>& keys,
                            Duration timeout, std::string_view op) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  changed_.wait_until(lock, deadline, [&] { return !closed_.ok() || has_all_locked(keys); });
  if (!closed_.ok()) return closed_;
  if (has_all_locked(keys)) return ok_status();
  std::string missing;
  for (const std::string& key : keys) {
    if (data_.count(key) != 0) continue;
    if (!missing.empty()) missing += ", ";
    missing += "'" + key + "'";
  }
  return deadline_exceeded_error("{} on {} timed out after {}: key(s) {} never set; is every rank running?",
                                 op, name_, format_duration(timeout), missing);
}

}  // namespace cohort::coordinator
