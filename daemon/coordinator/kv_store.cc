#include "daemon/coordinator/kv_store.h"

#include <charconv>
#include <utility>

namespace cohort::coordinator {

void KvStore::restore(const RendezvousState& state) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [key, value] : state.data) put_locked(key, value);
  for (const AnsweredRequest& request : state.answered) {
    if (answered_.emplace(request.id, request.answer).second) answered_order_.push_back(request.id);
  }
}

Status KvStore::set(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  COHORT_RETURN_IF_ERROR(check_limits_locked("set", key, value.size()));
  COHORT_RETURN_IF_ERROR(journal_locked("set", key, value, "", ""));
  put_locked(key, std::move(value));
  changed_.notify_all();
  return ok_status();
}

StatusOr<std::string> KvStore::get(const std::string& key, Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  COHORT_RETURN_IF_ERROR(wait_locked(lock, {key}, timeout, "get"));
  return data_.at(key);
}

StatusOr<int64_t> KvStore::add(const std::string& key, int64_t delta, const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  COHORT_ASSIGN_OR_RETURN(const std::string* answer, answered_locked("add", request_id));
  if (answer != nullptr) {
    int64_t sum = 0;
    auto [end, ec] = std::from_chars(answer->data(), answer->data() + answer->size(), sum);
    if (ec == std::errc() && end == answer->data() + answer->size()) return sum;
    return internal_error("add('{}') on {}: request {} was answered '{}', not a number", key, name_,
                          request_id, *answer);
  }
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
  std::string text = std::to_string(sum);
  COHORT_RETURN_IF_ERROR(check_limits_locked("add", key, text.size()));
  COHORT_RETURN_IF_ERROR(journal_locked("add", key, text, request_id, text));
  put_locked(key, std::move(text));
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
  COHORT_RETURN_IF_ERROR(check_limits_locked("compare_set", key, desired.size()));
  COHORT_RETURN_IF_ERROR(journal_locked("compare_set", key, desired, "", ""));
  put_locked(key, desired);
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

StatusOr<bool> KvStore::delete_key(const std::string& key, const std::string& request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  COHORT_ASSIGN_OR_RETURN(const std::string* answer, answered_locked("delete", request_id));
  if (answer != nullptr) return *answer == "1";
  auto it = data_.find(key);
  // Nothing to journal: sent again, it finds the key missing again and answers the same.
  if (it == data_.end()) return false;
  COHORT_RETURN_IF_ERROR(journal_locked("delete", key, std::nullopt, request_id, "1"));
  total_bytes_ -= it->first.size() + it->second.size();
  data_.erase(it);
  return true;
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

Status KvStore::check_limits_locked(std::string_view op, const std::string& key, size_t value_size) const {
  constexpr const char* kWhere = "daemon/coordinator/kv_store.h";
  if (key.size() > limits_.max_key_bytes) {
    return resource_exhausted_error(
        "{} on {}: the key is {} bytes; keys are limited to {} bytes (kMaxStoreKeyBytes in {}); use "
        "shorter keys",
        op, name_, key.size(), limits_.max_key_bytes, kWhere);
  }
  if (value_size > limits_.max_value_bytes) {
    return resource_exhausted_error(
        "{}('{}') on {}: the value is {} bytes; values are limited to {} bytes (kMaxStoreValueBytes in {}); "
        "exchange large data over the job's own connections, not the rendezvous store",
        op, key, name_, value_size, limits_.max_value_bytes, kWhere);
  }
  auto it = data_.find(key);
  const bool is_new = it == data_.end();
  if (is_new && data_.size() >= limits_.max_keys) {
    return resource_exhausted_error(
        "{}('{}') on {}: the store holds {} keys, its limit (kMaxStoreKeys in {}); delete keys no longer "
        "needed",
        op, key, name_, data_.size(), limits_.max_keys, kWhere);
  }
  const size_t old_bytes = is_new ? 0 : it->first.size() + it->second.size();
  const size_t new_total = total_bytes_ - old_bytes + key.size() + value_size;
  if (new_total > limits_.max_total_bytes) {
    return resource_exhausted_error(
        "{}('{}') on {}: the store would hold {} bytes; its limit is {} bytes (kMaxStoreTotalBytes in {}); "
        "delete keys no longer needed",
        op, key, name_, new_total, limits_.max_total_bytes, kWhere);
  }
  return ok_status();
}

void KvStore::put_locked(const std::string& key, std::string value) {
  auto [it, inserted] = data_.try_emplace(key);
  if (inserted) {
    total_bytes_ += key.size();
  } else {
    total_bytes_ -= it->second.size();
  }
  total_bytes_ += value.size();
  it->second = std::move(value);
}

StatusOr<const std::string*> KvStore::answered_locked(std::string_view op,
                                                      const std::string& request_id) const {
  if (request_id.size() > kMaxRequestIdBytes) {
    return invalid_argument_error(
        "{} on {}: the request id is {} bytes; request ids are limited to {} bytes "
        "(kMaxRequestIdBytes in daemon/coordinator/kv_store.h)",
        op, name_, request_id.size(), kMaxRequestIdBytes);
  }
  if (request_id.empty()) return static_cast<const std::string*>(nullptr);
  auto it = answered_.find(request_id);
  return it == answered_.end() ? nullptr : &it->second;
}

Status KvStore::journal_locked(std::string_view op, const std::string& key,
                               const std::optional<std::string>& value, const std::string& request_id,
                               const std::string& answer) {
  const bool remember = !request_id.empty();
  std::vector<std::string> forget;
  if (remember && answered_order_.size() >= kMaxAnsweredRequests) {
    forget.assign(answered_order_.begin(),
                  answered_order_.begin() +
                      static_cast<std::ptrdiff_t>(answered_order_.size() + 1 - kMaxAnsweredRequests));
  }
  if (journal_ != nullptr) {
    Status written = journal_->write_key(
        key, value, remember ? AnsweredRequest{request_id, answer} : AnsweredRequest{}, forget);
    if (!written.ok()) {
      // UNAVAILABLE either way: a deposed leader's client moves to the new leader and sends it again.
      return unavailable_error("{}('{}') on {}: the coordinator could not journal it, so nothing changed: {}",
                               op, key, name_, written.message());
    }
  }
  if (remember) {
    for (size_t i = 0; i < forget.size(); ++i) {
      answered_.erase(answered_order_.front());
      answered_order_.pop_front();
    }
    answered_.emplace(request_id, answer);
    answered_order_.push_back(request_id);
  }
  return ok_status();
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
