#include "daemon/coordinator/scheduler.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

namespace cohort::coordinator {

Status Scheduler::enqueue(const std::string& job_id, int64_t seq, SlotRequest request) {
  if (request.nodes < 1 || request.procs_per_node < 1 || request.gpus_per_proc < 0) {
    return invalid_argument_error("job '{}': cannot queue a request for {} nodes × {} procs × {} GPUs",
                                  job_id, request.nodes, request.procs_per_node, request.gpus_per_proc);
  }
  if (contains(job_id)) return already_exists_error("job '{}' is already queued", job_id);
  if (queue_.count(seq) != 0) {
    return already_exists_error("job '{}': queue position {} is taken by job '{}'", job_id, seq,
                                queue_.at(seq).job_id);
  }
  queue_.emplace(seq, Entry{job_id, request});
  seq_of_.emplace(job_id, seq);
  return ok_status();
}

bool Scheduler::remove(const std::string& job_id) {
  auto it = seq_of_.find(job_id);
  if (it == seq_of_.end()) return false;
  queue_.erase(it->second);
  seq_of_.erase(it);
  return true;
}

std::vector<std::string> Scheduler::queued() const {
  std::vector<std::string> ids;
  ids.reserve(queue_.size());
  for (const auto& item : queue_) ids.push_back(item.second.job_id);
  return ids;
}

namespace {

// Tries to place one request on `nodes`. On success fills `placement` (node-major ranks) and
// returns true; otherwise returns false and says why in `why_not`.
bool place_gang(const SlotRequest& request, const std::vector<NodeCapacity>& nodes, Placement* placement,
                std::string* why_not) {
  const size_t gpus_per_node =
      static_cast<size_t>(request.procs_per_node) * static_cast<size_t>(request.gpus_per_proc);
  std::vector<const NodeCapacity*> fitting;
  for (const NodeCapacity& node : nodes) {
    if (node.free_slots >= request.procs_per_node && node.free_gpus.size() >= gpus_per_node) {
      fitting.push_back(&node);
    }
  }
  if (fitting.size() < static_cast<size_t>(request.nodes)) {
    *why_not = fmt::format("needs {} node(s) with {} free slot(s){} each; {} of {} live node(s) qualify now",
                           request.nodes, request.procs_per_node,
                           gpus_per_node > 0 ? fmt::format(" and {} free GPU(s)", gpus_per_node) : "",
                           fitting.size(), nodes.size());
    return false;
  }
  // Best fit: the fullest nodes that still fit, so large holes stay free for large jobs.
  std::stable_sort(fitting.begin(), fitting.end(), [](const NodeCapacity* a, const NodeCapacity* b) {
    if (a->free_slots != b->free_slots) return a->free_slots < b->free_slots;
    return a->node_id < b->node_id;
  });
  placement->nodes.clear();
  for (int node_rank = 0; node_rank < request.nodes; ++node_rank) {
    const NodeCapacity& node = *fitting[static_cast<size_t>(node_rank)];
    NodeAssignment assignment;
    assignment.node_id = node.node_id;
    assignment.address = node.address;
    assignment.node_rank = node_rank;
    assignment.first_rank = node_rank * request.procs_per_node;
    assignment.num_ranks = request.procs_per_node;
    assignment.gpus.assign(node.free_gpus.begin(),
                           node.free_gpus.begin() + static_cast<std::ptrdiff_t>(gpus_per_node));
    placement->nodes.push_back(std::move(assignment));
  }
  return true;
}

// Takes a placement's slots and GPUs out of the offered capacity.
void consume(const Placement& placement, std::vector<NodeCapacity>* nodes) {
  for (const NodeAssignment& assignment : placement.nodes) {
    for (NodeCapacity& node : *nodes) {
      if (node.node_id != assignment.node_id) continue;
      node.free_slots -= assignment.num_ranks;
      auto taken = [&](int gpu) {
        return std::find(assignment.gpus.begin(), assignment.gpus.end(), gpu) != assignment.gpus.end();
      };
      node.free_gpus.erase(std::remove_if(node.free_gpus.begin(), node.free_gpus.end(), taken),
                           node.free_gpus.end());
    }
  }
}

}  // namespace

ScheduleResult Scheduler::schedule(std::vector<NodeCapacity> nodes) {
  ScheduleResult result;
  while (!queue_.empty()) {
    auto head = queue_.begin();
    Placement placement;
    std::string why_not;
    if (!place_gang(head->second.request, nodes, &placement, &why_not)) {
      // Head-of-line blocking: see the header.
      result.blocked_job_id = head->second.job_id;
      result.blocked_reason = std::move(why_not);
      break;
    }
    consume(placement, &nodes);
    seq_of_.erase(head->second.job_id);
    result.placed.push_back(ScheduledJob{head->second.job_id, std::move(placement)});
    queue_.erase(head);
  }
  return result;
}

}  // namespace cohort::coordinator
