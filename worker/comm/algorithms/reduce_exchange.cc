#include "worker/comm/algorithms/reduce_exchange.h"

#include <algorithm>
#include <array>
#include <vector>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/reduce/reduce_kernels.h"

namespace cohort::comm {

Status ReduceExchange::run(CollectiveContext& ctx) const {
  const size_t element = element_size(dtype);
  const size_t send_bytes = send_peer >= 0 ? send_count * element : 0;
  const size_t recv_bytes = recv_peer >= 0 ? recv_count * element : 0;
  const auto* send_base = static_cast<const uint8_t*>(send);
  auto* accumulate_base = static_cast<uint8_t*>(accumulate);

  // All send segments go out at once: they only read `send`, and the peer's receive window
  // decides how fast they drain.
  std::vector<Transfer> sends;
  if (send_bytes > 0) {
    const size_t segment = segment_bytes_for(send_bytes);
    const size_t segments = segment_count(send_bytes, segment);
    sends.reserve(segments);
    for (size_t i = 0; i < segments; ++i) {
      const Span span = segment_of(send_bytes, segment, i);
      sends.push_back(
          ctx.isend(send_peer, step + static_cast<uint32_t>(i), send_base + span.offset, span.size));
    }
  }

  if (recv_bytes > 0) {
    const bool same_region = send_bytes == recv_bytes && send_base == accumulate_base;
    const bool regions_overlap = send_bytes > 0 && !same_region && send_base < accumulate_base + recv_bytes &&
                                 accumulate_base < send_base + send_bytes;
    if (regions_overlap) {
      // Partial overlap (no algorithm does this today): finish sending before writing anything.
      COHORT_RETURN_IF_ERROR(ctx.wait_all(sends));
      sends.clear();
    }
    const size_t segment = segment_bytes_for(recv_bytes);
    const size_t segments = segment_count(recv_bytes, segment);
    const size_t depth = std::min(kPipelineDepth, segments);
    uint8_t* slots = ctx.scratch(depth * segment);
    std::array<Transfer, kPipelineDepth> receives;
    auto post_receive = [&](size_t i) {
      const Span span = segment_of(recv_bytes, segment, i);
      receives[i % depth] =
          ctx.irecv(recv_peer, step + static_cast<uint32_t>(i), slots + (i % depth) * segment, span.size);
    };
    for (size_t i = 0; i < depth; ++i) post_receive(i);
    for (size_t i = 0; i < segments; ++i) {
      COHORT_RETURN_IF_ERROR(ctx.wait(receives[i % depth]));
      if (same_region) COHORT_RETURN_IF_ERROR(ctx.wait(sends[i]));
      const Span span = segment_of(recv_bytes, segment, i);
      reduce_into(accumulate_base + span.offset, slots + (i % depth) * segment, span.size / element, dtype,
                  op);
      if (i + depth < segments) post_receive(i + depth);
    }
  }
  return ctx.wait_all(sends);
}

}  // namespace cohort::comm
