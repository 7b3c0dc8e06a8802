#pragma once

// pure_nccl: every collective and point-to-point transfer on device buffers runs on NCCL over all
// ranks (ChainerMN's PureNcclCommunicator): allreduce, reduce, broadcast, allgather and
// reduce_scatter as the NCCL collectives, their uneven forms and gather, scatter and alltoall as
// one NCCL group each. Host buffers (and host and device buffers mixed in one call) keep the flat
// kind's host path over the world transport, so bcast_obj, split, barrier and the like work as
// everywhere.
//
// Point to point on device buffers: NCCL matches a receive with the next send from the same
// peer whatever its tag, so transfers between two ranks must be posted in the same order on both.
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
// True when `call` can run as NCCL calls: every buffer is device memory, and it is not the one
// form NCCL lacks (reduce_scatter with send == recv).
bool runs_on_nccl(const DeviceCall& call);
// Runs `call` on `nccl`, whose ranks are the calling communicator's. Requires runs_on_nccl(call).
// Blocking until done or `deadline` (then the NCCL communicator is aborted).
Status run_on_nccl(NcclTransport& nccl, const DeviceCall& call, Deadline deadline);

class PureNcclCommunicator final : public Communicator {
 public:
  PureNcclCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank, uint64_t context_id,
                       CommunicatorOptions options, std::unique_ptr<NcclTransport> nccl);
  ~PureNcclCommunicator() override;

  // The NCCL communicator over this communicator's ranks (same rank numbers), for callers that
  // want its stream or device. Owned by this communicator.
  NcclTransport& nccl() { return *nccl_; }

 protected:
  Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) override;
  std::shared_ptr<TransportWork> device_transfer(bool is_send, int peer, uint64_t wire_tag, void* buf,
                                                 size_t bytes) override;

 private:
  std::unique_ptr<NcclTransport> nccl_;
};
#endif

}  // namespace cohort::comm
