// create_communicator without a kind gives ChainerMN's default, hierarchical, with its node
// layout, over loopback ranks (threads). The env:// forms (create_communicator(), comm_world())
// run over UCX processes in tests/comm/comm_world_process_test.cc.

#include <gtest/gtest.h>

#include "worker/comm/communicator.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::comm {
namespace {

using testing::failures;
using testing::loopback_worlds;
using testing::nodes_of;
using testing::run_ranks;

TEST(DefaultCommunicatorTest, NoKindGivesHierarchical) {
  EXPECT_EQ(kDefaultCommunicatorKind, "hierarchical");
  // 5 ranks, 2 per node: nodes {0,1}, {2,3}, {4}; the inter and intra layout is hierarchical's.
  for (int size : {1, 2, 5}) {
    auto worlds = loopback_worlds(size, nodes_of(2));
    CommunicatorOptions options;
    options.timeout = std::chrono::seconds(20);
    std::string got = failures(run_ranks(size, [&](int rank) -> Status {
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(worlds[rank], options));
      if (comm->kind() != "hierarchical") return internal_error("kind {}", comm->kind());
      if (comm->inter_size() != (size + 1) / 2) return internal_error("inter_size {}", comm->inter_size());
      if (comm->intra_rank() != rank % 2) return internal_error("intra_rank {}", comm->intra_rank());
      double sum = 0;
      COHORT_ASSIGN_OR_RETURN(sum, comm->allreduce_obj(rank + 1.0));
      if (sum != size * (size + 1) / 2.0) return internal_error("allreduce gave {}", sum);
      return ok_status();
    }));
    EXPECT_EQ(got, "") << "size " << size;
  }
}

}  // namespace
}  // namespace cohort::comm
