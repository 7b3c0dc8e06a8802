#include "worker/comm/algorithms/allreduce_ring.h"

#include <vector>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/algorithms/ring_pipeline.h"

namespace cohort::comm {

Status AllreduceRing::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op) {
  const int size = ctx.size();
  if (size == 1 || count == 0) return ok_status();
  const size_t element = element_size(dtype);
  std::vector<size_t> offsets(size), bytes(size);
  for (int block = 0; block < size; ++block) {
    const Span span = even_block(count, size, block);
    offsets[block] = span.offset * element;
    bytes[block] = span.size * element;
  }
  RingPipeline ring;
  ring.buf = static_cast<uint8_t*>(buf);
  ring.block_offsets = &offsets;
  ring.block_bytes = &bytes;
  ring.dtype = dtype;
  ring.op = op;
  ring.shift = 0;  // reduce-scatter leaves rank r owning block r+1; allgather starts from it
  ring.reduce_steps = size - 1;
  ring.copy_steps = size - 1;
  return ring.run(ctx);
}

}  // namespace cohort::comm
