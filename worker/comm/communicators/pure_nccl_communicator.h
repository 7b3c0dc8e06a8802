#pragma once

#include "worker/comm/communicator.h"

namespace cohort::comm {

// pure_nccl: NCCL over every rank. Only a CUDA build (bazel build --config=cuda) has it; a CPU
// build returns FAILED_PRECONDITION saying so.
StatusOr<std::unique_ptr<Communicator>> create_pure_nccl_communicator(std::shared_ptr<CommWorld> world,
                                                                      std::vector<int> global_ranks, int rank,
                                                                      uint64_t context_id, CommunicatorOptions options);

}  // namespace cohort::comm
