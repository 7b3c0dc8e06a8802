#include "worker/train/multi_node_optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::train {
namespace {

constexpr int64_t kIn = 8, kHidden = 16, kOut = 4;

// A 2-layer MLP as plain leaf tensors: W1, b1, W2, b2 (forward order).
std::vector<at::Tensor> make_mlp(uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> params = {at::randn({kHidden, kIn}, gen) * 0.3, at::randn({kHidden}, gen) * 0.1,
                                    at::randn({kOut, kHidden}, gen) * 0.3, at::randn({kOut}, gen) * 0.1};
  for (auto& p : params) p.requires_grad_(true);
  return params;
}

std::vector<at::Tensor> clone_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

at::Tensor mlp_loss(const std::vector<at::Tensor>& p, const at::Tensor& x, const at::Tensor& y) {
  at::Tensor h = at::tanh(at::linear(x, p[0], p[1]));
  return (at::linear(h, p[2], p[3]) - y).pow(2).mean();
}

struct Data {
  at::Tensor x, y;  // [steps, global batch, ...]
};

Data make_data(int steps, int64_t global_batch) {
  at::Generator gen = at::detail::createCPUGenerator(1234);
  return Data{at::randn({steps, global_batch, kIn}, gen), at::randn({steps, global_batch, kOut}, gen)};
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.1).momentum(0.9); }

// One process, global batch.
std::vector<at::Tensor> train_reference(const std::vector<at::Tensor>& init, const Data& data, int steps) {
  auto params = clone_params(init);
  torch::optim::SGD sgd(params, sgd_options());
  for (int k = 0; k < steps; ++k) {
    sgd.zero_grad();
    mlp_loss(params, data.x[k], data.y[k]).backward();
    sgd.step();
  }
  return params;
}

// One process, global batch, double buffered: step t computes g_t at the current parameters and
// applies g_{t-1} (step 0 applies nothing).
std::vector<at::Tensor> train_reference_double_buffered(const std::vector<at::Tensor>& init, const Data& data,
                                                        int steps) {
  auto params = clone_params(init);
  torch::optim::SGD sgd(params, sgd_options());
  std::vector<at::Tensor> previous;
  for (int k = 0; k < steps; ++k) {
    sgd.zero_grad();
    mlp_loss(params, data.x[k], data.y[k]).backward();
    std::vector<at::Tensor> current;
    for (auto& p : params) current.push_back(p.grad().detach().clone());
    if (!previous.empty()) {
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = previous[i];
      sgd.step();
    }
    previous = current;
  }
  return params;
}

std::unique_ptr<comm::Communicator> make_comm(const std::string& kind,
                                              std::shared_ptr<comm::CommWorld> world) {
  comm::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(20);
  return comm::create_communicator(kind, std::move(world), options).value();
}

// kind, ranks, overlap, small buckets
using EquivalenceParam = std::tuple<std::string, int, bool, bool>;

// k steps of n-rank data-parallel SGD with per-rank batch b equal one process with batch n·b.
class EquivalenceTest : public ::testing::TestWithParam<EquivalenceParam> {};

constexpr int kSteps = 4;
constexpr int64_t kBatch = 3;

struct ParallelRun {
  std::vector<at::Tensor> init;                      // rank 0's (and the reference's) start
  std::vector<at::Tensor> expected;                  // one process, global batch
  std::vector<std::vector<at::Tensor>> rank_params;  // each rank's parameters after training
  std::vector<size_t> buckets;                       // rank 0's bucket sizes
};

// kSteps of `size`-rank data-parallel SGD with per-rank batch kBatch, and the one-process
// reference with batch size·kBatch; failures go to the test.
// The simulated nodes of `size` ranks for communicator `kind`: two nodes where the kind allows
// (so hierarchical runs its inter-node step), one for single_node, equal nodes for
// two_dimensional.
std::function<std::string(int)> node_layout(const std::string& kind, int size) {
  if (kind == "single_node") return comm::testing::nodes_of(size);
  if (kind == "two_dimensional" && size % 2 != 0) return comm::testing::nodes_of(1);
  return comm::testing::nodes_of(size == 2 ? 1 : 2);
}

