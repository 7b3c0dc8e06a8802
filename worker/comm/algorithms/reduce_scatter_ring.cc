#include "worker/comm/algorithms/reduce_scatter_ring.h"

#include <cstring>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/ring_pipeline.h"

namespace cohort::comm {

Status ReduceScatterRing::run(CollectiveContext& ctx, void* buf, void* out,
                              const std::vector<size_t>& counts_per_rank, DataType dtype, ReduceOp op) {
  const size_t element = element_size(dtype);
  std::vector<size_t> bytes(counts_per_rank.size());
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = counts_per_rank[i] * element;
  const std::vector<size_t> offsets = prefix_offsets(bytes);
  if (ctx.size() == 1) {
    if (bytes[0] > 0 && out != buf) std::memcpy(out, buf, bytes[0]);
    return ok_status();
  }
  RingPipeline ring;
  ring.buf = static_cast<uint8_t*>(buf);
  ring.block_offsets = &offsets;
  ring.block_bytes = &bytes;
  ring.dtype = dtype;
  ring.op = op;
  ring.shift = -1;  // the last step receives block `rank`
  ring.reduce_steps = ctx.size() - 1;
  ring.final_output = static_cast<uint8_t*>(out);
  return ring.run(ctx);
}

}  // namespace cohort::comm
