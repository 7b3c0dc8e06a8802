#pragma once

// AllreduceRecursiveDoubling: log2(P) steps; at step i each rank exchanges its whole buffer with
// the partner across bit i and reduces. Sends log2(P) whole buffers (bandwidth-poor) but takes
// the fewest steps: the choice for small, latency-bound messages. Both partners combine the
// same two values at every step, so all ranks end with bit-identical results. Groups that are
// not a power of two fold the extra ranks in and out (PowerOfTwoFold).

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class AllreduceRecursiveDoubling {
 public:
  // In place, any count. `op` is not kAvg. Blocking until done or the context's deadline; uses
  // ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op);
};

}  // namespace cohort::comm
