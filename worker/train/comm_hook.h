#pragma once

// DDP-style communication hooks for the multi-node optimizer (PyTorch's register_comm_hook and
// torch.distributed.algorithms.ddp_comm_hooks): MultiNodeOptimizerOptions::comm_hook replaces
// the optimizer's own allreduce (AVG) of each gradient bucket.
//
//   MultiNodeOptimizerOptions options;
//   options.comm_hook = fp16_compress_hook;           // or allreduce_hook, bf16_compress_hook
//   auto optimizer = create_multi_node_optimizer(sgd, *comm, options);
//
// Contract: the hook is called once per bucket per step, in bucket order on every rank (from a
// gradient hook on autograd's thread with overlap, else from step()), with this rank's gradients
// flattened in bucket.buffer. It starts the bucket's communication without blocking and returns
// a BucketFuture: `work` completes the communication (distributed::then chains a local step such
// as decompression after it), after which `result` holds the bucket averaged over the ranks
// (bucket.buffer itself, or another tensor of its numel that the optimizer copies in). It must
// issue the same collectives on every rank. A hook with state (PowerSGD: per-bucket error
// feedback and low-rank factors, keyed by bucket.index) is a callable object capturing it.

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>

#include "worker/comm/communicator.h"
#include "worker/distributed/work.h"

namespace cohort::train {

// torch.distributed.GradBucket.
struct GradBucket {
  size_t index = 0;                       // launch order, 0 first; the same bucket each step
  at::Tensor buffer;                      // flat gradients of this rank (the bucket's dtype)
  std::vector<at::Tensor> parameters;     // in the order of their spans of buffer
  bool is_last = false;                   // the last bucket of the step
  std::optional<comm::Duration> timeout;  // the optimizer's per-collective timeout, if set
};

// The future a hook returns (torch.futures.Future[Tensor]).
struct BucketFuture {
  std::shared_ptr<distributed::Work> work;
  at::Tensor result;  // valid once work completed
};

using CommHook = std::function<BucketFuture(comm::Communicator& group, const GradBucket& bucket)>;

// ddp_comm_hooks.default_hooks.allreduce_hook: divides by the world size, then allreduce SUM, in
// place.
BucketFuture allreduce_hook(comm::Communicator& group, const GradBucket& bucket);
// fp16_compress_hook: the bucket travels as Half (divided by the world size first), and is cast
// back into bucket.buffer when the allreduce completed.
BucketFuture fp16_compress_hook(comm::Communicator& group, const GradBucket& bucket);
// bf16_compress_hook: the same in BFloat16.
BucketFuture bf16_compress_hook(comm::Communicator& group, const GradBucket& bucket);

}  // namespace cohort::train
