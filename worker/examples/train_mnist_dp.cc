// Data-parallel CNN on Fashion-MNIST (issue 5, section 6): every rank trains the same network on
// its shard of the training set; gradients are averaged by the multi-node optimizer.
//
//   bazel run //worker/examples:train_mnist_dp -- --ranks 2 --epochs 1 --limit 2000
//   train_mnist_dp --init file:///tmp/store?rank=0&world_size=2 --kind flat   # one rank of a job
//
// Rank 0 prints one line per epoch: training loss, test loss and test accuracy.

#include <ATen/Parallel.h>

#include <cstdio>
#include <string>

#include "worker/comm/bootstrap.h"
#include "worker/examples/example_flags.h"
#include "worker/examples/fashion_cnn.h"
#include "worker/examples/example_rank.h"

namespace {

constexpr const char* kUsage =
    "usage: train_mnist_dp [--ranks N | --init URL] [--kind KIND] [--epochs E] [--limit N]\n"
    "                      [--double-buffering]\n"
    "  --ranks N     start N local ranks (processes over a file:// store)\n"
    "  --init URL    join a job: env://, tcp://host:port, file:///path?rank=R&world_size=N\n"
    "  --kind KIND   communicator kind (default flat)\n"
    "  --epochs E    passes over the training set (default 1)\n"
    "  --limit N     use only the first N training and test samples (default: all)\n"
    "  --double-buffering  apply each step's averaged gradient one step later (its allreduce\n"
    "                overlaps the next step's compute)\n";

}  // namespace

int main(int argc, char** argv) {
  cohort::examples::ExampleFlags flags;
  flags.ranks = 1;
  int exit_code = 0;
  auto comm = cohort::examples::start_example_rank(argc, argv, "train_mnist_dp", kUsage, flags, &exit_code);
  if (comm == nullptr) return exit_code;
  cohort::examples::DataParallelOptions options;
  options.epochs = flags.epochs;
  options.limit = flags.limit;
  options.double_buffering = flags.double_buffering;
  auto result = cohort::examples::train_data_parallel(*comm, options);
  if (!result.ok()) {
    std::fprintf(stderr, "train_mnist_dp rank %d: %s\n", comm->rank(), result.status().to_string().c_str());
    return 1;
  }
  return 0;
}
