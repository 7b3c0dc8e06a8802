#pragma once

// The training of one cohort job on one rank (issue 6, cohort-worker): what a JobSpec describes,
// on top of worker/train and worker/graph.
//
//   auto comm = create_communicator("flat", InitOptions::from_url(url)).value();
//   JobRunnerOptions options;
//   options.resume = getenv("COHORT_RESUME") == "1";
//   options.metrics = &reporter;                        // rank 0's progress to the coordinator
//   StatusOr<JobResult> result = run_job(spec, *comm, options);   // every rank calls it
//
// Data parallel: rank 0 reads the dataset and scatters the training set (shuffled by `seed`,
// equal shards so every rank takes the same number of steps) and the test set (contiguous
// shards); every rank builds the whole graph (seeded, then rank 0's parameters broadcast) and
// trains behind create_multi_node_optimizer; BatchNorm buffers are averaged before evaluation.
//
// Model parallel: every rank builds the stages whose `rank` is its own, in spec order, as links of
// a MultiNodeChainList (rank_in / rank_out); rank 0 reads the dataset and broadcasts each batch
// (create_multi_node_iterator), so every rank walks the same batches; the ranks whose last stage
// has no rank_out compute the loss; each rank steps its own optimizer over its own stages.
//
// Device: options.device (worker/runner/device_selection.h picks it from gpus_per_proc). On CUDA the model
// is moved there after it is built (so CPU and CUDA runs start from the same weights), every batch
// is moved there before the forward pass, evaluation runs there, and the communicator gets the
// device tensors (pure_nccl carries them with NCCL; the other kinds stage through host memory).
//
// Both: the learning rate follows the schedule per step (linear warm-up over warmup_epochs, then
// constant, step or cosine); each epoch ends with an evaluation on the test set (accuracy and loss
// over all ranks' test samples, MultiNodeEvaluator); every checkpoint.interval_epochs epochs the
// model, optimizer and iterator are saved with the multi-node checkpointer; with `resume` the
// newest checkpoint every rank has is loaded and training continues after it. Without `resume`,
// a checkpoint.dir that already holds checkpoints of the job's name (another run's: any
// iteration, any world size) fails the job on every rank with FAILED_PRECONDITION before the data
// is loaded, instead of at its first checkpoint.
//
// Rank 0 prints progress to options.out:
//   epoch 1/5 step 300/469 loss 0.4120 samples/s 2100
//   epoch 1/5 loss 0.4023 test_loss 0.3961 test_acc 0.8512 samples/s 2093 time 14.2s
//   test accuracy 0.8876                      <- the last line; the CLI parses this format
//
// Collective and blocking: every rank of `comm` calls run_job with the same spec. Errors name what
// failed (dataset file, layer, stage, collective); libtorch exceptions come back as INTERNAL.
// Thread-safety: ranks may run as threads of one process (tests); the seeded model construction is
// serialized process-wide so the global RNG gives every run the same weights.

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::worker {

// Where progress goes. Implementations decide what to send and when (rate limits); report() must
// not block the training thread for long and must not fail the job.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // `metrics` is rank 0's view: step, epoch, loss, accuracy (the latest evaluation),
  // samples_per_s, totals. `epoch_end` marks the report that closes an epoch (with its test
  // accuracy), which a rate-limited sink should not drop. Called from the training thread.
  virtual void report(const v1::Metrics& metrics, bool epoch_end) = 0;
};

// Rank 0's progress line period, in steps.
inline constexpr int64_t kDefaultLogEverySteps = 100;

struct JobRunnerOptions {
  bool resume = false;             // load the newest complete checkpoint first (COHORT_RESUME=1)
  MetricsSink* metrics = nullptr;  // rank 0 reports here; null: nowhere. Not owned
  std::FILE* out = stdout;         // rank 0's progress lines; null: silent
  int64_t log_every_steps = kDefaultLogEverySteps;  // a progress line (and a global loss) every N steps
  std::string fashion_mnist_dir;                    // FASHION_MNIST with an empty path; "": kFashionMnistDir
  c10::Device device = c10::kCPU;  // where the model, batches and evaluation live (select_device)
};

struct EpochResult {
  int epoch = 0;             // 0-based
  double train_loss = 0;     // mean over the epoch's steps and the loss ranks
  double test_loss = 0;      // over all test samples
  double test_accuracy = 0;  // over all test samples
  double samples_per_s = 0;  // training samples of all ranks per second
};

struct JobResult {
  std::vector<EpochResult> epochs;  // the epochs this run trained (after a resume: the rest)
  int64_t steps = 0;                // optimizer steps at the end, counting resumed ones
  int64_t steps_per_epoch = 0;
  std::optional<int64_t> resumed_from;  // the checkpoint step loaded, if any
  double test_accuracy = 0;             // of the last evaluation
  double test_loss = 0;                 // of the last evaluation
};

// Trains `spec` on this rank (see the top of this file). The spec is assumed validated by the
// coordinator; what run_job still cannot do (a missing file, an unknown loss, a stage naming a
// rank outside the world) is INVALID_ARGUMENT / NOT_FOUND on every rank alike where it can tell.
StatusOr<JobResult> run_job(const v1::JobSpec& spec, comm::Communicator& comm,
                            const JobRunnerOptions& options = {});

// The learning rate at step `step` (0-based) of `steps_per_epoch` under `optimizer`'s schedule
// over `epochs` epochs. Pure; for tests.
double scheduled_learning_rate(const v1::Optimizer& optimizer, int epochs, int64_t steps_per_epoch,
                               int64_t step);

}  // namespace cohort::worker
