// Data-parallel CNN on Fashion-MNIST (issue 5, section 6): every rank trains the same network on
// its shard of the training set; gradients are averaged by the multi-node optimizer.
//
//   bazel run //worker/examples:train_mnist_dp -- --ranks 2 --epochs 1 --limit 2000
//   train_mnist_dp --init file:///tmp/store?rank=0&world_size=2 --kind flat   # one rank of a job
//   train_mnist_dp --init env:// --epochs 1 --max-steps 50     # a rank of a cohort command job
//                                                              # (configs/jobs/mnist_dp_command.yaml)
//
// Rank 0 prints one line per epoch (training loss, test loss and test accuracy) and, at the end,
// "test accuracy: A". Under cohortd it reports its loss every step and its test accuracy every
// epoch with cohort::report_metrics, so `cohort status` and the progress bar show them.

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>

#include "worker/comm/bootstrap.h"
#include "worker/examples/example_flags.h"
#include "worker/examples/fashion_cnn.h"
#include "worker/examples/example_rank.h"
#include "worker/train/report_metrics.h"

namespace {

constexpr const char* kDescription =
    "Data-parallel CNN on Fashion-MNIST: every rank trains the same network on its shard of the\n"
    "training set; the multi-node optimizer averages the gradients. Without --init it starts --ranks\n"
    "local ranks; under cohortd (--init env://) it reports its metrics to the coordinator.";

}  // namespace

int main(int argc, char** argv) {
  cohort::examples::ExampleFlags flags;
  flags.ranks = 1;
  cohort::examples::ExampleFlagSet extra_flags;
  extra_flags.max_steps = true;
  extra_flags.double_buffering = true;
  int exit_code = 0;
  auto comm = cohort::examples::start_example_rank(argc, argv, "train_mnist_dp", kDescription, flags, &exit_code,
                                                   extra_flags);
  if (comm == nullptr) return exit_code;
  cohort::examples::DataParallelOptions options;
  options.epochs = flags.epochs;
  options.limit = flags.limit;
  options.max_steps = flags.max_steps;
  options.double_buffering = flags.double_buffering;
  // Progress for cohortd (a no-op outside it and on ranks other than 0; never waits on the network).
  // total_steps and total_epochs give `cohort submit --follow` its progress bar.
  int64_t run_steps = 0;  // the run's total, as on_step last said
  options.on_step = [&](int64_t step, int64_t total_steps, int epoch, double loss) {
    run_steps = total_steps;
    cohort::report_metrics(
        {{"loss", loss}, {"epoch", epoch}, {"total_epochs", flags.epochs}, {"total_steps", total_steps}}, step);
  };
  options.on_epoch = [&](int64_t step, int epoch, const cohort::examples::EpochStats& stats) {
    const double samples_per_s = stats.seconds > 0 ? static_cast<double>(stats.samples) / stats.seconds : 0;
    cohort::report_metrics({{"loss", stats.train_loss},
                            {"accuracy", stats.test_accuracy},
                            {"epoch", epoch},
                            {"total_epochs", flags.epochs},
                            {"total_steps", run_steps},
                            {"samples_per_s", samples_per_s},
                            {"samples_per_step", options.batch_size * comm->size()}},
                           step, /*epoch_end=*/true);
  };
  auto result = cohort::examples::train_data_parallel(*comm, options);
  if (!result.ok()) {
    std::fprintf(stderr, "train_mnist_dp rank %d: %s\n", comm->rank(), result.status().to_string().c_str());
    return 1;
  }
  if (comm->rank() == 0 && !result->epochs.empty()) {
    std::printf("test accuracy: %.4f\n", result->epochs.back().test_accuracy);
    std::fflush(stdout);
  }
  cohort::flush_metrics();
  return 0;
}
