#pragma once

// ReduceScatterRing: the reduce-scatter half of the ring allreduce with per-rank block sizes.
// P-1 pipelined steps (RingPipeline); the last one reduces straight into the output. Each rank
// sends and receives the total minus one block, the minimum.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class ReduceScatterRing {
 public:
  // `buf` holds every rank's input as consecutive blocks of counts_per_rank[r] elements; it is
  // clobbered. `out` (counts_per_rank[rank] elements, not overlapping `buf`) receives block
  // `rank` reduced over all ranks. `op` is not kAvg. Blocking until done or the context's
  // deadline; uses ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, void* out, const std::vector<size_t>& counts_per_rank,
                    DataType dtype, ReduceOp op);
};

}  // namespace cohort::comm
