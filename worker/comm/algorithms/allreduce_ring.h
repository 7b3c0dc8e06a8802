#pragma once

// AllreduceRing: reduce-scatter then allgather around the ring (Patarasuk & Yuan; NCCL's and
// gloo's large-message allreduce). Each rank sends and receives 2·(P-1)/P of the buffer, the
// minimum possible, in 2·(P-1) steps; the steps are pipelined in segments (RingPipeline) so
// reduction overlaps transfer. The choice for large messages.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

class AllreduceRing {
 public:
  // In place: on success every rank's `buf` (count elements) holds the reduction over all ranks.
  // Any count works (blocks are uneven when P does not divide it; some are empty when count < P).
  // `op` is not kAvg. Blocking until done or the context's deadline; uses ctx.scratch().
  static Status run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op);
};

}  // namespace cohort::comm
