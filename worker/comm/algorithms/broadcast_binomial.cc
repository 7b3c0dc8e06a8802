#include "worker/comm/algorithms/broadcast_binomial.h"

#include <vector>

#include "worker/comm/algorithms/binomial_tree.h"
#include "worker/comm/algorithms/chunking.h"

namespace cohort::comm {

Status BroadcastBinomial::run(CollectiveContext& ctx, void* buf, size_t bytes, int root) {
  if (ctx.size() == 1 || bytes == 0) return ok_status();
  const BinomialTree tree(ctx.rank(), ctx.size(), root);
  auto* base = static_cast<uint8_t*>(buf);
  const size_t segment = segment_bytes_for(bytes);
  const size_t segments = segment_count(bytes, segment);

  // Every segment's receive is posted up front: they land in place, so no slots are needed.
  std::vector<Transfer> receives;
  if (tree.parent() >= 0) {
    receives.reserve(segments);
    for (size_t i = 0; i < segments; ++i) {
      const Span span = segment_of(bytes, segment, i);
      receives.push_back(ctx.irecv(tree.parent(), static_cast<uint32_t>(i), base + span.offset, span.size));
    }
  }
  std::vector<Transfer> sends;
  sends.reserve(segments * tree.children().size());
  for (size_t i = 0; i < segments; ++i) {
    if (!receives.empty()) {
      COHORT_RETURN_IF_ERROR(ctx.wait(receives[i]));
      COHORT_RETURN_IF_ERROR(check_received_size(ctx, receives[i]));
    }
    const Span span = segment_of(bytes, segment, i);
    for (int child : tree.children()) {
      sends.push_back(ctx.isend(child, static_cast<uint32_t>(i), base + span.offset, span.size));
    }
  }
  return ctx.wait_all(sends);
}

}  // namespace cohort::comm
