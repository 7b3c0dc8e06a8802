#pragma once

// AllreduceHalvingDoubling: Rabenseifner's allreduce. A reduce-scatter by recursive halving (at
// level i each rank exchanges half of its current range with the partner across bit i and
// reduces the half it keeps) followed by an allgather by recursive doubling (the reverse). Moves
// the same 2·(P-1)/P of the buffer as the ring in 2·log2(P) steps instead of 2·(P-1): the
// choice for mid-sized messages. Groups that are not a power of two fold the extra ranks in and
// out (PowerOfTwoFold), which costs a full-buffer transfer each way on those pairs.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class AllreduceHalvingDoubling {
 public:
  // In place, any count (ranges may be empty when count < P). `op` is not kAvg. Blocking until
  // done or the context's deadline; uses ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op);
};

}  // namespace cohort::comm
