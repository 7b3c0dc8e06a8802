#pragma once

// NodeRegistry: the nodes the coordinator may place work on. A node registers with its capacity
// and then holds a lease that each heartbeat renews; a node whose lease runs out is lost (its
// agent crashed, its machine died, or the network split) and expire() removes it so that the
// Coordinator can fail or restart the jobs that ran there.
//
// The registry also keeps each node's reservations (slots and GPUs held by placed attempts), so
// free capacity is known in one place.
//
// Not thread-safe: the Coordinator serializes every call under its own lock. Non-blocking.

#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "daemon/coordinator/clock.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// How long a node stays alive without a heartbeat. 15 s tolerates a few lost heartbeats and a
// loaded coordinator, yet fails a dead node's jobs quickly enough that nobody waits on it long.
inline constexpr Duration kDefaultNodeLease = std::chrono::seconds(15);
// Agents heartbeat this many times per lease, so a single lost heartbeat never loses a node.
inline constexpr int kHeartbeatsPerLease = 3;
// How long a node that was unreachable for two launches in a row stays suspect whatever its
// heartbeats say (doubling with each further one, up to the max): see NodeRegistry::mark_suspect.
inline constexpr Duration kSuspectHoldBase = std::chrono::seconds(15);
inline constexpr Duration kSuspectHoldMax = std::chrono::minutes(5);

struct GpuInfo {
  int index = 0;             // CUDA device index on the node
  std::string model;         // e.g. "NVIDIA H100 80GB HBM3"
  int64_t memory_bytes = 0;  // device memory
};

// A node as its agent describes it.
struct NodeInfo {
  std::string node_id;       // unique in the cluster
  std::string address;       // the agent's host:port
  std::string hostname;      // the machine's host name
  int cores = 0;             // CPU cores for workers
  int64_t memory_bytes = 0;  // memory for workers
  std::vector<GpuInfo> gpus;
  int slots = 0;  // worker processes it runs at once (>= 1)
};

inline bool operator==(const GpuInfo& a, const GpuInfo& b) {
  return a.index == b.index && a.model == b.model && a.memory_bytes == b.memory_bytes;
}
inline bool operator==(const NodeInfo& a, const NodeInfo& b) {
  return a.node_id == b.node_id && a.address == b.address && a.hostname == b.hostname && a.cores == b.cores &&
         a.memory_bytes == b.memory_bytes && a.gpus == b.gpus && a.slots == b.slots;
}
inline bool operator!=(const NodeInfo& a, const NodeInfo& b) { return !(a == b); }

// A node with its current free capacity, for listing and placement.
struct NodeStatus {
  NodeInfo info;
  int free_slots = 0;
  std::vector<int> free_gpus;  // GPU indexes not reserved, ascending
  TimePoint lease_expiry;      // lost if no heartbeat arrives by then
  bool unschedulable = false;  // draining: free_slots and free_gpus read as none
  // Non-empty while the node is suspect (see NodeRegistry::mark_suspect): why. free_slots and
  // free_gpus read as none then too.
  std::string suspect_reason{};
  // Restored from the job store when this coordinator took over (NodeRegistry::restore_node), and
  // its agent has not registered with it since: free_slots and free_gpus read as none.
  bool awaiting_registration = false;

  // Whether placement may pick the node (not draining, suspect or awaiting its registration).
  bool schedulable() const { return !unschedulable && suspect_reason.empty() && !awaiting_registration; }
};

class NodeRegistry {
 public:
  explicit NodeRegistry(Duration lease = kDefaultNodeLease) : lease_(lease) {}

  Duration lease() const { return lease_; }

  // OK when `info` can be registered; INVALID_ARGUMENT naming the problem otherwise.
  static Status validate(const NodeInfo& info);

  // Adds a node, or replaces the one with the same id (dropping its reservations and suspicion: the
  // caller has treated the old incarnation as lost), and starts its lease at `now`. INVALID_ARGUMENT when the
  // info is malformed (empty id or address, slots < 1, repeated GPU index).
  Status register_node(NodeInfo info, TimePoint now);

