#include "worker/comm/algorithms/chunking.h"

#include <algorithm>

namespace cohort::comm {

Span even_block(size_t count, int parts, int index) {
  const size_t n = static_cast<size_t>(parts);
  const size_t i = static_cast<size_t>(index);
  const size_t base = count / n;
  const size_t extra = count % n;
  return Span{i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

std::vector<size_t> prefix_offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> offsets(sizes.size());
  size_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    offsets[i] = total;
    total += sizes[i];
  }
  return offsets;
}

size_t segment_bytes_for(size_t block_bytes) {
  constexpr size_t kAlign = 64;
  size_t target = (block_bytes + kTargetSegmentsPerBlock - 1) / kTargetSegmentsPerBlock;
  target = std::clamp(target, kMinSegmentBytes, kMaxSegmentBytes);
  target = (target + kAlign - 1) / kAlign * kAlign;
  // A block smaller than the minimum is one segment (rounded up, still a multiple of kAlign).
  return std::max<size_t>(std::min(target, (block_bytes + kAlign - 1) / kAlign * kAlign), kAlign);
}

Status check_received_size(const CollectiveContext& ctx, const Transfer& transfer) {
  const size_t received = transfer.work->received_bytes();
  if (received == transfer.bytes) return ok_status();
  return invalid_argument_error(
      "{}: rank {} expected {} bytes from rank {} (step {}) but received {}; the per-rank sizes passed to "
      "this "
      "collective must be the same on every rank",
      ctx.op(), ctx.rank(), transfer.bytes, transfer.peer, transfer.step, received);
}

}  // namespace cohort::comm
