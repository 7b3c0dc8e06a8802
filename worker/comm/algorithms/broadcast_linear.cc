#include "worker/comm/algorithms/broadcast_linear.h"

#include <vector>

#include "worker/comm/algorithms/chunking.h"

namespace cohort::comm {

Status BroadcastLinear::run(CollectiveContext& ctx, void* buf, size_t bytes, int root) {
  if (ctx.size() == 1 || bytes == 0) return ok_status();
  if (ctx.rank() != root) {
    Transfer transfer = ctx.irecv(root, 0, buf, bytes);
    COHORT_RETURN_IF_ERROR(ctx.wait(transfer));
    return check_received_size(ctx, transfer);
  }
  std::vector<Transfer> sends;
  sends.reserve(ctx.size() - 1);
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer != root) sends.push_back(ctx.isend(peer, 0, buf, bytes));
  }
  return ctx.wait_all(sends);
}

}  // namespace cohort::comm
