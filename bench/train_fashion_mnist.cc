// Benchmark of issue 5: the data-parallel Fashion-MNIST CNN (worker/examples/fashion_cnn.h) on N
// local ranks, one intra-op thread each. Its peer is bench/ddp_fashion_mnist.py (PyTorch DDP,
// gloo) with the same network, data, batch, optimizer and epochs.
//
//   bazel run //bench:train_fashion_mnist -- --ranks 2 --epochs 1
//
// Ends with one line (rank 0), wrapped here:
//   RESULT acc=0.9123 samples_per_s=1234 epoch_s=45.6 comm_wait=4.1% cpu_ms_per_step=80.5
//          faults_per_step=2100 skew_wait=3.8% compute_ms=75.1 compute_sd_ms=6.2
// acc: test accuracy after the last epoch; samples_per_s: training samples of all ranks per second
// of training time (evaluation excluded); epoch_s: mean training time per epoch; comm_wait: share
// of rank 0's training time that step() spent blocked on gradient allreduces; cpu_ms_per_step:
// CPU time of rank 0's process (all its threads) per training step, which other load on the
// machine moves least (wall-clock rates move most); faults_per_step: its minor page faults per
// training step (memory the allocator gave back and faulted in again); skew_wait: the part of
// comm_wait spent waiting for the slowest rank to end its backward pass (the rest is communication
// after every rank was ready; printed only when every rank runs on this host, where the ranks'
// clocks compare); compute_ms / compute_sd_ms: rank 0's forward + backward time per step, mean and
// standard deviation (the step-to-step variation the skew comes from).

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "worker/comm/bootstrap.h"
#include "worker/examples/example_flags.h"
#include "worker/examples/fashion_cnn.h"
#include "worker/examples/example_rank.h"

namespace {

constexpr const char* kDescription =
    "Benchmark: the data-parallel Fashion-MNIST CNN on N local ranks, one intra-op thread each\n"
    "(compare bench/ddp_fashion_mnist.py). Ends with RESULT acc=... samples_per_s=... epoch_s=...\n"
    "comm_wait=...% on rank 0.";

}  // namespace

int main(int argc, char** argv) {
  cohort::examples::ExampleFlags flags;
  flags.ranks = 2;
  cohort::examples::ExampleFlagSet extra_flags;
  extra_flags.double_buffering = true;
  int exit_code = 0;
  auto comm = cohort::examples::start_example_rank(argc, argv, "train_fashion_mnist", kDescription, flags, &exit_code,
                                                   extra_flags);
  if (comm == nullptr) return exit_code;
  cohort::examples::DataParallelOptions options;
  options.epochs = flags.epochs;
  options.limit = flags.limit;
  options.double_buffering = flags.double_buffering;
  cohort::StatusOr<bool> one_host = cohort::examples::all_ranks_on_this_host(*comm);
  if (!one_host.ok()) {
    std::fprintf(stderr, "train_fashion_mnist rank %d: %s\n", comm->rank(), one_host.status().to_string().c_str());
    return 1;
  }
  options.measure_skew = *one_host && !options.double_buffering;  // see DataParallelOptions
  auto result = cohort::examples::train_data_parallel(*comm, options);
  if (!result.ok()) {
    std::fprintf(stderr, "train_fashion_mnist rank %d: %s\n", comm->rank(), result.status().to_string().c_str());
    return 1;
  }
  if (comm->rank() == 0 && !result->epochs.empty()) {
    double seconds = 0;
    double wait = 0;
    double samples = 0;
    double cpu = 0;
    double steps = 0;
    double faults = 0;
    double skew = 0;
    double compute = 0;
    double compute_squares = 0;  // sum over steps of the squared compute time, pooled over epochs
    for (const auto& epoch : result->epochs) {
      seconds += epoch.seconds;
      wait += epoch.comm_wait_seconds;
      samples += static_cast<double>(epoch.samples);
      cpu += epoch.cpu_seconds;
      steps += static_cast<double>(epoch.steps);
      faults += static_cast<double>(epoch.page_faults);
      skew += epoch.skew_wait_seconds;
      const double n = static_cast<double>(epoch.steps);
      compute += epoch.compute_mean_seconds * n;
      compute_squares += n * (epoch.compute_sd_seconds * epoch.compute_sd_seconds +
                              epoch.compute_mean_seconds * epoch.compute_mean_seconds);
    }
    std::printf("ranks=%d kind=%s epochs=%zu double_buffering=%d\n", comm->size(), flags.kind.c_str(),
                result->epochs.size(), flags.double_buffering ? 1 : 0);
    std::printf(
        "RESULT acc=%.4f samples_per_s=%.0f epoch_s=%.1f comm_wait=%.1f%% cpu_ms_per_step=%.1f "
        "faults_per_step=%.0f",
        result->epochs.back().test_accuracy, samples / seconds, seconds / result->epochs.size(),
        100.0 * wait / seconds, steps > 0 ? 1000.0 * cpu / steps : 0.0, steps > 0 ? faults / steps : 0.0);
    if (options.measure_skew) std::printf(" skew_wait=%.1f%%", 100.0 * skew / seconds);
    const double compute_mean = steps > 0 ? compute / steps : 0.0;
    const double compute_sd =
        steps > 0 ? std::sqrt(std::max(0.0, compute_squares / steps - compute_mean * compute_mean)) : 0.0;
    std::printf(" compute_ms=%.1f compute_sd_ms=%.1f\n", 1000.0 * compute_mean, 1000.0 * compute_sd);
  }
  return 0;
}
