#pragma once

// Placement: where the ranks of one job attempt run. Produced by the Scheduler, consumed by the
// Rendezvous (rank answers), the Coordinator (launch and stop orders) and the JobStore.
//
// Ranks are node-major: node rank n holds global ranks n*procs_per_node .. (n+1)*procs_per_node-1,
// so neighbouring ranks share a node and hierarchical communicators' intra-node groups are
// contiguous rank ranges.

#include <cstddef>
#include <string>
#include <vector>

namespace cohort::coordinator {

// One node's share of an attempt.
struct NodeAssignment {
  std::string node_id;    // the node's registry id
  std::string address;    // its agent's host:port
  int node_rank = 0;      // position in the job, 0 .. nodes-1
  int first_rank = 0;     // global rank of local rank 0
  int num_ranks = 0;      // ranks on this node (procs_per_node)
  std::vector<int> gpus;  // reserved GPU indexes, gpus_per_proc per local rank, in local-rank order

  bool holds_rank(int rank) const { return rank >= first_rank && rank < first_rank + num_ranks; }

  // The GPUs of one local rank (empty for CPU jobs).
  std::vector<int> gpus_of(int local_rank) const {
    if (num_ranks == 0 || gpus.empty()) return {};
    const size_t per_rank = gpus.size() / static_cast<size_t>(num_ranks);
    auto begin = gpus.begin() + static_cast<std::ptrdiff_t>(per_rank * static_cast<size_t>(local_rank));
    return std::vector<int>(begin, begin + static_cast<std::ptrdiff_t>(per_rank));
  }
};

// All nodes of an attempt, ordered by node_rank.
struct Placement {
  std::vector<NodeAssignment> nodes;

  bool empty() const { return nodes.empty(); }

  int world_size() const {
    int total = 0;
    for (const NodeAssignment& node : nodes) total += node.num_ranks;
    return total;
  }

  // The assignment of the node with this id, or nullptr.
  const NodeAssignment* find_node(const std::string& node_id) const {
    for (const NodeAssignment& node : nodes) {
      if (node.node_id == node_id) return &node;
    }
    return nullptr;
  }

  // The assignment holding a global rank, or nullptr.
  const NodeAssignment* node_of_rank(int rank) const {
    for (const NodeAssignment& node : nodes) {
      if (node.holds_rank(rank)) return &node;
    }
    return nullptr;
  }

  // "node-a, node-b": for reasons and error messages.
  std::string node_list() const {
    std::string out;
    for (const NodeAssignment& node : nodes) {
      if (!out.empty()) out += ", ";
      out += node.node_id;
    }
    return out;
  }
};

}  // namespace cohort::coordinator
