#pragma once

// GatherLinear (gatherv): every rank sends its block straight to the root, which posts all
// receives at once, directly into place. P-1 messages into one rank; the root's link is the
// bottleneck whatever the tree, so a binomial gather would only save latency for tiny blocks.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class GatherLinear {
 public:
  // The root's `recv` becomes the concatenation, in rank order, of every rank's `send`
  // (bytes_per_rank[r] bytes from rank r); `recv` is unused elsewhere (may be null). At the root
  // `send` may be exactly its own block of `recv`. Blocking until done or the context's deadline.
  static Status run(CollectiveContext& ctx, const void* send, void* recv,
                    const std::vector<size_t>& bytes_per_rank, int root);
};

}  // namespace cohort::comm
