#pragma once

// The data-parallel Fashion-MNIST CNN of issue 5 (section 6 and its benchmark), shared by
// worker/examples/train_mnist_dp and bench/train_fashion_mnist so both train the same network:
// conv 1→32 3×3 pad 1 + BN + ReLU + maxpool 2, conv 32→64 3×3 pad 1 + BN + ReLU + maxpool 2,
// FC 3136→128, ReLU, FC 128→10; SGD momentum 0.9, lr 0.05, per-rank batch 64.
//
//   auto comm = create_communicator("flat", InitOptions::from_url(url)).value();
//   DataParallelOptions options;
//   options.epochs = 5;
//   StatusOr<DataParallelResult> result = train_data_parallel(*comm, options);

#include <cstdint>
#include <functional>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "worker/base/status.h"
#include "worker/comm/communicator.h"

namespace cohort::examples {

class FashionCnnImpl : public torch::nn::Module {
 public:
  FashionCnnImpl();
  // x: [N, 1, 28, 28] float. Returns logits [N, 10].
  at::Tensor forward(const at::Tensor& x);

 private:
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::BatchNorm2d bn1_{nullptr};
  torch::nn::Conv2d conv2_{nullptr};
  torch::nn::BatchNorm2d bn2_{nullptr};
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(FashionCnn);

struct EpochStats;

struct DataParallelOptions {
  int epochs = 1;             // passes over the training set
  int64_t max_steps = 0;      // > 0: stop after this many optimizer steps in all (that epoch is still evaluated)
  int64_t batch_size = 64;    // per rank
  double lr = 0.05;           // SGD learning rate
  double momentum = 0.9;      // SGD momentum
  int64_t limit = 0;          // > 0: use only the first `limit` training (and test) samples
  uint64_t seed = 0;          // model initialization and shuffling
  bool verbose = true;        // rank 0 prints one line per epoch
  bool double_buffering = false;  // apply the previous step's averaged gradient (see
                                  // MultiNodeOptimizerOptions::double_buffering)
  // Splits comm_wait_seconds into waiting for a slower rank and the rest (EpochStats::skew_wait_seconds),
  // with one allgather of every step's end-of-backward time per epoch. Those times are
  // CLOCK_MONOTONIC readings, comparable only between processes of one host: set it only when
  // every rank runs on this host (the benchmark's local ranks). Not with double_buffering, whose
  // step() waits for the previous step's allreduces: that wait is not the current step's skew.
  bool measure_skew = false;
  // Called on every rank after each optimizer step with the step number (from 1, over the whole
  // run), the steps the whole run takes (epochs and max_steps applied), the epoch (0-based) and
  // this rank's batch loss; e.g. to report progress. Optional.
  std::function<void(int64_t step, int64_t total_steps, int epoch, double loss)> on_step;
  // Called on every rank after each epoch's evaluation with the step count so far and the epoch's
  // global statistics. Optional.
  std::function<void(int64_t step, int epoch, const EpochStats& stats)> on_epoch;
};

struct EpochStats {
  double train_loss = 0;      // mean over the epoch's batches, averaged over ranks
  double test_loss = 0;       // over the whole test set
  double test_accuracy = 0;   // over the whole test set
  double seconds = 0;         // training time of the epoch (evaluation excluded)
  double comm_wait_seconds = 0;  // of which step() waited for gradient allreduces
  // With measure_skew, the part of comm_wait_seconds that was spent waiting for the slowest rank
  // to end its backward pass (per step: the smaller of the step's wait and the time from this
  // rank's end of backward to the last rank's); the rest of the wait is communication after every
  // rank was ready. -1 without measure_skew.
  double skew_wait_seconds = -1;
  // Forward + backward time per step on this rank: mean and standard deviation in seconds (how
  // much the compute itself varies from step to step, which is what the ranks' skew comes from).
  double compute_mean_seconds = 0;
  double compute_sd_seconds = 0;
  double cpu_seconds = 0;        // CPU time of this rank's process (all threads) during that training:
                                 // unlike `seconds`, hardly moved by other load on the machine
  int64_t page_faults = 0;       // minor page faults of this rank's process during that training
  int64_t steps = 0;             // optimizer steps of the epoch
  int64_t samples = 0;        // training samples processed by all ranks
};

struct DataParallelResult {
  std::vector<EpochStats> epochs;
};

// Reads Fashion-MNIST on every rank, gives each rank its shard of the training set
// (scatter_range, equal length), trains with create_multi_node_optimizer, averages the BN
// statistics (AllreducePersistent) and evaluates each epoch on the test set split over the ranks
// (create_multi_node_evaluator). Collective and blocking; errors name what failed.
StatusOr<DataParallelResult> train_data_parallel(comm::Communicator& comm, const DataParallelOptions& options);

}  // namespace cohort::examples
