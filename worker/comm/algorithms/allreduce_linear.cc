#include "worker/comm/algorithms/allreduce_linear.h"

#include "worker/comm/algorithms/broadcast_linear.h"
#include "worker/comm/algorithms/reduce_linear.h"

namespace cohort::comm {

Status AllreduceLinear::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op) {
  constexpr int kRoot = 0;
  // The reduce's messages flow to the root and the broadcast's away from it, so both may use
  // the same tag step.
  COHORT_RETURN_IF_ERROR(ReduceLinear::run(ctx, buf, count, dtype, op, kRoot));
  return BroadcastLinear::run(ctx, buf, count * element_size(dtype), kRoot);
}

}  // namespace cohort::comm
