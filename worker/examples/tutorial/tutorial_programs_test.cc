// The tutorial's programs with ranks as threads over the loopback transport, each rank's output
// compared with the tutorial's documented lines; synchronous SGD also against one process
// training on the union of the ranks' batches.

#include "worker/examples/tutorial/tutorial_programs.h"

#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "worker/autograd/testing/autograd_ranks.h"

namespace cohort::examples::tutorial {
namespace {

using autograd::testing::run_autograd_ranks;

// Runs `program` on `size` ranks; returns each rank's output (failures are test failures).
std::vector<std::string> outputs_of(int size,
                                    const std::function<void(Communicator&, std::ostream&)>& program) {
  std::vector<std::string> outputs(size);
  EXPECT_EQ(run_autograd_ranks(size,
                               [&](int rank, Communicator& comm) {
                                 std::ostringstream out;
                                 program(comm, out);
                                 outputs[rank] = out.str();
                               }),
            "")
      << "size " << size;
  return outputs;
}

TEST(TutorialProgramsTest, BlockingPointToPoint) {
  for (int size : {2, 3}) {
    auto out = outputs_of(size, blocking_p2p);
    EXPECT_EQ(out[0], "Rank 0 has data 1\n");
    EXPECT_EQ(out[1], "Rank 1 has data 1\n");
    if (size == 3) {
      EXPECT_EQ(out[2], "");
    }
  }
}

TEST(TutorialProgramsTest, NonBlockingPointToPoint) {
  auto out = outputs_of(2, nonblocking_p2p);
  EXPECT_EQ(out[0], "Rank 0 started sending\nRank 0 has data 1\n");
  EXPECT_EQ(out[1], "Rank 1 started receiving\nRank 1 has data 1\n");
}

TEST(TutorialProgramsTest, SixCollectivesOverNewGroupZeroOne) {
  for (int size : {2, 4}) {
    auto out = outputs_of(size, group_collectives);
    EXPECT_EQ(out[0],
              "all_reduce(ones): Rank 0 has data 2\n"
              "broadcast: Rank 0 has data 1\n"
              "reduce: Rank 0 has data 3\n"
              "all_reduce: Rank 0 has data 3\n"
              "scatter: Rank 0 has data 10\n"
              "gather: Rank 0 has data 1 2\n"
              "all_gather: Rank 0 has data 1 2\n");
    EXPECT_EQ(out[1],
              "all_reduce(ones): Rank 1 has data 2\n"
              "broadcast: Rank 1 has data 1\n"
              "all_reduce: Rank 1 has data 3\n"
              "scatter: Rank 1 has data 11\n"
              "all_gather: Rank 1 has data 1 2\n");
    for (int r = 2; r < size; ++r) EXPECT_EQ(out[r], "") << "rank " << r << " is outside the group";
  }
}

TEST(TutorialProgramsTest, RingAllreduceSumsEveryRanksTensor) {
  for (int size : {2, 3, 5}) {
    auto out = outputs_of(size, ring_allreduce_demo);
    const int sum = size * (size + 1) / 2;
    for (int r = 0; r < size; ++r) {
      EXPECT_EQ(out[r], "Rank " + std::to_string(r) + " has data " + std::to_string(sum) + " " +
                            std::to_string(sum) + " " + std::to_string(sum) + "\n")
          << "size " << size;
    }
  }
}

TEST(TutorialProgramsTest, SyncSgdWithAverageGradientsTrainsTheSameModelAsOneProcess) {
  SgdOptions options;
  options.epochs = 3;
  for (int size : {1, 2, 4}) {
    SgdResult reference = sync_sgd_reference(size, options);
    std::vector<SgdResult> results(size);
    std::vector<std::string> outputs(size);
    ASSERT_EQ(run_autograd_ranks(size,
                                 [&](int rank, Communicator& comm) {
                                   std::ostringstream out;
                                   results[rank] = sync_sgd(comm, out, options);
                                   outputs[rank] = out.str();
                                 }),
              "");
    for (int r = 0; r < size; ++r) {
      SCOPED_TRACE(::testing::Message() << "size " << size << " rank " << r);
      ASSERT_EQ(results[r].epoch_loss.size(), 3u);
      EXPECT_LT(results[r].epoch_loss[2], results[r].epoch_loss[0] * 0.9) << outputs[r];
      EXPECT_NE(outputs[r].find("Rank " + std::to_string(r) + ", epoch 2: "), std::string::npos)
          << outputs[r];
      for (size_t p = 0; p < reference.parameters.size(); ++p) {
        EXPECT_TRUE(at::allclose(results[r].parameters[p], reference.parameters[p], 1e-4, 1e-5))
            << results[r].parameters[p] << "\nexpected\n"
            << reference.parameters[p];
      }
    }
  }
}

}  // namespace
}  // namespace cohort::examples::tutorial
