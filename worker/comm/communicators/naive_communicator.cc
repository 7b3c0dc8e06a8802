#include "worker/comm/communicators/naive_communicator.h"

#include "worker/comm/algorithms/collectives.h"

namespace cohort::comm {

Status NaiveCommunicator::allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op,
                                             Deadline deadline) {
  return run_collective("naive allreduce", deadline, [&](CollectiveContext& ctx) {
    return run_allreduce(ctx, buf, count, dtype, op, Algorithm::kLinear);
  });
}

}  // namespace cohort::comm
