// VGG-style CNN on Fashion-MNIST with channel-parallel convolutions (issue 5, section 6): every
// convolution is a ParallelConvolution2D, so each rank computes its share of the output channels
// and the shares are allgathered. All ranks feed the same batch and compute the same loss (the
// model-parallel contract of parallel_convolution_2d.h); rank 0 prints the per-epoch results.
//
//   bazel run //worker/examples:train_vgg_parallel_conv -- --ranks 2 --epochs 1 --limit 2000
//
// Network: [conv 3×3 + BN + ReLU] ×2 (32 channels), maxpool 2, [conv 3×3 + BN + ReLU] ×2
// (64 channels), maxpool 2, FC 3136→128, ReLU, FC 128→10.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include "worker/comm/bootstrap.h"
#include "worker/examples/example_flags.h"
#include "worker/examples/example_rank.h"
#include "worker/train/idx_dataset.h"
#include "worker/train/multi_node_iterator.h"
#include "worker/train/parallel_convolution_2d.h"

namespace {

constexpr const char* kDescription =
    "A VGG-style network on Fashion-MNIST whose convolutions are split over the ranks by channel\n"
    "(parallel_conv2d); every rank sees the same batch.";
constexpr int64_t kBatch = 64;  // the same batch on every rank
constexpr int64_t kEvalBatch = 500;

class VggImpl : public torch::nn::Module {
 public:
  explicit VggImpl(cohort::comm::Communicator& comm) {
    // The replicated layers are built first, from the same seed on every rank, so they start
    // equal; the parallel convolutions draw a different number of values on each rank.
    fc1_ = register_module("fc1", torch::nn::Linear(3136, 128));
    fc2_ = register_module("fc2", torch::nn::Linear(128, 10));
    const int64_t channels[][2] = {{1, 32}, {32, 32}, {32, 64}, {64, 64}};
    for (int i = 0; i < 4; ++i) {
      auto options = torch::nn::Conv2dOptions(channels[i][0], channels[i][1], 3).padding(1);
      // Output-channel split: every layer equals a full Conv2d (the first has one input channel,
      // which ChainerMN's input-channel split could not share).
      convs_.push_back(register_module(
          "conv" + std::to_string(i),
          cohort::train::ParallelConvolution2D(comm, options, cohort::train::ChannelSplit::kOutput)));
      bns_.push_back(register_module("bn" + std::to_string(i), torch::nn::BatchNorm2d(channels[i][1])));
    }
  }

  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < convs_.size(); ++i) {
      x = at::relu(bns_[i]->forward(convs_[i]->forward(x)));
      if (i % 2 == 1) x = at::max_pool2d(x, 2);
    }
    return fc2_->forward(at::relu(fc1_->forward(x.flatten(1))));
  }

 private:
  std::vector<cohort::train::ParallelConvolution2D> convs_;
  std::vector<torch::nn::BatchNorm2d> bns_;
  torch::nn::Linear fc1_{nullptr};
  torch::nn::Linear fc2_{nullptr};
};
TORCH_MODULE(Vgg);

cohort::train::TensorDataset limited(cohort::train::TensorDataset data, int64_t limit) {
  return limit > 0 && limit < data.size() ? data.slice(0, limit) : data;
}

int train(cohort::comm::Communicator& comm, const cohort::examples::ExampleFlags& flags) {
  auto train_data = cohort::train::read_fashion_mnist(true);
  auto test_data = cohort::train::read_fashion_mnist(false);
  if (!train_data.ok() || !test_data.ok()) {
    std::fprintf(stderr, "train_vgg_parallel_conv: %s\n",
                 (train_data.ok() ? test_data.status() : train_data.status()).to_string().c_str());
    return 1;
  }
  cohort::train::TensorDataset train_set = limited(*train_data, flags.limit);
  cohort::train::TensorDataset test_set = limited(*test_data, flags.limit);

  at::manual_seed(0);
  Vgg model(comm);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  auto batches = cohort::train::create_synchronized_iterator(train_set, kBatch, comm);
  if (!batches.ok()) {
    std::fprintf(stderr, "train_vgg_parallel_conv: %s\n", batches.status().to_string().c_str());
    return 1;
  }
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    model->train();
    double loss_sum = 0;
    int64_t steps = 0;
    while (std::optional<cohort::train::TensorDataset> batch = (*batches)->next()) {
      sgd.zero_grad();
      at::Tensor loss = at::cross_entropy_loss(model->forward(batch->inputs), batch->targets);
      loss.backward();  // collective: the parallel convolutions allgather / allreduce
      sgd.step();
      loss_sum += loss.item<double>();
      ++steps;
    }
    model->eval();
    double correct = 0;
    double test_loss = 0;
    for (int64_t begin = 0; begin < test_set.size(); begin += kEvalBatch) {
      cohort::train::TensorDataset b = test_set.slice(begin, std::min(test_set.size(), begin + kEvalBatch));
      at::Tensor y = model->forward(b.inputs).detach();
      test_loss += at::cross_entropy_loss(y, b.targets, {}, at::Reduction::Sum).item<double>();
      correct += y.argmax(1).eq(b.targets).sum().item<double>();
    }
    if (comm.rank() == 0) {
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
  flags.ranks = 2;
  int exit_code = 0;
  auto comm = cohort::examples::start_example_rank(argc, argv, "train_vgg_parallel_conv", kDescription, flags, &exit_code);
  if (comm == nullptr) return exit_code;
  try {
    return train(*comm, flags);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_vgg_parallel_conv rank %d: %s\n", comm->rank(), e.what());
    return 1;
  }
}
