#include "worker/comm/algorithms/gather_linear.h"

#include <cstring>

#include "worker/comm/algorithms/chunking.h"

namespace cohort::comm {

Status GatherLinear::run(CollectiveContext& ctx, const void* send, void* recv,
                         const std::vector<size_t>& bytes_per_rank, int root) {
  const int rank = ctx.rank();
  if (rank != root) {
    if (bytes_per_rank[rank] == 0) return ok_status();
    return ctx.send(root, 0, send, bytes_per_rank[rank]);
  }
  const std::vector<size_t> offsets = prefix_offsets(bytes_per_rank);
  auto* base = static_cast<uint8_t*>(recv);
  std::vector<Transfer> receives;
  for (int peer = 0; peer < ctx.size(); ++peer) {
    if (peer == root || bytes_per_rank[peer] == 0) continue;
    receives.push_back(ctx.irecv(peer, 0, base + offsets[peer], bytes_per_rank[peer]));
  }
  if (bytes_per_rank[root] > 0 && base + offsets[root] != send) {
    std::memcpy(base + offsets[root], send, bytes_per_rank[root]);
  }
  for (Transfer& transfer : receives) {
    COHORT_RETURN_IF_ERROR(ctx.wait(transfer));
    COHORT_RETURN_IF_ERROR(check_received_size(ctx, transfer));
  }
  return ok_status();
}

}  // namespace cohort::comm
