#pragma once

// ReduceBinomial: partial results flow up a binomial tree (BinomialTree) to the root. Each rank
// reduces its children's buffers into its own, smallest subtree first, then sends the result to
// its parent: ceil(log2 P) levels, each transfer segmented so reduction overlaps it
// (ReduceExchange).

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class ReduceBinomial {
 public:
  // The root's `buf` receives the reduction; other ranks' `buf` is clobbered (used as the
  // accumulator). `op` is not kAvg. Blocking until done or the context's deadline; uses
  // ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op, int root);
};

}  // namespace cohort::comm
