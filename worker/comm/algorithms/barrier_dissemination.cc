#include "worker/comm/algorithms/barrier_dissemination.h"

#include <cstdint>

namespace cohort::comm {

Status BarrierDissemination::run(CollectiveContext& ctx) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  // One byte rather than zero: every backend moves (and matches) a non-empty message the same
  // way, so the barrier relies on nothing backend-specific.
  const uint8_t token = 1;
  uint8_t incoming = 0;
  uint32_t round = 0;
  for (int distance = 1; distance < size; distance *= 2, ++round) {
    COHORT_RETURN_IF_ERROR(ctx.sendrecv((rank + distance) % size, &token, 1, (rank - distance + size) % size,
                                        &incoming, 1, round));
  }
  return ok_status();
}

}  // namespace cohort::comm
