#include "worker/comm/algorithms/allgather_ring.h"

#include <cstring>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/ring_pipeline.h"

namespace cohort::comm {

Status AllgatherRing::run(CollectiveContext& ctx, const void* send, void* recv,
                          const std::vector<size_t>& bytes_per_rank) {
  const std::vector<size_t> offsets = prefix_offsets(bytes_per_rank);
  auto* base = static_cast<uint8_t*>(recv);
  uint8_t* mine = base + offsets[ctx.rank()];
  const size_t my_bytes = bytes_per_rank[ctx.rank()];
  if (my_bytes > 0 && mine != send) std::memcpy(mine, send, my_bytes);
  if (ctx.size() == 1) return ok_status();
  RingPipeline ring;
  ring.buf = base;
  ring.block_offsets = &offsets;
  ring.block_bytes = &bytes_per_rank;
  ring.shift = 0;  // step 0 sends this rank's own block
  ring.copy_steps = ctx.size() - 1;
  return ring.run(ctx);
}

}  // namespace cohort::comm
