#pragma once

// Private to //worker/runner:job_runner (listed in its srcs, never installed): the JobRun behind
// run_job (worker/runner/job_runner.h), whose phases live in files of their own:
//
//   job_runner.cc      run_job, JobRun::run (setup, resume, the epochs) and setup's spec checks
//   job_data.cc        dataset loading, rank 0's scatter / broadcast, batches, device placement
//   job_model.cc       data- and model-parallel models, loss, optimizer, learning-rate schedule
//   job_loop.cc        an epoch's steps, progress lines, metrics reports, global means
//   job_evaluation.cc  the evaluation closing each epoch
//   job_checkpoints.cc the multi-node checkpointer and resume

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"
#include "worker/comm/communicator.h"
#include "worker/runner/job_runner.h"
#include "worker/train/allreduce_persistent.h"
#include "worker/train/multi_node_checkpointer.h"
#include "worker/train/multi_node_evaluator.h"
#include "worker/train/multi_node_iterator.h"
#include "worker/train/multi_node_optimizer.h"
#include "worker/train/tensor_dataset.h"

namespace cohort::worker::job_run {

using train::TensorDataset;

// Evaluation keeps no gradients, so large batches only save per-batch overhead.
constexpr int64_t kEvalBatch = 1000;

// OK on every rank iff `local` is OK on every rank (one allreduce MAX of a failure flag), so a
// step that only some ranks do (rank 0 reading the data) fails everywhere instead of leaving the
// others waiting in their next collective.
Status agree(comm::Communicator& comm, const Status& local, const char* what);

// ---- Loss (job_model.cc) -----------------------------------------------------------------------

enum class LossKind { kCrossEntropy, kNll, kMse };

StatusOr<LossKind> parse_loss(const std::string& name);

// The mean loss of a batch. MSE against class labels compares with their one-hot encoding.
at::Tensor compute_loss(LossKind kind, const at::Tensor& output, const at::Tensor& targets);

// ---- Model (job_model.cc) ----------------------------------------------------------------------

struct Model {
  std::shared_ptr<torch::nn::Module> module;             // parameters, train/eval, checkpoints
  std::function<at::Tensor(const at::Tensor&)> forward;  // this rank's forward
  bool is_chain = false;                                 // model parallel: forward sends and receives
  bool computes_loss = true;                             // this rank's forward output goes to the loss
};

// ---- The run -------------------------------------------------------------------------------

class JobRun {
 public:
  JobRun(const v1::JobSpec& spec, comm::Communicator& comm, const JobRunnerOptions& options)
      : spec_(spec), comm_(comm), options_(options) {}

  StatusOr<JobResult> run();

 private:
  Status setup();
  Status load_data();
  Status build_model();
  // Moves the built model to options.device, makes its optimizer and gives every rank rank 0's
  // replicated parameters (after build_model).
  Status build_optimizer();
  // The multi-node checkpointer when the spec has a checkpoint.dir, before any data or model:
  // a run that does not resume fails here (every rank, FAILED_PRECONDITION) when the directory
  // already holds checkpoints of the job's name.
  Status open_checkpoint_dir();
  // Registers the model, optimizer and training iterator with it (after build_optimizer).
  Status create_checkpointer();
  StatusOr<int64_t> resume();
  // Saves a checkpoint after 0-based `epoch` when checkpoint.interval_epochs says so.
  Status checkpoint_epoch_end(int epoch);
  Status train_epoch(int epoch);
  Status evaluate(int epoch, double epoch_loss_sum, int64_t epoch_loss_steps, int64_t epoch_samples,
                  double seconds);
  StatusOr<std::optional<TensorDataset>> next_train_batch();
  // `batch` on options.device (itself on the CPU).
  TensorDataset on_device(const TensorDataset& batch) const;
  void set_learning_rate(int64_t step);
  // To options.metrics on rank 0, with rank and totals filled in.
  void report(v1::Metrics metrics, bool epoch_end);
  void print(const std::string& line);
  // Global means of this rank's (value, count) pairs: one collective.
  StatusOr<std::map<std::string, double>> global(train::Metrics local);

  bool is_reporter() const { return comm_.rank() == 0; }

  const v1::JobSpec& spec_;
  comm::Communicator& comm_;
  const JobRunnerOptions& options_;

  LossKind loss_ = LossKind::kCrossEntropy;
  Model model_;
  // Sharded: each rank trains on its own shard (data parallel without split layers). Otherwise
  // rank 0 draws every batch and broadcasts it, so all ranks see the same batch.
  bool sharded_ = true;
  TensorDataset train_data_;  // sharded: this rank's shard; else rank 0's whole set (empty elsewhere)
  TensorDataset test_data_;
  std::unique_ptr<train::BatchIterator> train_batches_;
  std::unique_ptr<train::MultiNodeIterator> broadcast_train_;
  std::unique_ptr<train::BatchIterator> test_batches_;  // broadcast mode: rank 0's test batches
  std::unique_ptr<train::MultiNodeIterator> broadcast_test_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<train::MultiNodeOptimizer> multi_node_optimizer_;  // sharded only
  std::unique_ptr<train::AllreducePersistent> sync_buffers_;         // sharded only
  std::unique_ptr<train::MultiNodeCheckpointer> checkpointer_;
  int64_t steps_per_epoch_ = 0;
  int64_t step_ = 0;
  double last_accuracy_ = 0;
  // The previous report's time and comm_.blocked_time(), for Metrics.comm_wait_ratio.
  std::chrono::steady_clock::time_point last_report_time_ = std::chrono::steady_clock::now();
  std::chrono::nanoseconds last_report_blocked_{0};
  JobResult result_;
};

}  // namespace cohort::worker::job_run
