#pragma once

// Data-parallel training over a communicator (ChainerMN's create_multi_node_optimizer, PyTorch
// DDP's reducer): wraps any torch::optim::Optimizer so that step() applies the gradient averaged
// over every rank.
//
//   torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.05).momentum(0.9));
//   auto optimizer = create_multi_node_optimizer(sgd, *comm);   // registers gradient hooks
//   for (auto& batch : my_shard) {
//     optimizer->zero_grad();
//     loss_fn(model(batch)).backward();   // bucket allreduces start while backward runs
//     optimizer->step();                  // waits for them, writes the averages, steps
//   }
//
// Protocol per step (every rank must call step() the same number of times):
//  1. Parameters are laid out once, in reverse order (the order backward usually produces their
//     gradients), into buckets that are closed as soon as they hold options.bucket_bytes or more
//     (the first bucket: options.first_bucket_bytes, so communication starts early); a bucket
//     holds one dtype and device. This is PyTorch DDP's rule: a parameter larger than the limit
//     joins the small ones before it and leaves with them as soon as its gradient arrives — under
//     an "at most" rule it would open a bucket that waits for the gradients of every parameter
//     after it (for a CNN whose FC layer holds most weights: the whole backward).
//  2. With options.overlap, a hook on each parameter copies its gradient into the bucket as
//     backward produces it; a full bucket is allreduced (AVG) asynchronously — but only after every
//     earlier bucket, so all ranks issue the same collectives in the same order whatever order
//     their hooks fire in. Without overlap, step() packs .grad into the buckets after backward.
//  3. step(): parameters that produced no gradient this step contribute zeros (the buckets must
//     match on every rank), the remaining buckets are launched, all are awaited, the averages are
//     written to .grad, and on the first step rank 0's parameters are broadcast (ChainerMN's
//     needs_broadcast) before the wrapped optimizer steps.
//
// Gradient accumulation over several backward passes per step needs overlap=false (a hook firing
// twice for a parameter before step() is reported as an error). With options.grad_dtype, floating
// gradients travel (and are summed, per the communicator's kernels) in that type and are cast
// back to the parameter's type; f16 and bf16 buckets are divided by the world size before the
// sum (as fp16_compress_hook), so partial sums do not overflow f16; parameters are always broadcast in their
// own type. Module buffers (BatchNorm statistics) are not broadcast: only the optimizer's parameters are (see
// AllreducePersistent).
//
// Double buffering (options.double_buffering, ChainerMN's double_buffering=True): the buckets
// exist twice. Step t's gradients go into one set and its allreduces are launched (from the
// hooks, or in step()) but not awaited: they run in the background through step t+1's forward
// and backward. step() at t waits for the other set — step t-1's allreduces — and steps the
// wrapped optimizer with those averages, so the update at step t applies the averaged gradient
// g_{t-1} (computed at the parameters of step t-1: one step stale, which hides the whole
// allreduce behind the next step's compute).
//  - Step 0 launches g_0's allreduces, performs the first-step broadcast (unless
//    broadcast_parameters() ran before) and does NOT step the wrapped optimizer: parameters are
//    unchanged apart from the broadcast, .grad keeps this rank's local g_0. Call
//    broadcast_parameters() before the first forward when ranks initialize differently, or g_0
//    is computed at each rank's own parameters (it is still averaged and applied at step 1).
//  - After k calls of step() the wrapped optimizer has stepped k-1 times (g_0 … g_{k-2}); the
//    averaged g_{k-1} is in flight and is dropped by the destructor (as by ChainerMN). A
//    checkpoint does not hold it: a resumed run's first step applies nothing again.
//  - Works with overlap on or off, grad_dtype and zero_fill: zero_fill decides, as without double
//    buffering, from whether the parameter had a gradient at the step that produced g_{t-1}
//    (without zero_fill such a parameter's .grad is left undefined, so the optimizer skips it).
//  - Costs a second set of bucket buffers (the gradient bytes once more).
//
// Thread-safety: one training thread calls step()/zero_grad(); the hooks may run on autograd's
// threads and are synchronized internally. The optimizer, the communicator and the parameters
// must outlive this object; destroying it removes its hooks.

