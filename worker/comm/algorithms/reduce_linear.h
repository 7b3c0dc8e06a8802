#pragma once

// ReduceLinear: every rank sends its whole buffer to the root, which receives them one at a
// time in rank order and reduces each. P-1 sequential full-buffer messages into one rank: the
// "naive" communicator's reduce, and a reference the others are checked against.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class ReduceLinear {
 public:
  // The root's `buf` receives the reduction; other ranks' `buf` is only read. `op` is not kAvg.
  // Blocking until done or the context's deadline; the root uses count elements of ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op, int root);
};

}  // namespace cohort::comm
