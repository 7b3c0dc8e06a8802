#include "worker/train/multi_node_chain_list.h"

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
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

// A frozen first stage (its parameters and the input require no grad) sends a tensor without
// grad: rank 1 sends no gradient back for it (rank 0 would never receive it), and rank 0's later
// receive, whose delegate is that frozen send's, still joins the graph, so rank 1 gets the
// gradient of its output. Both backwards finish at once rather than at the 10 s op timeout, and
// the trainable stages get the gradients of the one-process reference.
TEST(MultiNodeChainListTest, FrozenFirstStageSendsNoGradientAndTheRestTrains) {
  Reference ref = make_reference();
  at::Tensor unused_x_grad;
  reference_loss(ref, /*branch=*/false, &unused_x_grad);

  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    std::vector<torch::nn::Linear> mine;
    if (rank == 0) {
      mine = {copy_of(ref.stages[0]), copy_of(ref.stages[2])};
      for (auto& p : mine[0]->parameters()) p.set_requires_grad(false);
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), kNone, 1);
      chain.add_link(mine[1], 1, kNone);
    } else {
      mine = {copy_of(ref.stages[1])};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), 0, 0);
    }
    at::Tensor y = chain.forward(rank == 0 ? ref.x : at::Tensor());
    auto start = std::chrono::steady_clock::now();
    if (rank == 0) {
      y.mul(ref.upstream).sum().backward();
      EXPECT_FALSE(mine[0]->weight.grad().defined());
      expect_same_gradients(mine[1], ref.stages[2], "stage 2");
    } else {
      ASSERT_TRUE(y.requires_grad());
      y.backward();
      expect_same_gradients(mine[0], ref.stages[1], "stage 1");
    }
    auto took = std::chrono::steady_clock::now() - start;
    EXPECT_LT(took, std::chrono::seconds(2))
        << "rank " << rank << ": backward took "
        << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
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

// ChainerMN's NonConnectedGraph2 over two ranks:
//   rank 0: link 0 = sub_a (rank_in 1, rank_out none: the model output); link 1 = sub_b (rank_in
//           none, rank_out 1), after the output link.
//   rank 1: link 0 = sub_c (rank_in none, rank_out 0); link 1 = sub_d (rank_in 0, rank_out none).
// In one process: out0 = sub_a(sub_c(x)), out1 = sub_d(sub_b(x)). Each rank's forward must
// return its own output (rank 0's is not the last link's), and backward of loss0 on rank 0 and
// loss1 on rank 1 must give the one-process gradients of loss0 + loss1.
TEST(MultiNodeChainListTest, NonConnectedGraph2ReturnsTheMiddleLinksOutput) {
  torch::nn::Linear sub_a = make_linear(6, 3, 0.9), sub_b = make_linear(4, 5, 1.7);
  torch::nn::Linear sub_c = make_linear(4, 6, 0.55), sub_d = make_linear(5, 2, 1.1);
  const at::Tensor x_value = at::arange(5 * 4, at::kDouble).mul(0.37).sin().reshape({5, 4});
  const at::Tensor up0 = at::arange(5 * 3, at::kDouble).mul(0.61).cos().add(0.5).reshape({5, 3});
  const at::Tensor up1 = at::arange(5 * 2, at::kDouble).mul(0.29).sin().sub(0.4).reshape({5, 2});
  at::Tensor x = x_value.clone().set_requires_grad(true);
  const at::Tensor out0 = sub_a->forward(at::tanh(sub_c->forward(x)));
  const at::Tensor out1 = sub_d->forward(at::tanh(sub_b->forward(x)));
  out0.mul(up0).sum().add(out1.mul(up1).sum()).backward();

  std::vector<at::Tensor> x_grads(2);
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    std::vector<torch::nn::Linear> mine;
    if (rank == 0) {
      mine = {copy_of(sub_a), copy_of(sub_b)};
      chain.add_link(mine[0], 1, kNone);
      chain.add_link(mine[1].ptr(), tanh_of(mine[1]), kNone, 1);
    } else {
      mine = {copy_of(sub_c), copy_of(sub_d)};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), kNone, 0);
      chain.add_link(mine[1], 0, kNone);
    }
    EXPECT_TRUE(chain.has_output());
    chain.check_layout();  // collective; NonConnectedGraph2's transfers meet
    at::Tensor xr = x_value.clone().set_requires_grad(true);
    at::Tensor y = chain.forward(xr);
    const at::Tensor& want = rank == 0 ? out0 : out1;
    ASSERT_EQ(y.sizes(), want.sizes()) << "rank " << rank << " returned " << y.sizes();
    EXPECT_TRUE(at::allclose(y, want.detach())) << "rank " << rank << " output";
    y.mul(rank == 0 ? up0 : up1).sum().backward();
    expect_same_gradients(mine[0], rank == 0 ? sub_a : sub_c, "rank " + std::to_string(rank) + " link 0");
    expect_same_gradients(mine[1], rank == 0 ? sub_b : sub_d, "rank " + std::to_string(rank) + " link 1");
    x_grads[rank] = xr.grad();
  });
  ASSERT_EQ(failures, "");
  // x feeds sub_b on rank 0 and sub_c on rank 1: the one-process gradient is the sum.
  ASSERT_TRUE(x_grads[0].defined() && x_grads[1].defined());
  EXPECT_TRUE(at::allclose(x_grads[0] + x_grads[1], x.grad()));
}

