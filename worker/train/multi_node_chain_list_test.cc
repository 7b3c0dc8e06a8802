#include "worker/train/multi_node_chain_list.h"

#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/nn/modules/linear.h>

#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::train {
namespace {

using autograd::testing::run_autograd_ranks;

// The reference MLP: stage i is tanh(Linear) except the last, plain Linear. "branch" is a second
// middle stage for the fan-out test.
struct Reference {
  std::vector<torch::nn::Linear> stages;
  torch::nn::Linear branch{nullptr};
  at::Tensor x;
  at::Tensor upstream;
};

torch::nn::Linear make_linear(int64_t in, int64_t out, double seed) {
  torch::nn::Linear linear(in, out);
  linear->to(at::kDouble);
  torch::NoGradGuard no_grad;
  linear->weight.copy_(at::arange(in * out, at::kDouble).mul(seed).sin().reshape({out, in}));
  linear->bias.copy_(at::arange(out, at::kDouble).mul(seed + 0.3).cos().mul(0.1));
  return linear;
}

Reference make_reference() {
  Reference ref;
  ref.stages = {make_linear(4, 6, 0.7), make_linear(6, 5, 1.3), make_linear(5, 3, 0.45)};
  ref.branch = make_linear(6, 5, 2.1);
  ref.x = at::arange(5 * 4, at::kDouble).mul(0.37).sin().reshape({5, 4});
  ref.upstream = at::arange(5 * 3, at::kDouble).mul(0.61).cos().add(0.5).reshape({5, 3});
  return ref;
}

// A rank's copy of a reference stage (same weights, own gradients).
torch::nn::Linear copy_of(const torch::nn::Linear& ref) {
  torch::nn::Linear linear(ref->options);
  linear->to(at::kDouble);
  torch::NoGradGuard no_grad;
  linear->weight.copy_(ref->weight);
  linear->bias.copy_(ref->bias);
  return linear;
}

LinkFunction tanh_of(const torch::nn::Linear& linear) {
  auto module = linear.ptr();
  return [module](const std::vector<at::Tensor>& in) { return at::tanh(module->forward(in.at(0))); };
}

void expect_same_gradients(const torch::nn::Linear& got, const torch::nn::Linear& want,
                           const std::string& what) {
  EXPECT_TRUE(at::allclose(got->weight.grad(), want->weight.grad())) << what << " weight grad";
  EXPECT_TRUE(at::allclose(got->bias.grad(), want->bias.grad())) << what << " bias grad";
}

// Runs the reference in one process: loss = sum(y * upstream), gradients on the stages and x.
at::Tensor reference_loss(Reference& ref, bool branch, at::Tensor* x_grad) {
  at::Tensor x = ref.x.clone().set_requires_grad(true);
  at::Tensor h = at::tanh(ref.stages[0]->forward(x));
  at::Tensor mid = at::tanh(ref.stages[1]->forward(h));
  if (branch) mid = mid + at::tanh(ref.branch->forward(h));
  at::Tensor loss = ref.stages[2]->forward(mid).mul(ref.upstream).sum();
  loss.backward();
  *x_grad = x.grad();
  return loss.detach();
}

TEST(MultiNodeChainListTest, ThreeStagesOverThreeRanksMatchOneProcess) {
  Reference ref = make_reference();
  at::Tensor want_x_grad;
  at::Tensor want_loss = reference_loss(ref, /*branch=*/false, &want_x_grad);

  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    torch::nn::Linear stage = copy_of(ref.stages[rank]);
    if (rank == 0) chain.add_link(stage.ptr(), tanh_of(stage), kNone, 1);
    if (rank == 1) chain.add_link(stage.ptr(), tanh_of(stage), 0, 2);
    if (rank == 2) chain.add_link(stage, 1, kNone);
    EXPECT_EQ(chain.parameters().size(), 2u);
    at::Tensor x = rank == 0 ? ref.x.clone().set_requires_grad(true) : at::Tensor();
    at::Tensor y = chain.forward(x);
    if (rank == 2) {
      at::Tensor loss = y.mul(ref.upstream).sum();
      EXPECT_TRUE(at::allclose(loss, want_loss)) << loss << " vs " << want_loss;
      loss.backward();
    } else {
      EXPECT_EQ(y.dim(), 0) << "rank " << rank << ": expected a delegate";
      y.backward();
    }
    expect_same_gradients(stage, ref.stages[rank], "rank " + std::to_string(rank));
    if (rank == 0) {
      EXPECT_TRUE(at::allclose(x.grad(), want_x_grad));
    }
  });
  EXPECT_EQ(failures, "");
}

