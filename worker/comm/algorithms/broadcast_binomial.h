#pragma once

// BroadcastBinomial: the root's buffer flows down a binomial tree (BinomialTree), pipelined in
// segments: a rank forwards segment i to its children as soon as it arrives, while segment i+1
// is still on its way. Latency ceil(log2 P) messages for small buffers; for large ones every
// level of the tree is busy at once.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class BroadcastBinomial {
 public:
  // Copies the root's `buf` (`bytes` long) into every rank's `buf`. Receives land directly in
  // `buf`. Blocking until done or the context's deadline.
  static Status run(CollectiveContext& ctx, void* buf, size_t bytes, int root);
};

}  // namespace cohort::comm
