#pragma once

// BarrierDissemination (Hensgen, Finkel & Manber): ceil(log2 P) rounds; in round i rank r sends
// a one-byte token to r + 2^i and waits for one from r - 2^i. After the last round every rank
// has (transitively) heard from every other, for any P — no power-of-two fold needed.

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"

namespace cohort::comm {

class BarrierDissemination {
 public:
  // Returns once every rank of the context has entered the barrier, or fails at the context's
  // deadline (naming the rank it was waiting for).
  static Status run(CollectiveContext& ctx);
};

}  // namespace cohort::comm