ParallelRun train_data_parallel(const std::string& kind, int size, const MultiNodeOptimizerOptions& options) {
  at::set_num_threads(1);
  ParallelRun run;
  Data data = make_data(kSteps, kBatch * size);
  run.init = make_mlp(7);
  run.expected = options.double_buffering ? train_reference_double_buffered(run.init, data, kSteps)
                                          : train_reference(run.init, data, kSteps);
  // Every rank starts from its own initialization: rank 0's must win through broadcast_parameters.
  for (int r = 0; r < size; ++r)
    run.rank_params.push_back(r == 0 ? clone_params(run.init) : make_mlp(100 + r));

  auto worlds = comm::testing::loopback_worlds(size, node_layout(kind, size));
  auto statuses = comm::testing::run_ranks(size, [&](int rank) -> Status {
    try {
      auto comm = make_comm(kind, worlds[rank]);
      auto& params = run.rank_params[rank];
      torch::optim::SGD sgd(params, sgd_options());
      auto optimizer = create_multi_node_optimizer(sgd, *comm, options);
      if (rank == 0) run.buckets = optimizer->bucket_sizes();
      optimizer->broadcast_parameters();
      for (int k = 0; k < kSteps; ++k) {
        optimizer->zero_grad();
        at::Tensor x = data.x[k].slice(0, rank * kBatch, (rank + 1) * kBatch);
        at::Tensor y = data.y[k].slice(0, rank * kBatch, (rank + 1) * kBatch);
        mlp_loss(params, x, y).backward();
        // With overlap every bucket is complete after backward, so all have been launched.
        size_t launched = optimizer->launched_buckets();
        if (launched != (options.overlap ? optimizer->bucket_sizes().size() : 0)) {
          return internal_error("rank {} step {}: {} buckets launched before step()", rank, k, launched);
        }
        optimizer->step();
      }
      if (optimizer->communication_wait_seconds() < 0) return internal_error("negative wait time");
    } catch (const std::exception& e) {
      return internal_error("rank {} threw: {}", rank, e.what());
    }
    return ok_status();
  });
  EXPECT_EQ(comm::testing::failures(statuses), "");
  // The model moved: comparisons against `expected` are not vacuous.
  EXPECT_GT((run.expected[0] - run.init[0]).abs().max().item<double>(), 1e-3);
  return run;
}

void expect_close(const ParallelRun& run, double tolerance) {
  for (size_t r = 0; r < run.rank_params.size(); ++r) {
    for (size_t i = 0; i < run.expected.size(); ++i) {
      double diff = (run.rank_params[r][i] - run.expected[i]).abs().max().item<double>();
      EXPECT_LE(diff, tolerance) << "rank " << r << " parameter " << i;
    }
  }
}

TEST_P(EquivalenceTest, MatchesSingleProcessWithGlobalBatch) {
  auto [kind, size, overlap, small_buckets] = GetParam();
  MultiNodeOptimizerOptions options;
  options.overlap = overlap;
  if (small_buckets) {
    options.first_bucket_bytes = 16;
    options.bucket_bytes = 300;
  }
  ParallelRun run = train_data_parallel(kind, size, options);
  if (small_buckets) {
    // Reverse order: b2 (4 floats, 16 bytes) fills the first bucket; W2 (64) + b1 (16) reach 300
    // bytes and close the second; W1 (128) is the third.
    EXPECT_EQ(run.buckets, (std::vector<size_t>{4, 80, 128}));
  } else {
    EXPECT_EQ(run.buckets, (std::vector<size_t>{4 + 64 + 16 + 128}));
  }
  expect_close(run, 1e-5);
}

