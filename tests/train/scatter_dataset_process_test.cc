// scatter_dataset over a Dataset (size + get) that only the root process holds, with ranks as
// processes over UCX: an unseeded shuffle (a fresh order, drawn at the root) still hands every
// sample to exactly one rank. Each child gets torchrun's variables and builds its communicator
// with create_communicator() (env://). The parent never touches libtorch.

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "daemon/agent/free_port.h"
#include "daemon/coordinator/temp_dir.h"
#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/train/dataset.h"
#include "worker/train/scatter_dataset.h"

namespace cohort::train {
namespace {

using comm::Duration;
using comm::testing::failed_ranks;
using comm::testing::ProcessRanks;

constexpr Duration kTestDeadline = std::chrono::seconds(90);
constexpr int64_t kSamples = 29;

using coordinator::testing::TempDir;

// Rank 0 alone holds the dataset (sample i: input [i, i], target i); every rank checks that the
// targets all ranks received are 0..kSamples-1, each once, not in the identity order.
Status scatter_and_check(int rank) {
  COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator());
  std::unique_ptr<Dataset> dataset;
  if (rank == 0) {
    dataset = make_dataset(kSamples, [](int64_t i) {
      return Example{at::full({2}, double(i)), at::full({}, i, at::kLong)};
    });
  }
  COHORT_ASSIGN_OR_RETURN(TensorDataset mine, scatter_dataset(dataset.get(), *comm, 0, /*shuffle=*/true,
                                                              /*seed=*/std::nullopt, /*force_equal_length=*/false));
  std::string targets;
  for (int64_t i = 0; i < mine.size(); ++i) {
    int64_t t = mine.targets[i].item<int64_t>();
    if (mine.inputs[i][1].item<double>() != double(t)) return internal_error("sample {} lost its input", t);
    targets += std::to_string(t) + " ";
  }
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> all, comm->allgather_obj(targets));
  std::vector<int64_t> order;
  for (const std::string& part : all) {
    size_t pos = 0;
    while (pos < part.size()) {
      size_t end = part.find(' ', pos);
      order.push_back(std::stoll(part.substr(pos, end - pos)));
      pos = end + 1;
    }
  }
  std::vector<int64_t> sorted = order, identity(kSamples);
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < kSamples; ++i) identity[i] = i;
  if (sorted != identity) return internal_error("the ranks' samples are not every sample once: {}", targets);
  if (order == identity) return internal_error("an unseeded shuffle gave the identity order");
  return ok_status();
}

TEST(ScatterDatasetProcessTest, RootOnlyDatasetUnseededShuffleCoversEverySampleOnce) {
  for (int size : {2, 3}) {
    TempDir dir;
    StatusOr<int> port = agent::pick_free_port("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status().to_string();
    ProcessRanks ranks(dir.path());
    ranks.fork_ranks(size, [&](int rank) -> Status {
      at::set_num_threads(1);
      setenv("RANK", std::to_string(rank).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(*port).c_str(), 1);
      return scatter_and_check(rank);
    });
    EXPECT_EQ(failed_ranks(ranks.wait_all(kTestDeadline)), "") << "size " << size;
  }
}

}  // namespace
}  // namespace cohort::train
