#pragma once

// torch.distributed's point-to-point calls on at::Tensor (send, recv, isend, irecv,
// batch_isend_irecv) over a cohort Communicator. See collectives.h for what every call accepts.
//
// Wire protocol (worker/autograd/tensor_header.h, shared with worker/autograd's send / recv, so
// either API can receive what the other sent): every send carries a small header (dtype and
// shape, kHeaderWords int64 on tag `tag | kHeaderTagBit`) before the data (on `tag`), so
//  - recv without a tensor learns the shape and dtype from the sender (the issue's "recv may
//    omit the shape"), and
//  - recv into a tensor whose dtype or numel differs from what was sent fails naming both,
//    instead of reading garbage.
// The header costs one small extra message per send. Messages between two ranks with the same
// tag arrive in the order they were sent. A send completes when the receiver has taken it.
//
//   if (rank == 0) send(*comm, at::ones({4}), /*dst=*/1);
//   else           at::Tensor t = recv(*comm, /*src=*/0);    // shape and dtype from rank 0

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "worker/autograd/tensor_header.h"
#include "worker/comm/communicator.h"
#include "worker/distributed/op_options.h"
#include "worker/distributed/work.h"

namespace cohort::distributed {

using comm::Communicator;

// User tags are at most kMaxTag. The API reserves the tags above for itself: headers
// (tag | kHeaderTagBit) and monitored_barrier's. worker/autograd's differentiable point to point
// uses the bit above those for gradients on the same communicator (the table in tensor_header.h).
inline constexpr uint32_t kHeaderTagBit = autograd::kHeaderTagBit;
inline constexpr uint32_t kMaxTag = autograd::kMaxUserTag;
inline constexpr uint32_t kMonitoredBarrierArriveTag = 1u << 27;
inline constexpr uint32_t kMonitoredBarrierReleaseTag = kMonitoredBarrierArriveTag + 1;
// Header: a magic word, the at::ScalarType, the number of dims, then the sizes.
inline constexpr int kHeaderWords = autograd::kHeaderWords;
inline constexpr int kMaxHeaderDims = autograd::kMaxHeaderDims;

// Blocks until `dst` received tensor (within options.timeout, else the communicator's).
void send(Communicator& group, const at::Tensor& tensor, int dst, uint32_t tag = 0,
          const OpOptions& options = {});
// Receives into `tensor` (its dtype and numel must match the sent tensor's; its shape may differ).
void recv(Communicator& group, const at::Tensor& tensor, int src, uint32_t tag = 0,
          const OpOptions& options = {});
// Receives a tensor of the sender's dtype and shape, on `device` (CPU by default).
at::Tensor recv(Communicator& group, int src, uint32_t tag = 0, at::Device device = at::kCPU,
                const OpOptions& options = {});

// Non-blocking: return a pending Work (options.async_op is implied). The tensor must stay
// untouched until the Work completed.
std::shared_ptr<Work> isend(Communicator& group, const at::Tensor& tensor, int dst, uint32_t tag = 0,
                            const OpOptions& options = {});
std::shared_ptr<Work> irecv(Communicator& group, const at::Tensor& tensor, int src, uint32_t tag = 0,
                            const OpOptions& options = {});

// torch.distributed.P2POp: one isend or irecv of a batch.
struct P2POp {
  enum class Kind { kIsend, kIrecv };
  Kind kind = Kind::kIsend;
  at::Tensor tensor;
  int peer = 0;
  uint32_t tag = 0;
};

// Starts every operation of `ops` (in order, none blocking) and returns their Works, in order.
// Collective in torch's sense only for the ranks that appear as peers: each op needs its match.
std::vector<std::shared_ptr<Work>> batch_isend_irecv(Communicator& group, const std::vector<P2POp>& ops,
                                                     const OpOptions& options = {});

}  // namespace cohort::distributed
