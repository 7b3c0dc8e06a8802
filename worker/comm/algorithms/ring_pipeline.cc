#include "worker/comm/algorithms/ring_pipeline.h"

#include <algorithm>
#include <array>

#include "worker/comm/algorithms/chunking.h"
#include "worker/comm/reduce/reduce_kernels.h"

namespace cohort::comm {

Status RingPipeline::run(CollectiveContext& ctx) const {
  const int size = ctx.size();
  const int rank = ctx.rank();
  const int right = (rank + 1) % size;
  const int left = (rank + size - 1) % size;
  const std::vector<size_t>& offsets = *block_offsets;
  const std::vector<size_t>& bytes = *block_bytes;

  const size_t largest = *std::max_element(bytes.begin(), bytes.end());
  if (largest == 0 || reduce_steps + copy_steps == 0) return ok_status();
  const size_t segment = segment_bytes_for(largest);
  const size_t segments = segment_count(largest, segment);  // K, the same for every block
  const size_t units = static_cast<size_t>(reduce_steps + copy_steps) * segments;
  const size_t depth = std::min(kPipelineDepth, units);
  const size_t element = element_size(dtype);
  uint8_t* slots = reduce_steps > 0 ? ctx.scratch(depth * segment) : nullptr;

  // Unit u is segment u % K of step u / K. Step s sends block (rank + shift - s) and receives
  // block (rank + shift - s - 1), modulo the ring size.
  auto block_of = [&](size_t unit, int receive) {
    const long step = static_cast<long>(unit / segments);
    return static_cast<int>(((rank + shift - step - receive) % size + size) % size);
  };
  // The tag step: units are posted in the same order on both ends of each link, so the
  // 2^kStepBits wrap of the tag is harmless (FIFO matching).
  auto step_of = [](size_t unit) { return static_cast<uint32_t>(unit); };

  std::vector<Transfer> sends;
  sends.reserve(units);
  auto post_send = [&](size_t unit) {
    const int block = block_of(unit, 0);
    const Span span = segment_of(bytes[block], segment, unit % segments);
    if (span.size == 0) return;
    sends.push_back(ctx.isend(right, step_of(unit), buf + offsets[block] + span.offset, span.size));
  };

  std::array<Transfer, kPipelineDepth> receives;
  std::array<bool, kPipelineDepth> receiving{};
  auto post_receive = [&](size_t unit) {
    const size_t slot = unit % depth;
    const int block = block_of(unit, 1);
    const Span span = segment_of(bytes[block], segment, unit % segments);
    receiving[slot] = span.size > 0;
    if (span.size == 0) return;
    const bool reduce = unit / segments < static_cast<size_t>(reduce_steps);
    // Copy steps land directly in the buffer. The region may still be the source of this
    // rank's reduce-step send of the same block, but data for it can only arrive after that
    // send was consumed: the block's final value includes what this rank sent.
    uint8_t* target = reduce ? slots + slot * segment : buf + offsets[block] + span.offset;
    receives[slot] = ctx.irecv(left, step_of(unit), target, span.size);
  };

  for (size_t unit = 0; unit < segments; ++unit) post_send(unit);  // step 0 depends on nothing
  for (size_t unit = 0; unit < depth; ++unit) post_receive(unit);

  for (size_t unit = 0; unit < units; ++unit) {
    const size_t slot = unit % depth;
    if (receiving[slot]) {
      COHORT_RETURN_IF_ERROR(ctx.wait(receives[slot]));
      COHORT_RETURN_IF_ERROR(check_received_size(ctx, receives[slot]));
      const size_t step = unit / segments;
      if (step < static_cast<size_t>(reduce_steps)) {
        const int block = block_of(unit, 1);
        const Span span = segment_of(bytes[block], segment, unit % segments);
        uint8_t* local = buf + offsets[block] + span.offset;
        const uint8_t* arrived = slots + slot * segment;
        if (final_output != nullptr && step + 1 == static_cast<size_t>(reduce_steps)) {
          reduce_to(final_output + span.offset, local, arrived, span.size / element, dtype, op);
        } else {
          reduce_into(local, arrived, span.size / element, dtype, op);
        }
      }
    }
    // The block just completed is the one the next step forwards.
    if (unit + segments < units) post_send(unit + segments);
    if (unit + depth < units) post_receive(unit + depth);
  }
  return ctx.wait_all(sends);
}

}  // namespace cohort::comm