#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "worker/comm/communicator.h"
#include "worker/train/comm_hook.h"

namespace cohort::train {

// PyTorch DDP's defaults: large buckets amortize per-collective latency; a small first bucket
// lets the last layers' gradients go out while the rest of backward still runs.
inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;
inline constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;

struct MultiNodeOptimizerOptions {
  size_t bucket_bytes = kDefaultBucketBytes;             // a bucket closes at this many bytes
  size_t first_bucket_bytes = kDefaultFirstBucketBytes;  // the same for the first (last layers')
  bool overlap = true;    // launch allreduces from gradient hooks during backward (else in step())
  bool zero_fill = true;  // a parameter with no gradient here gets the average (others' / size)
                          // as its .grad; false leaves an undefined .grad undefined on this rank
  std::optional<at::ScalarType> grad_dtype;  // e.g. at::kBFloat16: halves gradient traffic;
                                             // unset: each parameter's own type
  std::optional<comm::Duration> timeout;     // per allreduce/broadcast; the communicator's by default
  // Step t applies step t-1's average while step t's allreduce overlaps the next
  // forward/backward (see above).
  bool double_buffering = false;
  // DDP-style communication hook (comm_hook.h: allreduce_hook, fp16_compress_hook,
  // bf16_compress_hook, or your own): replaces the allreduce (AVG) of each gradient bucket. It
  // sees the bucket in grad_dtype when set (compress with one or the other, not both).
  CommHook comm_hook;
};

class MultiNodeOptimizer {
 public:
  // Lays out the buckets and (with overlap) registers a hook on every parameter that requires
  // grad. Local: no communication.
  MultiNodeOptimizer(torch::optim::Optimizer& optimizer, comm::Communicator& comm,
                     MultiNodeOptimizerOptions options = {});
  ~MultiNodeOptimizer();
  MultiNodeOptimizer(const MultiNodeOptimizer&) = delete;
  MultiNodeOptimizer& operator=(const MultiNodeOptimizer&) = delete;

  // Averages the gradients over all ranks and steps the wrapped optimizer (see the protocol
  // above; with double buffering, launches this step's averaging and applies the previous
  // step's). Collective and blocking; throws std::runtime_error naming the failed collective.
  void step();

  // Overwrites every parameter with rank 0's values now (collective, blocking); step() then
  // skips its first-step broadcast. Call before the first forward when ranks initialize their
  // models differently.
  void broadcast_parameters();

  // The wrapped optimizer's zero_grad().
  void zero_grad();

  torch::optim::Optimizer& actual_optimizer() { return optimizer_; }
  comm::Communicator& communicator() { return comm_; }

  // Elements per bucket, in launch order: for tests and logs.
  std::vector<size_t> bucket_sizes() const;
  // Buckets whose allreduce has started this step (with overlap, during backward); with double
  // buffering, of the set this step's gradients go to. Thread-safe.
  size_t launched_buckets() const;
  // Seconds step() has spent blocked on gradient allreduces since construction: the part of
  // communication that backward (with double buffering: the next forward and backward) did not
  // hide. Call from the training thread.
  double communication_wait_seconds() const;

  struct State;  // shared with the hooks (defined in the .cc)

 private:
  torch::optim::Optimizer& optimizer_;
  comm::Communicator& comm_;
  std::shared_ptr<State> state_;
};

// ChainerMN's name for the constructor.
std::unique_ptr<MultiNodeOptimizer> create_multi_node_optimizer(torch::optim::Optimizer& optimizer,
                                                                comm::Communicator& comm,
                                                                MultiNodeOptimizerOptions options = {});

}  // namespace cohort::train
