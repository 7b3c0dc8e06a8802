#pragma once

// AllreduceLinear: ReduceLinear to rank 0, then BroadcastLinear from it. Plain sends, no
// pipelining, 2·(P-1) full-buffer messages through rank 0: the "naive" communicator's allreduce
// (ChainerMN's naive communicator) and a baseline for the others.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class AllreduceLinear {
 public:
  // In place, any count. `op` is not kAvg. Blocking until done or the context's deadline; rank 0
  // uses count elements of ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op);
};

}  // namespace cohort::comm
