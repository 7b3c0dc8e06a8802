#include "worker/train/multi_node_evaluator.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <vector>

#include <gtest/gtest.h>
#include <torch/nn/modules/batchnorm.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/train/allreduce_persistent.h"

namespace cohort::train {
namespace {

// Runs `fn(rank, comm)` on `size` loopback ranks with flat communicators.
template <typename Fn>
std::string run_on_ranks(int size, Fn fn) {
  auto worlds = comm::testing::loopback_worlds(size);
  comm::CommunicatorOptions options;
  options.timeout = std::chrono::seconds(10);
  return comm::testing::failures(comm::testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank], options));
    return fn(rank, *comm);
  }));
}

// Rank r has r+1 samples with accuracy 1/(r+1) (one correct each) and loss r: the global accuracy
// is size / Σ(r+1), the global loss Σ r(r+1) / Σ(r+1) — weighted, not the mean of the ranks' values.
TEST(MultiNodeEvaluatorTest, WeightsBySampleCount) {
  for (int size = 1; size <= 4; ++size) {
    double total = 0, loss_sum = 0;
    for (int r = 0; r < size; ++r) {
      total += r + 1;
      loss_sum += r * (r + 1.0);
    }
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      auto evaluator = create_multi_node_evaluator(
          [rank]() -> StatusOr<Metrics> {
            return Metrics{{"accuracy", {1.0 / (rank + 1), rank + 1}},
                           {"loss", {double(rank), rank + 1}},
                           {"empty", {5.0, 0}}};
          },
          comm);
      COHORT_ASSIGN_OR_RETURN(auto result, evaluator->evaluate());
      if (std::abs(result["accuracy"] - size / total) > 1e-12 ||
          std::abs(result["loss"] - loss_sum / total) > 1e-12 || result["empty"] != 0.0) {
        return internal_error("rank {}: accuracy {} loss {} empty {}", rank, result["accuracy"],
                              result["loss"], result["empty"]);
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

TEST(MultiNodeEvaluatorTest, DifferentNamesFailOnEveryRank) {
  std::string failures = run_on_ranks(3, [&](int rank, comm::Communicator& comm) -> Status {
    auto evaluator = create_multi_node_evaluator(
        [rank]() -> StatusOr<Metrics> {
          return Metrics{{rank == 1 ? "acc" : "accuracy", {1.0, 1}}};
        },
        comm);
    auto result = evaluator->evaluate();
    if (result.ok() || result.status().code() != StatusCode::kInvalidArgument) {
      return internal_error("rank {}: expected INVALID_ARGUMENT, got {}", rank, result.status().to_string());
    }
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

// Rank 0 reports one metric more than the others: every rank fails with INVALID_ARGUMENT naming
// the mismatch at once, not with a timeout of an allreduce whose counts differ between ranks (the
// names' check rode along in the data allreduce, whose length is the number of metrics).
TEST(MultiNodeEvaluatorTest, DifferentNumbersOfNamesFailOnEveryRankAtOnce) {
  std::string failures = run_on_ranks(3, [&](int rank, comm::Communicator& comm) -> Status {
    auto evaluator = create_multi_node_evaluator(
        [rank]() -> StatusOr<Metrics> {
          Metrics metrics{{"accuracy", {0.5, 4}}, {"loss", {1.0, 4}}};
          if (rank == 0) metrics["extra"] = {2.0, 4};
          return metrics;
        },
        comm);
    auto start = std::chrono::steady_clock::now();
    auto result = evaluator->evaluate();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (result.ok() || result.status().code() != StatusCode::kInvalidArgument ||
        result.status().message().find("between 2 and 3 names") == std::string::npos) {
      return internal_error("rank {}: expected INVALID_ARGUMENT naming 2 and 3 names, got {} after {} s",
                            rank, result.status().to_string(), seconds);
    }
    // The communicator's timeout is 10 s: an error after it would be the hang, not the check.
    if (seconds > 2.0) return internal_error("rank {}: INVALID_ARGUMENT only after {} s", rank, seconds);
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

// The same metrics as WeightsBySampleCount with ChainerMN's plain mean: Σ value / size, the
// counts ignored (accuracy mean_r 1/(r+1), loss (size-1)/2) — not the weighted values. A rank's
// zero count does not exclude its value either.
TEST(MultiNodeEvaluatorTest, PlainMeanOverRanks) {
  for (int size = 1; size <= 5; ++size) {
    double accuracy = 0;
    for (int r = 0; r < size; ++r) accuracy += 1.0 / (r + 1) / size;
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      MultiNodeEvaluatorOptions options;
      options.averaging = MultiNodeEvaluatorOptions::Averaging::kPlainMean;
      auto evaluator = create_multi_node_evaluator(
          [rank]() -> StatusOr<Metrics> {
            return Metrics{{"accuracy", {1.0 / (rank + 1), rank + 1}},
                           {"loss", {double(rank), rank + 1}},
                           {"empty", {5.0, 0}}};
          },
          comm, options);
      COHORT_ASSIGN_OR_RETURN(auto result, evaluator->evaluate());
      if (std::abs(result["accuracy"] - accuracy) > 1e-12 || std::abs(result["loss"] - (size - 1) / 2.0) > 1e-12 ||
          result["empty"] != 5.0) {
        return internal_error("rank {}: accuracy {} (want {}) loss {} empty {}", rank, result["accuracy"],
                              accuracy, result["loss"], result["empty"]);
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// An evaluator object (ChainerMN wraps the actual evaluator): evaluate() is called once per
// multi-node evaluate() on every rank, and both averagings apply to it.
class CountingEvaluator : public Evaluator {
 public:
  explicit CountingEvaluator(int rank) : rank_(rank) {}
  StatusOr<Metrics> evaluate() override {
    ++calls;
    return Metrics{{"loss", {double(rank_ * 2), rank_ == 0 ? 3 : 1}}};
  }
  int calls = 0;

 private:
  int rank_;
};

TEST(MultiNodeEvaluatorTest, WrapsAnEvaluatorObject) {
  for (int size = 2; size <= 4; ++size) {
    // loss 2r; rank 0 has 3 samples, the others 1: weighted Σ 2r / (size + 2), plain Σ 2r / size.
    double sum = size * (size - 1.0);
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      auto actual = std::make_shared<CountingEvaluator>(rank);
      auto weighted = create_multi_node_evaluator(actual, comm);
      MultiNodeEvaluatorOptions options;
      options.averaging = MultiNodeEvaluatorOptions::Averaging::kPlainMean;
      auto plain = create_multi_node_evaluator(actual, comm, options);
      COHORT_ASSIGN_OR_RETURN(auto w, weighted->evaluate());
      COHORT_ASSIGN_OR_RETURN(auto p, plain->evaluate());
      if (std::abs(w["loss"] - sum / (size + 2)) > 1e-12 || std::abs(p["loss"] - sum / size) > 1e-12) {
        return internal_error("rank {}: weighted {} plain {}", rank, w["loss"], p["loss"]);
      }
      if (actual->calls != 2) return internal_error("rank {}: evaluate() called {} times", rank, actual->calls);
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// Rank r observes loss r+i at iterations i = 0..3 with interval 2: reports at iterations 2 and 4
// of the mean over the interval, averaged over ranks.
TEST(ObservationAggregatorTest, AveragesOverRanksEachInterval) {
  for (int size = 1; size <= 4; ++size) {
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      ObservationAggregator aggregator(comm, 2);
      double rank_mean = (size - 1) / 2.0;
      for (int i = 0; i < 4; ++i) {
        aggregator.observe("loss", rank + i);
        COHORT_ASSIGN_OR_RETURN(auto report, aggregator.end_iteration());
        if (i % 2 == 0) {
          if (report.has_value()) return internal_error("rank {}: report at iteration {}", rank, i + 1);
          continue;
        }
        double expected = rank_mean + (i - 1) + 0.5;
        if (!report.has_value() || std::abs((*report)["loss"] - expected) > 1e-12) {
          return internal_error("rank {}: iteration {}: expected {}", rank, i + 1, expected);
        }
      }
      return ok_status();
    });
    EXPECT_EQ(failures, "") << "size " << size;
  }
}

// 49 ranks observing main/accuracy and main/loss get their averages. The names' hash used to ride
// along in an allreduce AVG and be compared with the rank's own: AVG is the sum times fl(1/49), and
// for this pair of names' hash (6802587) (49·h)·fl(1/49) != h, so every interval failed with a
// false "ranks reported different names" (also at 91, 93, 98, ... ranks; the smallest is 49).
TEST(ObservationAggregatorTest, AveragesOverFortyNineRanks) {
  constexpr int kSize = 49;
  double accuracy = 0, loss = 0;
  for (int r = 0; r < kSize; ++r) {
    accuracy += (r % 10) / 10.0 / kSize;
    loss += (r + 0.25) / kSize;
  }
  std::string failures = run_on_ranks(kSize, [&](int rank, comm::Communicator& comm) -> Status {
    ObservationAggregator aggregator(comm, 1);
    aggregator.observe("main/accuracy", (rank % 10) / 10.0);
    aggregator.observe("main/loss", rank + 0.25);
    COHORT_ASSIGN_OR_RETURN(auto report, aggregator.end_iteration());
    if (!report.has_value() || std::abs((*report)["main/accuracy"] - accuracy) > 1e-12 ||
        std::abs((*report)["main/loss"] - loss) > 1e-12) {
      return internal_error("rank {}: accuracy {} (want {}) loss {} (want {})", rank,
                            report ? (*report)["main/accuracy"] : -1, accuracy,
                            report ? (*report)["main/loss"] : -1, loss);
    }
    return ok_status();
  });
  EXPECT_EQ(failures, "");
}

// BatchNorm running statistics differ per rank after local forwards; afterwards they are the mean.
TEST(AllreducePersistentTest, AveragesBatchNormStatistics) {
  for (int size = 1; size <= 4; ++size) {
    std::mutex mu;
    std::vector<at::Tensor> means(size), synced(size);
    std::string failures = run_on_ranks(size, [&](int rank, comm::Communicator& comm) -> Status {
      torch::nn::BatchNorm1d bn(3);
      bn->train();
      bn->forward(at::full({4, 3}, double(rank)).to(at::kFloat) +
                  at::arange(12).reshape({4, 3}).to(at::kFloat));
      {
        std::lock_guard<std::mutex> lock(mu);
        means[rank] = bn->running_mean.clone();
      }
      AllreducePersistent sync(*bn, comm);
      COHORT_RETURN_IF_ERROR(sync());
      std::lock_guard<std::mutex> lock(mu);
      synced[rank] = bn->running_mean.clone();
      if (bn->num_batches_tracked.item<int64_t>() != 1) return internal_error("num_batches_tracked changed");
      return ok_status();
    });
    ASSERT_EQ(failures, "") << "size " << size;
    at::Tensor expected = at::stack(means).mean(0);
    for (int r = 0; r < size; ++r) EXPECT_TRUE(at::allclose(synced[r], expected)) << "rank " << r;
    if (size > 1) {
      EXPECT_FALSE(at::allclose(means[0], means[1]));
    }
  }
}

}  // namespace
}  // namespace cohort::train
