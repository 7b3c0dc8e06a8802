#pragma once

#include "worker/comm/communicator.h"

namespace cohort::comm {

class NcclTransport;

// single_node: the flat kind for jobs that must stay on one node (on GPUs: NCCL over NVLink/PCIe
// only). Creating one over ranks on several nodes fails with the nodes named.
//
// Device buffers (CUDA build): allreduce and broadcast run as NCCL calls when every rank has its
// own GPU (decided together at the first device call), else they are staged through host memory.
class SingleNodeCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                                                        int rank, uint64_t context_id, CommunicatorOptions options);
  SingleNodeCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                         uint64_t context_id, CommunicatorOptions options);
  ~SingleNodeCommunicator() override;

 protected:
  Status allreduce_device(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                          Deadline deadline) override;
  Status broadcast_device(void* buf, size_t count, DataType dtype, int root, Deadline deadline) override;

 private:
  // The NCCL communicator over all ranks, or null (staging); made at the first device call.
  StatusOr<NcclTransport*> node_nccl(Deadline deadline);

  bool node_nccl_decided_ = false;
  std::shared_ptr<NcclTransport> node_nccl_;  // shared_ptr: NcclTransport is incomplete here
};

}  // namespace cohort::comm
