#pragma once

#include "worker/comm/communicator.h"

namespace cohort::comm {

class NcclTransport;

// single_node: the flat kind for jobs that must stay on one node (on GPUs: NCCL over NVLink/PCIe
// only). Creating one over ranks on several nodes fails with the nodes named.
//
// Device buffers (CUDA build): every collective runs as NCCL calls, like pure_nccl's, when every
// rank has its own GPU (decided together at the first device collective), else they are staged
// through host memory. Point-to-point transfers of device buffers are staged.
class SingleNodeCommunicator final : public Communicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world,
                                                        std::vector<int> global_ranks, int rank,
                                                        uint64_t context_id, CommunicatorOptions options);
  SingleNodeCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                         uint64_t context_id, CommunicatorOptions options);
  ~SingleNodeCommunicator() override;

 protected:
  Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) override;

 private:
  // The NCCL communicator over all ranks, or null (staging); made at the first device call.
  StatusOr<NcclTransport*> node_nccl(Deadline deadline);

  bool node_nccl_decided_ = false;
  std::shared_ptr<NcclTransport> node_nccl_;  // shared_ptr: NcclTransport is incomplete here
};

}  // namespace cohort::comm
