#include "worker/comm/algorithms/reduce_linear.h"

#include "worker/comm/reduce/reduce_kernels.h"

namespace cohort::comm {

Status ReduceLinear::run(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                         int root) {
  const size_t bytes = count * element_size(dtype);
  if (ctx.size() == 1 || bytes == 0) return ok_status();
  if (ctx.rank() != root) return ctx.send(root, 0, buf, bytes);
  uint8_t* incoming = ctx.scratch(bytes);
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root) continue;
    COHORT_RETURN_IF_ERROR(ctx.recv(peer, 0, incoming, bytes));
    reduce_into(buf, incoming, count, dtype, op);
  }
  return ok_status();
}

}  // namespace cohort::comm
