#pragma once

// AlltoallPairwise (alltoallv): P-1 steps; at step s rank r sends its block for rank r+s and
// receives rank r-s's block for it. Each step pairs every rank with exactly one sender and one
// receiver, so no rank is flooded; a few steps are kept in flight (kAlltoallStepsInFlight) to
// hide per-message latency. Transfers land directly in place; zero-byte blocks are skipped.

#include <cstddef>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

// Steps posted ahead of the one being waited for: enough to overlap a step's latency with the
// next transfers without posting all P-1 at once (which would make every rank send to every
// other simultaneously, the incast that pairwise exchange exists to avoid).
inline constexpr int kAlltoallStepsInFlight = 4;

class AlltoallPairwise {
 public:
  // `send` holds one block per destination (send_bytes[p] bytes for rank p, in rank order);
  // `recv` receives one block per source (recv_bytes[p] bytes from rank p). send_bytes[p] on
  // this rank must equal recv_bytes[this rank] on rank p: a shorter message fails with
  // INVALID_ARGUMENT, a longer one as truncation, and a block only one side thinks is empty at
  // the deadline. The buffers must not overlap. Blocking until done or the context's deadline.
  static Status run(CollectiveContext& ctx, const void* send, const std::vector<size_t>& send_bytes,
                    void* recv, const std::vector<size_t>& recv_bytes);
};

}  // namespace cohort::comm