// The output link between sends on both sides, over three ranks: rank 0 sends h to rank 1
// (link 0), takes rank 1's answer as its output (link 1), then sends g(x) to rank 2 (link 2),
// whose link returns rank 2's output. Backward must run rank 0's transfers in reverse: link 2's
// gradient from rank 2, then link 1's gradient to rank 1, then link 0's from rank 1.
TEST(MultiNodeChainListTest, OutputLinkBetweenSendsRunsBackwardInReverse) {
  Reference ref = make_reference();
  torch::nn::Linear g = make_linear(4, 5, 0.8), tail = make_linear(5, 2, 1.9);
  const at::Tensor up2 = at::arange(5 * 2, at::kDouble).mul(0.43).cos().reshape({5, 2});
  at::Tensor x = ref.x.clone().set_requires_grad(true);
  const at::Tensor out0 =
      ref.stages[2]->forward(at::tanh(ref.stages[1]->forward(at::tanh(ref.stages[0]->forward(x)))));
  const at::Tensor out2 = tail->forward(at::tanh(g->forward(x)));
  out0.mul(ref.upstream).sum().add(out2.mul(up2).sum()).backward();

  std::vector<at::Tensor> x_grads(3);
  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    std::vector<torch::nn::Linear> mine;
    if (rank == 0) {
      mine = {copy_of(ref.stages[0]), copy_of(ref.stages[2]), copy_of(g)};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), kNone, 1);
      chain.add_link(mine[1], 1, kNone);
      chain.add_link(mine[2].ptr(), tanh_of(mine[2]), kNone, 2);
    } else if (rank == 1) {
      mine = {copy_of(ref.stages[1])};
      chain.add_link(mine[0].ptr(), tanh_of(mine[0]), 0, 0);
    } else {
      mine = {copy_of(tail)};
      chain.add_link(mine[0], 0, kNone);
    }
    at::Tensor xr = ref.x.clone().set_requires_grad(true);
    at::Tensor y = chain.forward(rank == 1 ? at::Tensor() : xr);
    if (rank == 1) {
      EXPECT_FALSE(chain.has_output());
      EXPECT_EQ(y.dim(), 0);
      y.backward();
      expect_same_gradients(mine[0], ref.stages[1], "rank 1");
      return;
    }
    const at::Tensor& want = rank == 0 ? out0 : out2;
    ASSERT_EQ(y.sizes(), want.sizes()) << "rank " << rank;
    EXPECT_TRUE(at::allclose(y, want.detach())) << "rank " << rank << " output";
    y.mul(rank == 0 ? ref.upstream : up2).sum().backward();
    if (rank == 0) {
      expect_same_gradients(mine[0], ref.stages[0], "rank 0 link 0");
      expect_same_gradients(mine[1], ref.stages[2], "rank 0 link 1");
      expect_same_gradients(mine[2], g, "rank 0 link 2");
    } else {
      expect_same_gradients(mine[0], tail, "rank 2");
    }
    x_grads[rank] = xr.grad();
  });
  ASSERT_EQ(failures, "");
  ASSERT_TRUE(x_grads[0].defined());
  EXPECT_TRUE(at::allclose(x_grads[0], x.grad()));
}

