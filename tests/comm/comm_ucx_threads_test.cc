// The collective matrix with ranks as threads of one process, each with its own UCX transport
// (shared memory between them), bootstrapped through one in-process HashStore: the same matrix
// //worker/comm:communicator_test runs on the loopback transport, here over UCX.

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/testing/collective_matrix.h"
#include "worker/comm/testing/rank_threads.h"
#include "worker/comm/transport/ucx/ucx_transport.h"

namespace cohort::comm {
namespace {

// Runs `fn` on every rank with a `kind` communicator over UCX; `ranks_per_node` simulates nodes.
std::vector<Status> on_ucx(int size, const std::string& kind, int ranks_per_node,
                           const std::function<Status(Communicator&)>& fn) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> nodes;
  for (int r = 0; r < size; ++r) nodes.push_back("node" + std::to_string(r / ranks_per_node));
  return testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<UcxTransport> transport, UcxTransport::create(*store, rank, size));
    auto world = std::make_shared<CommWorld>(CommWorld{std::move(transport), store, nodes});
    CommunicatorOptions options;
    options.timeout = std::chrono::seconds(60);
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, world, options));
    return fn(*comm);
  }, std::chrono::minutes(10));
}

class UcxMatrixTest : public ::testing::TestWithParam<int> {};

TEST_P(UcxMatrixTest, EveryOpDtypeReduceOpAndSizeMatchesTheReference) {
  auto statuses = on_ucx(GetParam(), "flat", 1 << 20, [](Communicator& comm) {
    return testing::run_collective_matrix(comm, testing::matrix_sizes());
  });
  EXPECT_EQ(testing::failures(statuses), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, UcxMatrixTest, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(UcxKindsTest, HierarchicalKindsOnSimulatedNodes) {
  for (const std::string kind : {"naive", "hierarchical", "two_dimensional"}) {
    auto statuses = on_ucx(4, kind, 2, [](Communicator& comm) { return testing::check_allreduce(comm, 100003); });
    EXPECT_EQ(testing::failures(statuses), "") << kind;
  }
}

}  // namespace
}  // namespace cohort::comm
