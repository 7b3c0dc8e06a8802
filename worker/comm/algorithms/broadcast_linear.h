#pragma once

// BroadcastLinear: the root sends the whole buffer to every other rank (all sends posted at
// once). P-1 full-buffer messages out of one rank: the "naive" communicator's broadcast.

#include <cstddef>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class BroadcastLinear {
 public:
  // Copies the root's `buf` (`bytes` long) into every rank's `buf`. Blocking until done or the
  // context's deadline.
  static Status run(CollectiveContext& ctx, void* buf, size_t bytes, int root);
};

}  // namespace cohort::comm