// What forward could not run is refused by add_link, naming the link.
TEST(MultiNodeChainListTest, RefusesASecondOutputAndAModuleWithSeveralInputs) {
  std::string failures = run_autograd_ranks(3, [&](int rank, comm::Communicator& comm) {
    if (rank != 0) return;
    MultiNodeChainList chain(comm);
    torch::nn::Linear a(2, 2), b(2, 2), c(4, 2);
    chain.add_link(a, 1, kNone);
    try {
      chain.add_link(b, 2, kNone);
      ADD_FAILURE() << "a second rank_out none link was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("link 1 (rank 0) has rank_out none, but link 0 already gives"),
                std::string::npos)
          << e.what();
    }
    try {
      chain.add_link(c, {1, 2}, 1);
      ADD_FAILURE() << "a module link with two rank_in was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("link 1 (rank 0) is a module taking one tensor"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(chain.num_links(), 1u);
    EXPECT_EQ(chain.parameters().size(), 2u);  // the refused links registered nothing
  });
  EXPECT_EQ(failures, "");
}

// Layouts whose transfers cannot meet are refused by check_layout on every rank, before a
// forward would wait for its timeout.
TEST(MultiNodeChainListTest, CheckLayoutRefusesTransfersThatCannotMeet) {
  auto refusal = [](int size, const std::function<void(int, MultiNodeChainList&)>& build) {
    std::vector<std::string> messages(size);
    std::string failures = run_autograd_ranks(size, [&](int rank, comm::Communicator& comm) {
      MultiNodeChainList chain(comm);
      build(rank, chain);
      try {
        chain.check_layout();
      } catch (const std::invalid_argument& e) {
        messages[rank] = e.what();
      }
    });
    EXPECT_EQ(failures, "");
    for (int rank = 1; rank < size; ++rank) EXPECT_EQ(messages[rank], messages[0]) << "rank " << rank;
    return messages[0];
  };
  // Both ranks send first, then receive: each send waits for a receive the peer has not reached.
  std::string both_send = refusal(2, [](int rank, MultiNodeChainList& chain) {
    chain.add_link(torch::nn::Linear(2, 2), kNone, 1 - rank);
    chain.add_link(torch::nn::Linear(2, 2), 1 - rank, kNone);
  });
  EXPECT_NE(both_send.find("rank 0 waits at link 0 to send to rank 1, which waits at link 0 to send to rank 0"),
            std::string::npos)
      << both_send;
  // Rank 0 sends twice to rank 1, which receives once.
  std::string unmatched = refusal(2, [](int rank, MultiNodeChainList& chain) {
    if (rank == 0) {
      chain.add_link(torch::nn::Linear(2, 2), kNone, {1, 1});
    } else {
      chain.add_link(torch::nn::Linear(2, 2), 0, kNone);
    }
  });
  EXPECT_NE(unmatched.find("rank 0 waits at link 0 to send to rank 1, which has no further link that receives"),
            std::string::npos)
      << unmatched;
  // The working three-stage pipeline passes (and a rank with no links takes part).
  EXPECT_EQ(refusal(4,
                    [](int rank, MultiNodeChainList& chain) {
                      if (rank == 3) return;
                      chain.add_link(torch::nn::Linear(2, 2), rank == 0 ? kNone : LinkRanks(rank - 1),
                                     rank == 2 ? kNone : LinkRanks(rank + 1));
                    }),
            "");
}


// A 3-stage pipeline where rank 2's layout disagrees with its peers': it receives from rank 0
// while rank 1 sends to it.
void build_disagreeing_pipeline(int rank, MultiNodeChainList& chain) {
  if (rank == 0) chain.add_link(torch::nn::Linear(2, 2), kNone, 1);
  if (rank == 1) chain.add_link(torch::nn::Linear(2, 2), 0, 2);
  if (rank == 2) chain.add_link(torch::nn::Linear(2, 2), 0, kNone);  // should be rank_in 1
}

