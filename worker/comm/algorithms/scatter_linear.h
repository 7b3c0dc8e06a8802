#pragma once

// ScatterLinear (scatterv): the root posts one send per rank at once, each straight from its
// block of `send`; every other rank receives its block directly into place.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class ScatterLinear {
 public:
  // Rank r's `recv` receives block r (bytes_per_rank[r] bytes) of the root's `send`, which holds
  // the blocks in rank order; `send` is unused elsewhere (may be null). At the root `recv` may
  // be exactly its own block of `send`. Blocking until done or the context's deadline.
  static Status run(CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<size_t>& bytes_per_rank, int root);
};

}  // namespace cohort::comm