// Compressed gradients: close to the reference at the compressed type's precision, and
// every rank still holds the same parameters.
TEST(MultiNodeOptimizerTest, CompressedGradientsStayClose) {
  for (at::ScalarType type : {at::kHalf, at::kBFloat16}) {
    MultiNodeOptimizerOptions options;
    options.grad_dtype = type;
    options.first_bucket_bytes = 16;
    ParallelRun run = train_data_parallel("flat", 2, options);
    expect_close(run, 2e-2);
    // Rounding shows: the gradients really travelled in the compressed type.
    double max_diff = 0;
    for (size_t i = 0; i < run.expected.size(); ++i) {
      max_diff = std::max(max_diff, (run.rank_params[0][i] - run.expected[i]).abs().max().item<double>());
    }
    EXPECT_GT(max_diff, 1e-7) << c10::toString(type);
    for (size_t i = 0; i < run.expected.size(); ++i) {
      EXPECT_TRUE(run.rank_params[0][i].equal(run.rank_params[1][i]))
          << c10::toString(type) << " parameter " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, EquivalenceTest,
                         ::testing::Combine(::testing::Values("naive", "flat", "hierarchical",
                                                              "two_dimensional", "single_node"),
                                            ::testing::Values(2, 4), ::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<EquivalenceParam>& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) +
                                  "ranks" + (std::get<2>(info.param) ? "_overlap" : "_after_backward") +
                                  (std::get<3>(info.param) ? "_small_buckets" : "_one_bucket");
                         });

// kind, ranks, overlap
using DoubleBufferingParam = std::tuple<std::string, int, bool>;

// With double buffering, k steps of n-rank SGD equal one process with the global batch that
// applies g_{t-1} at step t, whatever the communicator kind.
class DoubleBufferingTest : public ::testing::TestWithParam<DoubleBufferingParam> {};

TEST_P(DoubleBufferingTest, AppliesThePreviousStepsAverage) {
  auto [kind, size, overlap] = GetParam();
  MultiNodeOptimizerOptions options;
  options.double_buffering = true;
  options.overlap = overlap;
  options.first_bucket_bytes = 16;  // three buckets: their order across the two sets matters
  options.bucket_bytes = 300;
  ParallelRun run = train_data_parallel(kind, size, options);
  EXPECT_EQ(run.buckets, (std::vector<size_t>{4, 80, 128}));
  expect_close(run, 1e-5);
  // Not the synchronous result: the stale gradient really was applied.
  Data data = make_data(kSteps, kBatch * size);
  std::vector<at::Tensor> plain = train_reference(run.init, data, kSteps);
  EXPECT_GT((plain[0] - run.expected[0]).abs().max().item<double>(), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Kinds, DoubleBufferingTest,
                         ::testing::Combine(::testing::Values("naive", "flat", "hierarchical",
                                                              "two_dimensional", "single_node"),
                                            ::testing::Values(2, 3), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<DoubleBufferingParam>& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) +
                                  "ranks" + (std::get<2>(info.param) ? "_overlap" : "_after_backward");
                         });

// Double buffering with compressed gradients: close to the double-buffered reference at the
// compressed type's precision; ranks agree bit for bit.
TEST(MultiNodeOptimizerTest, DoubleBufferingWithCompressedGradients) {
  MultiNodeOptimizerOptions options;
  options.double_buffering = true;
  options.grad_dtype = at::kBFloat16;
  options.first_bucket_bytes = 16;
  ParallelRun run = train_data_parallel("flat", 3, options);
  expect_close(run, 2e-2);
  for (int r = 1; r < 3; ++r) {
    for (size_t i = 0; i < run.expected.size(); ++i)
      EXPECT_TRUE(run.rank_params[0][i].equal(run.rank_params[r][i])) << "rank " << r << " parameter " << i;
  }
}

// zero_fill under double buffering follows the step that produced the applied gradient. Step 0:
// p1 used on both ranks, p0 on rank 0 only; nothing is applied. Step 1: only rank 1 uses p0, and
// what is applied is step 0's average: p1 ← 1 - 2 on both ranks; p0 ← 2 - 4/2 on rank 0, and on
// rank 1 too with zero_fill — without it rank 1 had no gradient of p0 at step 0, so its p0 stays
// (its local step-1 gradient must not be applied either).
TEST(MultiNodeOptimizerTest, DoubleBufferingZeroFillFollowsTheAppliedStep) {
  for (bool zero_fill : {true, false}) {
    for (bool overlap : {true, false}) {
      auto worlds = comm::testing::loopback_worlds(2);
      std::vector<at::Tensor> after_first(2), results(2);
      auto statuses = comm::testing::run_ranks(2, [&](int rank) -> Status {
        try {
          auto comm = make_comm("flat", worlds[rank]);
          std::vector<at::Tensor> params = {at::full({3}, 2.0).requires_grad_(true),
                                            at::full({2}, 1.0).requires_grad_(true)};
          torch::optim::SGD sgd(params, torch::optim::SGDOptions(1.0));
          MultiNodeOptimizerOptions options;
          options.overlap = overlap;
          options.zero_fill = zero_fill;
          options.double_buffering = true;
          auto optimizer = create_multi_node_optimizer(sgd, *comm, options);
          optimizer->zero_grad();
          at::Tensor loss = params[1].pow(2).sum();
          if (rank == 0) loss = loss + params[0].pow(2).sum();
          loss.backward();
          optimizer->step();
          after_first[rank] = at::cat({params[0].detach(), params[1].detach()}).clone();
          optimizer->zero_grad();
          if (rank == 1) params[0].pow(2).sum().backward();
          optimizer->step();
          results[rank] = at::cat({params[0].detach(), params[1].detach()});
        } catch (const std::exception& e) {
          return internal_error("rank {} threw: {}", rank, e.what());
        }
        return ok_status();
      });
      ASSERT_EQ(comm::testing::failures(statuses), "");
      std::string what = fmt::format("zero_fill {} overlap {}", zero_fill, overlap);
      at::Tensor start = at::tensor({2.0f, 2.0f, 2.0f, 1.0f, 1.0f});
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(after_first[r].equal(start)) << "step 0 moved rank " << r << " " << what;
      at::Tensor applied = at::tensor({0.0f, 0.0f, 0.0f, -1.0f, -1.0f});
      EXPECT_TRUE(results[0].allclose(applied)) << what << ": " << results[0];
      at::Tensor expected_rank1 = zero_fill ? applied : at::tensor({2.0f, 2.0f, 2.0f, -1.0f, -1.0f});
      EXPECT_TRUE(results[1].allclose(expected_rank1)) << what << ": " << results[1];
    }
  }
}

// A parameter used on rank 0 only: rank 1 contributes zeros and still gets the average.
TEST(MultiNodeOptimizerTest, UnusedParameterIsZeroFilled) {
  for (bool overlap : {true, false}) {
    auto worlds = comm::testing::loopback_worlds(2);
    std::vector<at::Tensor> results(2);
    auto statuses = comm::testing::run_ranks(2, [&](int rank) -> Status {
      try {
        auto comm = make_comm("flat", worlds[rank]);
        std::vector<at::Tensor> params = {at::full({3}, 2.0).requires_grad_(true),
                                          at::full({2}, 1.0).requires_grad_(true)};
        torch::optim::SGD sgd(params, torch::optim::SGDOptions(1.0));
        MultiNodeOptimizerOptions options;
        options.overlap = overlap;
        auto optimizer = create_multi_node_optimizer(sgd, *comm, options);
        // params[1] gets gradient 2·p = 2 on both ranks; params[0] gets 2·p = 4 on rank 0 only.
        at::Tensor loss = params[1].pow(2).sum();
        if (rank == 0) loss = loss + params[0].pow(2).sum();
        loss.backward();
        optimizer->step();
        results[rank] = at::cat({params[0].detach(), params[1].detach()});
      } catch (const std::exception& e) {
        return internal_error("rank {} threw: {}", rank, e.what());
      }
      return ok_status();
    });
    ASSERT_EQ(comm::testing::failures(statuses), "");
    // p0: 2 - 4/2 = 0 on both ranks; p1: 1 - 2 = -1.
    at::Tensor expected = at::tensor({0.0f, 0.0f, 0.0f, -1.0f, -1.0f});
    for (int r = 0; r < 2; ++r)
      EXPECT_TRUE(results[r].allclose(expected)) << "rank " << r << " overlap " << overlap;
  }
}

// f16 gradients of 20000 on 4 ranks average to 20000. The bucket used to be allreduced with AVG,
// which sums first: the sum, 80000, is past f16's 65504 and came back inf.
TEST(MultiNodeOptimizerTest, HalfGradientsWhoseSumOverflowsAverageExactly) {
  constexpr int kSize = 4;
  for (bool overlap : {true, false}) {
    auto worlds = comm::testing::loopback_worlds(kSize);
    std::vector<at::Tensor> grads(kSize);
    auto statuses = comm::testing::run_ranks(kSize, [&](int rank) -> Status {
      try {
        auto comm = make_comm("flat", worlds[rank]);
        std::vector<at::Tensor> params = {at::ones({5}).requires_grad_(true)};
        torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.0));
        MultiNodeOptimizerOptions options;
        options.overlap = overlap;
        options.grad_dtype = at::kHalf;
        auto optimizer = create_multi_node_optimizer(sgd, *comm, options);
        params[0].mul(20000.0).sum().backward();
        optimizer->step();
        grads[rank] = params[0].grad().clone();
      } catch (const std::exception& e) {
        return internal_error("rank {} threw: {}", rank, e.what());
      }
      return ok_status();
    });
    ASSERT_EQ(comm::testing::failures(statuses), "");
    for (int r = 0; r < kSize; ++r) {
      EXPECT_TRUE(grads[r].equal(at::full({5}, 20000.0f)))
          << "rank " << r << " overlap " << overlap << ": " << grads[r];
    }
  }
}

