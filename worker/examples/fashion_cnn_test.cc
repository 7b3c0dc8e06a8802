// train_data_parallel's split of the comm wait (DataParallelOptions::measure_skew), with two
// ranks as threads over a loopback world: when rank 1 is made slower every step, rank 0's wait is
// that skew, and the split says so; the slower rank itself waits for nobody.

#include "worker/examples/fashion_cnn.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::examples {
namespace {

constexpr auto kDelay = std::chrono::milliseconds(200);  // well above the compute noise of a loaded machine

// Trains one short epoch on 2 ranks; rank 1 sleeps kDelay after every step when `slow_rank_1`.
std::vector<EpochStats> run(bool measure_skew, bool slow_rank_1) {
  at::set_num_threads(1);
  auto worlds = comm::testing::loopback_worlds(2);
  std::vector<EpochStats> stats(2);
  auto statuses = comm::testing::run_ranks(2, [&](int rank) -> Status {
    comm::CommunicatorOptions options;
    options.timeout = std::chrono::seconds(30);
    COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", worlds[rank], options));
    DataParallelOptions train;
    train.limit = 640;  // 320 samples a rank: 5 steps of 64
    train.verbose = false;
    train.measure_skew = measure_skew;
    if (slow_rank_1 && rank == 1) {
      train.on_step = [](int64_t, int64_t, int, double) { std::this_thread::sleep_for(kDelay); };
    }
    COHORT_ASSIGN_OR_RETURN(DataParallelResult result, train_data_parallel(*comm, train));
    if (result.epochs.size() != 1) return internal_error("{} epochs", result.epochs.size());
    stats[rank] = result.epochs[0];
    return ok_status();
  });
  EXPECT_EQ(comm::testing::failures(statuses), "");
  return stats;
}

TEST(FashionCnnTest, ASlowerRanksSkewIsTheFasterRanksWait) {
  std::vector<EpochStats> stats = run(/*measure_skew=*/true, /*slow_rank_1=*/true);
  const EpochStats& fast = stats[0];
  const EpochStats& slow = stats[1];
  ASSERT_EQ(fast.steps, 5);
  // Rank 0 waits about kDelay in each of the 4 steps after the first for rank 1's gradients.
  const double delays = 4 * std::chrono::duration<double>(kDelay).count();
  EXPECT_GT(fast.comm_wait_seconds, 0.5 * delays);
  EXPECT_GE(fast.skew_wait_seconds, 0.8 * fast.comm_wait_seconds)
      << "wait " << fast.comm_wait_seconds << " s, of it skew " << fast.skew_wait_seconds << " s";
  EXPECT_LE(fast.skew_wait_seconds, fast.comm_wait_seconds + 1e-9);
  // Rank 1 is the last to end every backward: no skew to wait for.
  EXPECT_GE(slow.skew_wait_seconds, 0.0);
  EXPECT_LT(slow.skew_wait_seconds, 0.25 * fast.skew_wait_seconds);
  EXPECT_GT(fast.compute_mean_seconds, 0.0);
  EXPECT_GE(fast.compute_sd_seconds, 0.0);
}

TEST(FashionCnnTest, NoSplitUnlessAskedFor) {
  std::vector<EpochStats> stats = run(/*measure_skew=*/false, /*slow_rank_1=*/false);
  EXPECT_EQ(stats[0].skew_wait_seconds, -1.0);
  EXPECT_EQ(stats[1].skew_wait_seconds, -1.0);
}

}  // namespace
}  // namespace cohort::examples