// Nobody calls check_layout: forward itself refuses the layout on every rank, with the same
// message naming each stuck rank and link, long before the communicator's timeout.
TEST(MultiNodeChainListTest, ForwardRefusesALayoutThatCannotRunBeforeAnyTransfer) {
  constexpr auto kOpTimeout = std::chrono::seconds(60);
  std::vector<std::string> messages(3);
  std::vector<double> seconds(3, 0.0);
  std::string failures = run_autograd_ranks(
      3,
      [&](int rank, comm::Communicator& comm) {
        MultiNodeChainList chain(comm);
        build_disagreeing_pipeline(rank, chain);
        EXPECT_FALSE(chain.layout_checked());
        const auto start = std::chrono::steady_clock::now();
        try {
          chain.forward(rank == 0 ? at::ones({3, 2}) : at::Tensor());
          ADD_FAILURE() << "rank " << rank << ": forward ran a layout that cannot run";
        } catch (const std::invalid_argument& e) {
          messages[rank] = e.what();
        }
        seconds[rank] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        EXPECT_FALSE(chain.layout_checked());
      },
      kOpTimeout);
  ASSERT_EQ(failures, "");
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(messages[rank], messages[0]) << "rank " << rank;
    // Refused as soon as the ranks met, not after waiting out a transfer's 60 s.
    EXPECT_LT(seconds[rank], 20.0) << "rank " << rank;
  }
  EXPECT_NE(messages[0].find("rank 1 waits at link 0 to send to rank 2, which waits at link 0 to receive from rank 0"),
            std::string::npos)
      << messages[0];
  EXPECT_NE(messages[0].find("rank 2 waits at link 0 to receive from rank 0, which has no further link that sends "
                             "to rank 2"),
            std::string::npos)
      << messages[0];
}

// The opt-out: the same layout is left to the transfers, which fail only by timing out (what
// the check spares users), as runtime_error rather than the layout refusal.
TEST(MultiNodeChainListTest, WithoutTheCheckTheSameLayoutTimesOut) {
  MultiNodeChainListOptions options;
  options.check_layout_before_first_forward = false;
  std::vector<std::string> errors(3);
  std::string failures = run_autograd_ranks(
      3,
      [&](int rank, comm::Communicator& comm) {
        MultiNodeChainList chain(comm, at::kCPU, options);
        build_disagreeing_pipeline(rank, chain);
        try {
          chain.forward(rank == 0 ? at::ones({3, 2}) : at::Tensor());
        } catch (const std::invalid_argument& e) {
          ADD_FAILURE() << "rank " << rank << ": the layout check ran although turned off: " << e.what();
        } catch (const std::runtime_error& e) {
          errors[rank] = e.what();
        }
      },
      std::chrono::seconds(2));
  ASSERT_EQ(failures, "");
  EXPECT_EQ(errors[0], "");  // its one send met rank 1's receive
  for (int rank : {1, 2}) EXPECT_NE(errors[rank].find("timed out"), std::string::npos) << errors[rank];
}

// check_layout called early is not repeated by forward; a new link makes forward check again;
// a rank that never reaches the check makes the others' forward fail naming what to do.
TEST(MultiNodeChainListTest, ForwardChecksOncePerLayoutAndNamesARankThatNeverCame) {
  std::string failures = run_autograd_ranks(2, [&](int rank, comm::Communicator& comm) {
    MultiNodeChainList chain(comm);
    chain.add_link(torch::nn::Linear(2, 2), rank == 0 ? kNone : LinkRanks(0), rank == 0 ? LinkRanks(1) : kNone);
    chain.check_layout();
    EXPECT_TRUE(chain.layout_checked());
    at::Tensor y = chain.forward(rank == 0 ? at::ones({3, 2}) : at::Tensor());
    if (rank == 1) {
      EXPECT_EQ(y.sizes(), (std::vector<int64_t>{3, 2}));
    }
    // Only rank 1 adds a link: its forward would check again, rank 0's not, so only rank 1 runs
    // the check's collective, and it fails after the timeout saying every rank must call forward.
    if (rank == 0) {
      EXPECT_TRUE(chain.layout_checked());
      return;
    }
    chain.add_link(torch::nn::Linear(2, 2), kNone, 0);
    EXPECT_FALSE(chain.layout_checked());
    try {
      chain.forward();
      ADD_FAILURE() << "rank 1's forward ran without its peer's layout";
    } catch (const std::invalid_argument& e) {
      ADD_FAILURE() << e.what();
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("MultiNodeChainList::check_layout (rank 1 of 2, 2 links): gathering "
                                           "the ranks' links; every rank of the communicator calls "
                                           "check_layout or forward"),
                std::string::npos)
          << e.what();
      // The collective's own timeout names the peer it waited for (with two ranks, the one that
      // never came); in larger groups it names a neighbour in the algorithm, not necessarily it.
      EXPECT_NE(std::string(e.what()).find("timed out after 3.0 s waiting to"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 0"), std::string::npos) << e.what();
    }
  }, std::chrono::seconds(3));
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace cohort::train