// step() broadcasts rank 0's parameters on the first step (lr 0: nothing else changes them).
TEST(MultiNodeOptimizerTest, FirstStepBroadcastsRankZerosParameters) {
  constexpr int kSize = 3;
  auto worlds = comm::testing::loopback_worlds(kSize);
  std::vector<std::vector<at::Tensor>> params;
  for (int r = 0; r < kSize; ++r) params.push_back(make_mlp(50 + r));
  std::vector<at::Tensor> rank0 = clone_params(params[0]);
  auto statuses = comm::testing::run_ranks(kSize, [&](int rank) -> Status {
    try {
      auto comm = make_comm("flat", worlds[rank]);
      torch::optim::SGD sgd(params[rank], torch::optim::SGDOptions(0.0));
      auto optimizer = create_multi_node_optimizer(sgd, *comm);
      mlp_loss(params[rank], at::ones({2, kIn}), at::zeros({2, kOut})).backward();
      optimizer->step();
    } catch (const std::exception& e) {
      return internal_error("rank {} threw: {}", rank, e.what());
    }
    return ok_status();
  });
  ASSERT_EQ(comm::testing::failures(statuses), "");
  for (int r = 0; r < kSize; ++r) {
    for (size_t i = 0; i < rank0.size(); ++i)
      EXPECT_TRUE(params[r][i].equal(rank0[i])) << "rank " << r << " " << i;
  }
}

