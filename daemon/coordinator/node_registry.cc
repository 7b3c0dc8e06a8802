#include "daemon/coordinator/node_registry.h"

#include <algorithm>
#include <utility>

namespace cohort::coordinator {

Status NodeRegistry::validate(const NodeInfo& info) {
  if (info.node_id.empty()) return invalid_argument_error("node registration: node_id is empty");
  if (info.address.empty()) {
    return invalid_argument_error("node '{}': address is empty; the agent must report its host:port",
                                  info.node_id);
  }
  if (info.slots < 1) {
    return invalid_argument_error("node '{}': slots is {}; a node needs at least 1 slot", info.node_id,
                                  info.slots);
  }
  std::set<int> indexes;
  for (const GpuInfo& gpu : info.gpus) {
    if (gpu.index < 0 || !indexes.insert(gpu.index).second) {
      return invalid_argument_error("node '{}': GPU index {} is negative or listed twice", info.node_id,
                                    gpu.index);
    }
  }
  return ok_status();
}

Status NodeRegistry::register_node(NodeInfo info, TimePoint now) {
  COHORT_RETURN_IF_ERROR(validate(info));
  Entry entry;
  entry.info = std::move(info);
  entry.lease_expiry = now + lease_;
  const std::string id = entry.info.node_id;
  nodes_[id] = std::move(entry);
  return ok_status();
}

Status NodeRegistry::restore_node(NodeInfo info, TimePoint now) {
  COHORT_RETURN_IF_ERROR(validate(info));
  if (nodes_.count(info.node_id) != 0) return ok_status();  // registered since: that record is newer
  Entry entry;
  entry.info = std::move(info);
  entry.lease_expiry = now + lease_;
  entry.awaiting_registration = true;
  const std::string id = entry.info.node_id;
  nodes_[id] = std::move(entry);
  return ok_status();
}

Status NodeRegistry::heartbeat(const std::string& node_id, TimePoint now, bool unschedulable) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) {
    return not_found_error(
        "node '{}' is not registered (its lease expired or the coordinator restarted); register again",
        node_id);
  }
  if (it->second.awaiting_registration) {
    // The lease is not renewed either: only a registration (with the attempts the agent runs) makes
    // the node this coordinator's.
    return not_found_error(
        "node '{}' is known from the job store but has not registered with this coordinator since it took "
        "over; register again, reporting the tasks it runs",
        node_id);
  }
  it->second.lease_expiry = now + lease_;
  it->second.unschedulable = unschedulable;
  // The agent is alive after all, unless it has been unreachable for calls again and again.
  if (now >= it->second.suspect_until) it->second.suspect_reason.clear();
  return ok_status();
}

StatusOr<Duration> NodeRegistry::mark_suspect(const std::string& node_id, std::string reason, TimePoint now) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return not_found_error("cannot mark node '{}' suspect: it is not registered", node_id);
  Entry& entry = it->second;
  entry.suspect_reason = std::move(reason);
  ++entry.unreachable_streak;
  const Duration hold = suspect_hold(entry.unreachable_streak);
  entry.suspect_until = now + hold;
  return hold;
}

Duration NodeRegistry::suspect_hold(int streak) {
  if (streak < 2) return Duration(0);
  Duration hold = kSuspectHoldBase;
  for (int i = 2; i < streak && hold < kSuspectHoldMax; ++i) hold *= 2;
  return std::min<Duration>(hold, kSuspectHoldMax);
}

void NodeRegistry::launch_succeeded(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it != nodes_.end()) it->second.unreachable_streak = 0;
}

std::vector<std::string> NodeRegistry::expire(TimePoint now) {
  std::vector<std::string> lost;
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    if (now > it->second.lease_expiry) {
      lost.push_back(it->first);
      it = nodes_.erase(it);
    } else {
      ++it;
    }
  }
  return lost;
}

Status NodeRegistry::reserve(const std::string& node_id, int slots, const std::vector<int>& gpus) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end())
    return not_found_error("cannot reserve on node '{}': it is not registered", node_id);
  Entry& entry = it->second;
  const int free_slots = entry.info.slots - entry.used_slots;
  if (slots > free_slots) {
    return resource_exhausted_error("node '{}' has {} free slots; {} requested", node_id, free_slots, slots);
  }
  std::set<int> known;
  for (const GpuInfo& gpu : entry.info.gpus) known.insert(gpu.index);
  for (int gpu : gpus) {
    if (known.count(gpu) == 0 || entry.used_gpus.count(gpu) != 0) {
      return resource_exhausted_error("node '{}': GPU {} is not free", node_id, gpu);
    }
  }
  entry.used_slots += slots;
  entry.used_gpus.insert(gpus.begin(), gpus.end());
  return ok_status();
}

void NodeRegistry::release(const std::string& node_id, int slots, const std::vector<int>& gpus) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  Entry& entry = it->second;
  entry.used_slots = std::max(0, entry.used_slots - slots);
  for (int gpu : gpus) entry.used_gpus.erase(gpu);
}

NodeStatus NodeRegistry::status_of(const Entry& entry) {
  NodeStatus status;
  status.info = entry.info;
  status.free_slots = entry.info.slots - entry.used_slots;
  for (const GpuInfo& gpu : entry.info.gpus) {
    if (entry.used_gpus.count(gpu.index) == 0) status.free_gpus.push_back(gpu.index);
  }
  std::sort(status.free_gpus.begin(), status.free_gpus.end());
  status.lease_expiry = entry.lease_expiry;
  status.unschedulable = entry.unschedulable;
  status.suspect_reason = entry.suspect_reason;
  status.awaiting_registration = entry.awaiting_registration;
  if (!status.schedulable()) {  // draining, suspect or restored: placement must not pick it
    status.free_slots = 0;
    status.free_gpus.clear();
  }
  return status;
}

std::vector<NodeStatus> NodeRegistry::list() const {
  std::vector<NodeStatus> out;
  out.reserve(nodes_.size());
  for (const auto& item : nodes_) out.push_back(status_of(item.second));
  return out;
}

}  // namespace cohort::coordinator
