#include "worker/comm/store/prefix_store.h"

namespace cohort::comm {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : prefix_(std::move(prefix)), store_(std::move(store)) {}

std::string PrefixStore::prefixed(std::string_view key) const {
  std::string out;
  out.reserve(prefix_.size() + 1 + key.size());
  return out.append(prefix_).append("/").append(key);
}

std::vector<std::string> PrefixStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& key : keys) out.push_back(prefixed(key));
  return out;
}

// Errors pass through unchanged: they name the full "<prefix>/<key>", which is what is in the
// underlying store and what another process would look for.
Status PrefixStore::set(std::string_view key, std::string_view value) {
  return store_->set(prefixed(key), value);
}

StatusOr<std::string> PrefixStore::get(std::string_view key, Duration timeout) {
  return store_->get(prefixed(key), timeout);
}

StatusOr<int64_t> PrefixStore::add(std::string_view key, int64_t delta) {
  return store_->add(prefixed(key), delta);
}

StatusOr<std::string> PrefixStore::compare_set(std::string_view key, std::string_view expected,
                                               std::string_view desired) {
  return store_->compare_set(prefixed(key), expected, desired);
}

Status PrefixStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  return store_->wait(prefixed(keys), timeout);
}

StatusOr<bool> PrefixStore::check(const std::vector<std::string>& keys) {
  return store_->check(prefixed(keys));
}

StatusOr<bool> PrefixStore::delete_key(std::string_view key) { return store_->delete_key(prefixed(key)); }

StatusOr<int64_t> PrefixStore::num_keys() { return store_->num_keys(); }

}  // namespace cohort::comm