// DDP's bucket rule: a bucket closes once it reaches its limit, so a parameter larger than the
// limit leaves with the ones before it instead of opening a bucket that waits for the rest of
// backward.
TEST(MultiNodeOptimizerTest, BucketClosesOnceItReachesItsLimit) {
  auto worlds = comm::testing::loopback_worlds(1);
  auto comm = make_comm("flat", worlds[0]);
  std::vector<at::Tensor> params = make_mlp(3);  // W1 128, b1 16, W2 64, b2 4 floats
  torch::optim::SGD sgd(params, sgd_options());
  MultiNodeOptimizerOptions options;
  options.first_bucket_bytes = 64;  // b2 (16 bytes) + W2 (256): over 64, closed
  options.bucket_bytes = 600;       // b1 (64) + W1 (512): 576, under 600, the last one
  EXPECT_EQ(create_multi_node_optimizer(sgd, *comm, options)->bucket_sizes(), (std::vector<size_t>{68, 144}));
}

// Two backward passes per step with overlap: a clear error, and the next step still works.
TEST(MultiNodeOptimizerTest, TwoBackwardsPerStepWithOverlapIsAnError) {
  auto worlds = comm::testing::loopback_worlds(1);
  auto comm = make_comm("flat", worlds[0]);
  std::vector<at::Tensor> params = {at::ones({2}).requires_grad_(true)};
  torch::optim::SGD sgd(params, torch::optim::SGDOptions(0.5));
  auto optimizer = create_multi_node_optimizer(sgd, *comm);
  params[0].sum().backward();
  params[0].sum().backward();
  try {
    optimizer->step();
    FAIL() << "expected an error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("fired twice"), std::string::npos) << e.what();
  }
  optimizer->zero_grad();
  params[0].sum().backward();
  optimizer->step();
  EXPECT_TRUE(params[0].allclose(at::full({2}, 0.5)));
}

}  // namespace
}  // namespace cohort::train
