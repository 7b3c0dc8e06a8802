#pragma once

// pure_nccl: every collective on device buffers runs on NCCL over all ranks (ChainerMN's
// PureNcclCommunicator): allreduce, reduce, broadcast, allgather and reduce_scatter as the NCCL
// collectives, their uneven forms and gather, scatter and alltoall as one NCCL group each. A call
// mixing host and device buffers is refused (INVALID_ARGUMENT): every rank must take the NCCL
// path. Host buffers keep the flat kind's host path over the world transport, so bcast_obj,
// split, barrier and the like work as everywhere.
//
// Point to point on device buffers is staged through host memory over the world transport, as
// in every kind: NCCL ignores tags (a receive takes the next send from that peer) and would
// interleave with the collectives on one stream in whatever order threads reach it, both of which
// break the tag-matched, collective-independent contract of isend/irecv.
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
                                                                      uint64_t context_id,
                                                                      CommunicatorOptions options);

#if COHORT_CUDA
// Runs `call` on `nccl`, whose ranks are the calling communicator's. INVALID_ARGUMENT (before any
// NCCL call) when a buffer is host memory or for the one form NCCL lacks (reduce_scatter with
// send == recv). Blocking until done or `deadline` (then the NCCL communicator is aborted).
Status run_on_nccl(NcclTransport& nccl, const DeviceCall& call, const std::string& who, Deadline deadline);

class PureNcclCommunicator final : public Communicator {
 public:
  PureNcclCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                       uint64_t context_id, CommunicatorOptions options, std::unique_ptr<NcclTransport> nccl);
  ~PureNcclCommunicator() override;

  // The NCCL communicator over this communicator's ranks (same rank numbers), for callers that
  // want its stream or device. Owned by this communicator.
  NcclTransport& nccl() { return *nccl_; }

 protected:
  Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) override;

 private:
  std::unique_ptr<NcclTransport> nccl_;
};
#endif

}  // namespace cohort::comm
