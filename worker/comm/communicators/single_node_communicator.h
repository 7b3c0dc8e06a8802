#pragma once

#include "worker/comm/communicator.h"

namespace cohort::comm {

// single_node: the flat kind for jobs that must stay on one node (on GPUs: NCCL over NVLink/PCIe
// only). Creating one over ranks on several nodes fails with the nodes named.
class SingleNodeCommunicator {
 public:
  static StatusOr<std::unique_ptr<Communicator>> create(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                                                        int rank, uint64_t context_id, CommunicatorOptions options);
};

}  // namespace cohort::comm
