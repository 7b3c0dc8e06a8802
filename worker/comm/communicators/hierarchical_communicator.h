#pragma once

// The two-level kinds. Both split private sub-communicators at creation (collective over the
// group) and use them only from this communicator's executor, so their sequence numbers never
// race with user calls.

#include <memory>

#include "worker/comm/communicator.h"

namespace cohort::comm {

class NcclTransport;

// hierarchical: intra-node reduce to the node leader → allreduce among leaders → intra-node
// broadcast. Inter-node traffic is one buffer per node instead of one per rank.
//
// Device buffers (CUDA build): when every rank of the node has its own GPU, the intra-node steps
// of allreduce are NCCL (reduce to the leader's GPU, broadcast from it) and only the leaders stage
// through pinned host memory for the UCX allreduce between nodes. Otherwise (ranks sharing a GPU,
// no GPU, host and device buffers mixed), and for the other collectives, device buffers are
// staged like every host kind's.
class HierarchicalCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world,
                                                        std::vector<int> global_ranks, int rank,
                                                        uint64_t context_id, CommunicatorOptions options);
  HierarchicalCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                           uint64_t context_id, CommunicatorOptions options);
  ~HierarchicalCommunicator() override;

 protected:
  Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline) override;
  Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) override;

 private:
  // NCCL among this node's ranks, made at the first device allreduce (collective over the node);
  // null when the node's ranks do not each have their own GPU, or in a CPU-only build.
  StatusOr<NcclTransport*> intra_nccl(Deadline deadline);

  std::unique_ptr<Communicator> intra_;    // the ranks of this node
  std::unique_ptr<Communicator> leaders_;  // intra rank 0 of every node; null elsewhere
  bool intra_nccl_decided_ = false;
  std::shared_ptr<NcclTransport> intra_nccl_;     // shared_ptr: NcclTransport is incomplete here
  std::unique_ptr<PinnedBuffer> leader_staging_;  // the leader's host copy for the inter-node step
};

// two_dimensional: intra-node reduce-scatter → allreduce of each shard among the ranks holding
// that shard on every node → intra-node allgather. Every rank carries inter-node traffic, each a
// 1/intra_size share. Needs the same number of ranks on every node.
//
// Device buffers (CUDA build): when every rank of the node has its own GPU and the count divides
// into equal shards, the intra-node steps are NCCL (in place in the receive buffer) and each rank
// stages only its shard for the UCX allreduce between nodes; otherwise the whole allreduce (and
// every other collective) is staged through host memory.
class TwoDimensionalCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world,
                                                        std::vector<int> global_ranks, int rank,
                                                        uint64_t context_id, CommunicatorOptions options);
  TwoDimensionalCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                             uint64_t context_id, CommunicatorOptions options);
  ~TwoDimensionalCommunicator() override;

 protected:
  Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline) override;
  Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) override;

 private:
  std::unique_ptr<Communicator> intra_;  // the ranks of this node
  std::unique_ptr<Communicator> inter_;  // the ranks with this intra rank, one per node
  bool intra_nccl_decided_ = false;      // NCCL among the node's ranks: see HierarchicalCommunicator
  std::shared_ptr<NcclTransport> intra_nccl_;
  std::unique_ptr<PinnedBuffer> shard_staging_;  // this rank's shard for the inter-node step
};

}  // namespace cohort::comm
