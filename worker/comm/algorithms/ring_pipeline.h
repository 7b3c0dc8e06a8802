#pragma once

// RingPipeline: the ring schedule shared by AllreduceRing, ReduceScatterRing and AllgatherRing.
//
// The buffer is cut into one block per rank (uneven sizes allowed, zeros included). At global step
// s every rank r sends block (r + shift - s) mod P to rank r+1 and receives block
// (r + shift - s - 1) mod P from rank r-1 — which is exactly the block it sends at step s+1. The
// first `reduce_steps` steps reduce what arrives into the local block (reduce-scatter); the next
// `copy_steps` steps receive straight into the buffer (allgather).
//
//   allreduce:      shift 0,  P-1 reduce steps, P-1 copy steps (rank r ends the reduce steps
//                   owning block r+1, which the copy steps then circulate)
//   reduce-scatter: shift -1, P-1 reduce steps (rank r ends owning block r)
//   allgather:      shift 0,  P-1 copy steps (rank r starts owning block r)
//
// Pipelining: each block is cut into the same number K of segments (chunking.h, sized from the
// largest block), and the 2(P-1)·K (step, segment) units stream in order. The send of unit
// (s+1, k) is posted as soon as unit (s, k) has arrived and been reduced, so up to kPipelineDepth
// segments are in flight on each link while the previous ones are being reduced; reduction reads
// the receive slot directly (no copy). Copy steps receive directly into the buffer.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

struct RingPipeline {
  uint8_t* buf = nullptr;                              // the blocks, laid out by the two vectors below
  const std::vector<size_t>* block_offsets = nullptr;  // bytes, one per rank
  const std::vector<size_t>* block_bytes = nullptr;    // bytes, one per rank (multiples of the element size)
  DataType dtype = DataType::kFloat32;                 // for reduce steps
  ReduceOp op = ReduceOp::kSum;                        // for reduce steps
  int shift = 0;
  int reduce_steps = 0;
  int copy_steps = 0;
  // When set, the last reduce step writes its result here (block-relative) instead of into
  // `buf`, fusing reduce-scatter's final step with the copy to the output (reduce_to). Only
  // with copy_steps == 0: copy steps would forward the block from `buf`.
  uint8_t* final_output = nullptr;

  // Blocking, bounded by the context's deadline. Requires ctx.size() ≥ 2. Uses ctx.scratch().
  Status run(CollectiveContext& ctx) const;
};

}  // namespace cohort::comm
