#pragma once

// ReduceExchange: the pairwise step that the butterfly and tree algorithms share. Sends one
// region to a peer while receiving a region from a peer (the same one, or another, or none) and
// reducing it into a local region:
//
//   accumulate[i] = accumulate[i] op received[i]
//
// The received region arrives in segments (chunking.h) into kPipelineDepth scratch slots and is
// reduced straight from the slot as each segment lands, so reduction overlaps the transfer of the
// following segments and no copy is made. The sender cuts its region with the same function, so
// both ends agree on every message.
//
// The send and accumulate regions may be the very same region (recursive doubling exchanges the
// whole buffer it reduces into): segment i is then reduced only after its send completed.
//
//   ReduceExchange step;
//   step.dtype = dtype; step.op = op;
//   step.send_peer = partner; step.send = other_half; step.send_count = n;
//   step.recv_peer = partner; step.accumulate = my_half; step.recv_count = n;
//   COHORT_RETURN_IF_ERROR(step.run(ctx));

#include <cstddef>
#include <cstdint>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/types.h"

namespace cohort::comm {

struct ReduceExchange {
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  int send_peer = -1;          // -1: nothing to send
  const void* send = nullptr;  // send_count elements
  size_t send_count = 0;
  int recv_peer = -1;          // -1: nothing to receive
  void* accumulate = nullptr;  // recv_count elements, reduced with what arrives
  size_t recv_count = 0;
  uint32_t step = 0;  // step of segment 0; segment i travels as step + i

  // Blocks until both directions are done or the context's deadline passes. Uses ctx.scratch().
  Status run(CollectiveContext& ctx) const;
};

}  // namespace cohort::comm
