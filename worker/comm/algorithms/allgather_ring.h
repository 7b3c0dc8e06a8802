#pragma once

// AllgatherRing (allgatherv): each rank's block travels once around the ring, P-1 steps,
// pipelined in segments (RingPipeline) and received directly into place. Blocks may have any
// size, zero included. Each rank sends and receives the total minus its own block, the minimum.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class AllgatherRing {
 public:
  // `recv` becomes the concatenation, in rank order, of every rank's `send` (bytes_per_rank[r]
  // bytes from rank r). `send` may be exactly this rank's block of `recv` (in place); otherwise
  // it must not overlap `recv`. `bytes_per_rank` has ctx.size() entries, the same on every rank.
  // Blocking until done or the context's deadline.
  static Status run(CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<size_t>& bytes_per_rank);
};

}  // namespace cohort::comm
