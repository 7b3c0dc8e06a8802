#pragma once

// pure_nccl: every collective on device buffers runs as one NCCL call over all ranks (ChainerMN's
// PureNcclCommunicator). Host buffers keep the flat kind's host path over the world transport, so
// bcast_obj, split and the like work as everywhere. Device collectives other than allreduce and
// broadcast (and point to point) are reached through nccl().
//
// Only a CUDA build (bazel build --config=cuda) has it; a CPU-only build's factory returns
// FAILED_PRECONDITION saying which build is needed.
//
// Creation is collective over the group (rank 0's ncclUniqueId travels through the world store,
// under a key of this communicator's context id) and needs a visible GPU on every rank.

#include <memory>

#include "worker/comm/communicator.h"

namespace cohort::comm {

class NcclTransport;

StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> world,
                                                                      std::vector<int> global_ranks, int rank,
                                                                      uint64_t context_id, CommunicatorOptions options);

#if COHORT_CUDA
class PureNcclCommunicator final : public Communicator {
 public:
  PureNcclCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank, uint64_t context_id,
                       CommunicatorOptions options, std::unique_ptr<NcclTransport> nccl);
  ~PureNcclCommunicator() override;

  // The NCCL communicator over this communicator's ranks (same rank numbers): reduce, allgather,
  // reduce_scatter and send/recv on device buffers. Owned by this communicator.
  NcclTransport& nccl() { return *nccl_; }

 protected:
  Status allreduce_device(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                          Deadline deadline) override;
  Status broadcast_device(void* buf, size_t count, DataType dtype, int root, Deadline deadline) override;

 private:
  std::unique_ptr<NcclTransport> nccl_;
};
#endif

}  // namespace cohort::comm