  // Adds a node known from the job store's node records (a coordinator taking over from another,
  // issue 16), with a lease from `now`, so listings and capacity checks see the cluster at once and
  // a node that died during the failover is lost after one lease. Until its agent registers, it
  // takes no new work and its heartbeats answer NOT_FOUND: the registration carries the attempts
  // the agent still runs, which the new coordinator must reconcile. Replaces nothing: a node
  // already registered stays as it is. INVALID_ARGUMENT for malformed info.
  Status restore_node(NodeInfo info, TimePoint now);

  // Renews a node's lease from `now` and records whether it takes new work (`unschedulable`: it
  // is draining, so list() and placement see no free capacity on it). A heartbeat proves the agent
  // alive, so a suspect node is schedulable again. NOT_FOUND when the node is
  // unknown (never registered, or already expired) or only restored: its agent must register again.
  Status heartbeat(const std::string& node_id, TimePoint now, bool unschedulable = false);

  // Marks a node suspect: its agent could not be reached to launch tasks (it is dead, stopped or cut
  // off, but its lease has not run out yet). Until its next heartbeat or registration proves the
  // agent alive, the node is listed with no free capacity (as a draining node is), so placement
  // does not pick it again and again, each failed launch costing a job a restart, until its lease
  // ends. `reason` is shown in listings and in the waiting jobs' waiting_for. NOT_FOUND for an
  // unknown node.
  //
  // An agent that heartbeats but cannot be called (a one-way partition: it reaches the coordinator,
  // the coordinator does not reach it) would otherwise flip back to schedulable at every heartbeat
  // and cost a job a restart each time. So each unreachable launch in a row without a launch that
  // got through in between (launch_succeeded) holds the suspicion longer: the first is cleared by
  // the next heartbeat, the second only by a heartbeat kSuspectHoldBase after it, and each one more
  // doubles that, up to kSuspectHoldMax. Returns how long heartbeats are ignored.
  StatusOr<Duration> mark_suspect(const std::string& node_id, std::string reason, TimePoint now);
  // A launch on the node got through: its agent answers calls, so the unreachable streak ends.
  void launch_succeeded(const std::string& node_id);
  // Unreachable launches in a row on the node (0 for an unknown node), and the hold a streak of
  // `streak` earns: what the next mark_suspect will return is suspect_hold(unreachable_streak() + 1).
  int unreachable_streak(const std::string& node_id) const {
    auto it = nodes_.find(node_id);
    return it == nodes_.end() ? 0 : it->second.unreachable_streak;
  }
  static Duration suspect_hold(int streak);

  // Removes every node whose lease ended before `now` and returns their ids, ascending.
  std::vector<std::string> expire(TimePoint now);
  // Forgets a node at once (its certificate was revoked). Whether it was registered.
  bool remove(const std::string& node_id) { return nodes_.erase(node_id) != 0; }

  bool contains(const std::string& node_id) const { return nodes_.count(node_id) != 0; }
  // Whether the node's agent registered (contains it, and not only restored from the job store).
  bool registered(const std::string& node_id) const {
    auto it = nodes_.find(node_id);
    return it != nodes_.end() && !it->second.awaiting_registration;
  }

  // Reserves `slots` slots and the given GPU indexes on a node. NOT_FOUND for an unknown node;
  // RESOURCE_EXHAUSTED when they are not free (nothing is reserved then).
  Status reserve(const std::string& node_id, int slots, const std::vector<int>& gpus);

  // Returns a reservation. A node that is gone (expired) is ignored: its capacity went with it.
  void release(const std::string& node_id, int slots, const std::vector<int>& gpus);

  // Every live node with its free capacity, ordered by node id.
  std::vector<NodeStatus> list() const;

 private:
  struct Entry {
    NodeInfo info;
    TimePoint lease_expiry;
    int used_slots = 0;
    std::set<int> used_gpus;
    bool unschedulable = false;  // per the latest heartbeat
    std::string suspect_reason;  // non-empty: suspect until a heartbeat after suspect_until, or a registration
    TimePoint suspect_until{};   // heartbeats before this do not clear the suspicion
    int unreachable_streak = 0;  // unreachable launches since the last one that got through
    bool awaiting_registration = false;  // restored from the job store, not registered since
  };

  static NodeStatus status_of(const Entry& entry);

  const Duration lease_;
  std::map<std::string, Entry> nodes_;  // by node id: list() and placement see a stable order
};

}  // namespace cohort::coordinator
