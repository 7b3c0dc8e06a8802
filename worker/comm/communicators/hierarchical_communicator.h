#pragma once

// The two-level kinds. Both split private sub-communicators at creation (collective over the
// group) and use them only from this communicator's executor, so their sequence numbers never
// race with user calls.

#include <memory>

#include "worker/comm/communicator.h"

namespace cohort::comm {

// hierarchical: intra-node reduce to the node leader → allreduce among leaders → intra-node
// broadcast. Inter-node traffic is one buffer per node instead of one per rank.
class HierarchicalCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                                                        int rank, uint64_t context_id, CommunicatorOptions options);
  HierarchicalCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                           uint64_t context_id, CommunicatorOptions options)
      : Communicator("hierarchical", std::move(world), std::move(global_ranks), rank, context_id, options) {}

 protected:
  Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline) override;

 private:
  std::unique_ptr<Communicator> intra_;    // the ranks of this node
  std::unique_ptr<Communicator> leaders_;  // intra rank 0 of every node; null elsewhere
};

// two_dimensional: intra-node reduce-scatter → allreduce of each shard among the ranks holding
// that shard on every node → intra-node allgather. Every rank carries inter-node traffic, each a
// 1/intra_size share. Needs the same number of ranks on every node.
class TwoDimensionalCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                                                        int rank, uint64_t context_id, CommunicatorOptions options);
  TwoDimensionalCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                             uint64_t context_id, CommunicatorOptions options)
      : Communicator("two_dimensional", std::move(world), std::move(global_ranks), rank, context_id, options) {}

 protected:
  Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline) override;

 private:
  std::unique_ptr<Communicator> intra_;  // the ranks of this node
  std::unique_ptr<Communicator> inter_;  // the ranks with this intra rank, one per node
};

}  // namespace cohort::comm