TEST(MultiNodeChainListTest, LossBackOnTheFirstRank) {
  Reference ref = make_reference();
  at::Tensor want_x_grad;
  at::Tensor want_loss = reference_loss(ref, /*branch=*/false, &want_x_grad);

  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    std::vector<torch::nn::Linear> mine;
    if (rank == 0) {
      mine = {copy_of(ref.stages[0]), copy_of(ref.stages[2])};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), kNone, 1);
      chain.add_link(mine[1], 1, kNone);
    } else {
      mine = {copy_of(ref.stages[1])};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), 0, 0);
    }
    at::Tensor x = ref.x.clone().set_requires_grad(true);
    at::Tensor y = chain.forward(x);
    if (rank == 0) {
      at::Tensor loss = y.mul(ref.upstream).sum();
      EXPECT_TRUE(at::allclose(loss, want_loss)) << loss << " vs " << want_loss;
      loss.backward();
      expect_same_gradients(mine[0], ref.stages[0], "stage 0");
      expect_same_gradients(mine[1], ref.stages[2], "stage 2");
      EXPECT_TRUE(at::allclose(x.grad(), want_x_grad));
    } else {
      EXPECT_EQ(y.dim(), 0);
      y.backward();
      expect_same_gradients(mine[0], ref.stages[1], "stage 1");
    }
  });
  EXPECT_EQ(failures, "");
}

// Rank 0 sends to a list of ranks and receives from a list: h goes to ranks 1 and 2, whose
// outputs come back and are added before the last stage.
TEST(MultiNodeChainListTest, FanOutAndFanInThroughRankLists) {
  Reference ref = make_reference();
  at::Tensor want_x_grad;
  at::Tensor want_loss = reference_loss(ref, /*branch=*/true, &want_x_grad);

  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    std::vector<torch::nn::Linear> mine;
    if (rank == 0) {
      mine = {copy_of(ref.stages[0]), copy_of(ref.stages[2])};
      auto last = mine[1].ptr();
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), kNone, {1, 2});
      chain.add_link(
          last, [last](const std::vector<at::Tensor>& in) { return last->forward(in.at(0) + in.at(1)); },
          {1, 2}, kNone);
    } else {
      mine = {copy_of(rank == 1 ? ref.stages[1] : ref.branch)};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), 0, 0);
    }
    at::Tensor x = ref.x.clone().set_requires_grad(true);
    at::Tensor y = chain.forward(x);
    if (rank == 0) {
      at::Tensor loss = y.mul(ref.upstream).sum();
      EXPECT_TRUE(at::allclose(loss, want_loss)) << loss << " vs " << want_loss;
      loss.backward();
      expect_same_gradients(mine[0], ref.stages[0], "stage 0");
      expect_same_gradients(mine[1], ref.stages[2], "stage 2");
      EXPECT_TRUE(at::allclose(x.grad(), want_x_grad));
    } else {
      y.backward();
      expect_same_gradients(mine[0], rank == 1 ? ref.stages[1] : ref.branch, "rank " + std::to_string(rank));
    }
  });
  EXPECT_EQ(failures, "");
}

// The same chain run twice (tags restart at every forward): gradients accumulate to twice the
// reference's.
TEST(MultiNodeChainListTest, RepeatedForwardsAccumulateGradients) {
  Reference ref = make_reference();
  at::Tensor want_x_grad;
  reference_loss(ref, /*branch=*/false, &want_x_grad);

  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    torch::nn::Linear stage = copy_of(ref.stages[rank]);
    chain.add_link(stage.ptr(),
                   rank == 2 ? LinkFunction([m = stage.ptr()](const std::vector<at::Tensor>& in) {
                     return m->forward(in.at(0));
                   })
                             : tanh_of(stage),
                   rank == 0 ? kNone : LinkRanks(rank - 1), rank == 2 ? kNone : LinkRanks(rank + 1));
    for (int step = 0; step < 2; ++step) {
      at::Tensor y = chain.forward(rank == 0 ? ref.x : at::Tensor());
      if (rank == 2) {
        y.mul(ref.upstream).sum().backward();
      } else {
        y.backward();
      }
    }
    EXPECT_TRUE(at::allclose(stage->weight.grad(), ref.stages[rank]->weight.grad().mul(2)))
        << "rank " << rank;
    EXPECT_TRUE(at::allclose(stage->bias.grad(), ref.stages[rank]->bias.grad().mul(2))) << "rank " << rank;
  });
  EXPECT_EQ(failures, "");
}

TEST(MultiNodeChainListTest, RejectsThisRankAsPeer) {
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    torch::nn::Linear linear(2, 2);
    EXPECT_THROW(chain.add_link(linear, rank, kNone), std::invalid_argument);
    EXPECT_THROW(chain.add_link(linear, kNone, 7), std::invalid_argument);
  });
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
