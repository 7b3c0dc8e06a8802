#pragma once

#include "worker/comm/communicator.h"

namespace cohort::comm {

// ChainerMN's "naive": allreduce by the simplest algorithm (a linear reduce to rank 0, then a
// broadcast). Slow at scale; a reference that every other kind must agree with.
class NaiveCommunicator final : public Communicator {
 public:
  NaiveCommunicator(std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
                    uint64_t context_id, CommunicatorOptions options)
      : Communicator("naive", std::move(world), std::move(global_ranks), rank, context_id, options) {}

 protected:
  Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline) override;
};

}  // namespace cohort::comm
