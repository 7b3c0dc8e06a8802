#include "daemon/etcd/etcd_compactor.h"

#include <spdlog/spdlog.h>

namespace cohort::etcd {

EtcdCompactor::EtcdCompactor(EtcdClient* client, std::chrono::milliseconds interval)
    : client_(client), interval_(interval) {}

Status EtcdCompactor::tick(std::chrono::steady_clock::time_point now) {
  if (started_ && now < next_) return ok_status();
  started_ = true;
  next_ = now + interval_;
  if (pending_ > compacted_) {
    Status compacted = client_->compact(pending_);
    if (!compacted.ok() && !EtcdClient::is_compacted_error(compacted)) {
      return Status(compacted.code(), fmt::format("compacting etcd's history at revision {} (to keep its database "
                                                  "below its space quota): {}; trying again in {} ms",
                                                  pending_, compacted.message(), interval_.count()));
    }
    // Compacted past it already (another coordinator, or etcd's own --auto-compaction): done too.
    spdlog::info("etcd history compacted at revision {}", pending_);
    compacted_ = pending_;
  }
  // Any key's Range answers with the store's revision; the key itself need not exist.
  StatusOr<RangeResult> current = client_->range("/", "", 1);
  if (!current.ok()) {
    return Status(current.status().code(),
                  fmt::format("reading etcd's revision for its next compaction: {}", current.status().message()));
  }
  pending_ = current->revision;
  return ok_status();
}

}  // namespace cohort::etcd
