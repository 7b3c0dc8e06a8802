#pragma once

// PrefixStore: a namespace over another store (c10d's PrefixStore). Every key is stored as
// "<prefix>/<key>", so groups, communicators or job attempts sharing one store cannot collide.
// Thread-safe when the underlying store is; shares ownership of it.

#include <memory>
#include <string>

#include "worker/comm/store/store.h"

namespace cohort::comm {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying() const { return store_; }

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  // The underlying store's count, every namespace included (as c10d's PrefixStore): stores
  // cannot enumerate keys, so a per-prefix count is not available.
  StatusOr<int64_t> num_keys() override;

 private:
  std::string prefixed(std::string_view key) const;
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;

  const std::string prefix_;
  const std::shared_ptr<Store> store_;
};

}  // namespace cohort::comm
