#include "worker/comm/algorithms/scatter_linear.h"

#include <cstring>

#include "worker/comm/algorithms/chunking.h"

namespace cohort::comm {

Status ScatterLinear::run(CollectiveContext& ctx, const void* send, void* recv,
                          const std::vector<size_t>& bytes_per_rank, int root) {
  const int rank = ctx.rank();
  if (rank != root) {
    if (bytes_per_rank[rank] == 0) return ok_status();
    Transfer transfer = ctx.irecv(root, 0, recv, bytes_per_rank[rank]);
    COHORT_RETURN_IF_ERROR(ctx.wait(transfer));
    return check_received_size(ctx, transfer);
  }
  const std::vector<size_t> offsets = prefix_offsets(bytes_per_rank);
  const auto* base = static_cast<const uint8_t*>(send);
  std::vector<Transfer> sends;
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root || bytes_per_rank[peer] == 0) continue;
    sends.push_back(ctx.isend(peer, 0, base + offsets[peer], bytes_per_rank[peer]));
  }
  if (bytes_per_rank[root] > 0 && base + offsets[root] != recv) {
    std::memcpy(recv, base + offsets[root], bytes_per_rank[root]);
  }
  return ctx.wait_all(sends);
}

}  // namespace cohort::comm
