// Model-parallel MLP on Fashion-MNIST (issue 5, section 6): an MLP 784→512→512→10 split over 3
// ranks with MultiNodeChainList. The chain runs rank 2 → rank 1 → rank 0, so rank 0 holds the
// last layer, computes the loss and prints the per-epoch results.
//
//   bazel run //worker/examples:train_mlp_model_parallel -- --ranks 3 --epochs 1 --limit 2000
//
// Every rank walks the same batches (create_synchronized_iterator, no data traffic); rank 2 feeds
// the images in, rank 0 uses the labels. Each rank steps its own SGD over its own stage.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "worker/comm/bootstrap.h"
#include "worker/examples/example_flags.h"
#include "worker/examples/example_rank.h"
#include "worker/train/idx_dataset.h"
#include "worker/train/multi_node_chain_list.h"
#include "worker/train/multi_node_iterator.h"

namespace {

using cohort::train::kNone;

constexpr const char* kDescription =
    "Model-parallel MLP on Fashion-MNIST: a chain of 3 ranks, each holding one stage of the network\n"
    "(--ranks must stay 3).";
constexpr int kStages = 3;           // the chain needs exactly 3 ranks
constexpr int64_t kBatch = 64;       // the same batch on every rank
constexpr int64_t kHidden = 512;     // width of both hidden layers
constexpr int64_t kEvalBatch = 1000;

cohort::train::TensorDataset limited(cohort::train::TensorDataset data, int64_t limit) {
  return limit > 0 && limit < data.size() ? data.slice(0, limit) : data;
}

int train(cohort::comm::Communicator& comm, const cohort::examples::ExampleFlags& flags) {
  if (comm.size() != kStages) {
    std::fprintf(stderr, "train_mlp_model_parallel: needs %d ranks, got %d\n", kStages, comm.size());
    return 2;
  }
  auto train_data = cohort::train::read_fashion_mnist(true);
  auto test_data = cohort::train::read_fashion_mnist(false);
  if (!train_data.ok() || !test_data.ok()) {
    std::fprintf(stderr, "train_mlp_model_parallel: %s\n",
                 (train_data.ok() ? test_data.status() : train_data.status()).to_string().c_str());
    return 1;
  }
  cohort::train::TensorDataset train_set = limited(*train_data, flags.limit);
  cohort::train::TensorDataset test_set = limited(*test_data, flags.limit);

  const int rank = comm.rank();
  auto chain = std::make_shared<cohort::train::MultiNodeChainList>(comm);
  // Global link order: input stage (rank 2), hidden stage (rank 1), output stage (rank 0).
  if (rank == 2) {
    chain->add_link(torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(784, kHidden), torch::nn::ReLU()),
                    kNone, 1);
  }
  if (rank == 1) chain->add_link(torch::nn::Sequential(torch::nn::Linear(kHidden, kHidden), torch::nn::ReLU()), 2, 0);
  if (rank == 0) chain->add_link(torch::nn::Linear(kHidden, 10), 1, kNone);
  torch::optim::SGD sgd(chain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

  auto batches = cohort::train::create_synchronized_iterator(train_set, kBatch, comm);
  if (!batches.ok()) {
    std::fprintf(stderr, "train_mlp_model_parallel: %s\n", batches.status().to_string().c_str());
    return 1;
  }
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    double loss_sum = 0;
    int64_t steps = 0;
    while (std::optional<cohort::train::TensorDataset> batch = (*batches)->next()) {
      sgd.zero_grad();
      at::Tensor y = chain->forward(batch->inputs);
      if (rank == 0) {
        at::Tensor loss = at::cross_entropy_loss(y, batch->targets);
        loss.backward();
        loss_sum += loss.item<double>();
      } else {
        y.backward();  // a delegate: runs this rank's part of backward
      }
      sgd.step();
      ++steps;
    }
    double correct = 0;
    double test_loss = 0;
    for (int64_t begin = 0; begin < test_set.size(); begin += kEvalBatch) {
      cohort::train::TensorDataset b = test_set.slice(begin, std::min(test_set.size(), begin + kEvalBatch));
      at::Tensor y = chain->forward(b.inputs).detach();
      if (rank == 0) {
        test_loss += at::cross_entropy_loss(y, b.targets, {}, at::Reduction::Sum).item<double>();
        correct += y.argmax(1).eq(b.targets).sum().item<double>();
      }
    }
    if (rank == 0) {
      double n = static_cast<double>(test_set.size());
      std::printf("epoch %d  train_loss=%.4f  test_loss=%.4f  test_acc=%.4f\n", epoch + 1,
                  steps > 0 ? loss_sum / steps : 0.0, test_loss / n, correct / n);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  cohort::examples::ExampleFlags flags;
  flags.ranks = kStages;
  int exit_code = 0;
  auto comm = cohort::examples::start_example_rank(argc, argv, "train_mlp_model_parallel", kDescription, flags, &exit_code);
  if (comm == nullptr) return exit_code;
  try {
    return train(*comm, flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp_model_parallel rank %d: %s\n", comm->rank(), e.what());
    return 1;
  }
}
