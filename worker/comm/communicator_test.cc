#include "worker/comm/communicator.h"

#include <cstring>
#include <memory>
#include <numeric>
#include <thread>

#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/collective_matrix.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::comm {
namespace {

using testing::failures;
using testing::loopback_worlds;
using testing::nodes_of;
using testing::run_ranks;

// Tests fail within a minute rather than the five-minute production default.
CommunicatorOptions test_options() {
  CommunicatorOptions options;
  options.timeout = std::chrono::seconds(60);
  return options;
}

// Runs `fn(comm)` on every rank of a loopback group with communicators of `kind`.
std::vector<Status> on_loopback(int size, const std::string& kind, const std::function<Status(Communicator&)>& fn,
                                const std::function<std::string(int)>& node_of = nodes_of(1 << 20),
                                CommunicatorOptions options = test_options()) {
  auto worlds = loopback_worlds(size, node_of);
  return run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, worlds[rank], options));
    return fn(*comm);
  }, std::chrono::minutes(10));
}

class MatrixTest : public ::testing::TestWithParam<int> {};

TEST_P(MatrixTest, EveryOpDtypeReduceOpAndSizeMatchesTheReference) {
  int size = GetParam();
  auto statuses = on_loopback(size, "flat", [](Communicator& comm) {
    return testing::run_collective_matrix(comm, testing::matrix_sizes());
  });
  EXPECT_EQ(failures(statuses), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, MatrixTest, ::testing::Values(1, 2, 3, 4, 5, 8));

// The same matrix forced onto the intra-node shared-memory engine (the ranks are threads here;
// tests/comm:shm_process_test runs it with processes). 140001 f64 elements span two chunks.
class ShmMatrixTest : public ::testing::TestWithParam<int> {};

TEST_P(ShmMatrixTest, EveryOpDtypeReduceOpAndSizeMatchesTheReferenceOnSharedMemory) {
  CommunicatorOptions options = test_options();
  options.algorithm = Algorithm::kShm;
  auto statuses = on_loopback(GetParam(), "flat", [](Communicator& comm) {
    return testing::run_collective_matrix(comm, {0, 1, 7, 1000, 140001});
  }, nodes_of(1 << 20), options);
  EXPECT_EQ(failures(statuses), "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, ShmMatrixTest, ::testing::Values(2, 3, 5, 8));

TEST(CommunicatorTest, AForcedAlgorithmAppliesWhereItExistsAndEveryOpStillRuns) {
  for (Algorithm forced : {Algorithm::kRing, Algorithm::kHalvingDoubling, Algorithm::kRecursiveDoubling,
                           Algorithm::kBinomialTree, Algorithm::kLinear, Algorithm::kPairwise}) {
    CommunicatorOptions options = test_options();
    options.algorithm = forced;
    auto statuses = on_loopback(3, "flat", [](Communicator& comm) {
      return testing::run_collective_matrix(comm, {7, 1000});
    }, nodes_of(3), options);
    EXPECT_EQ(failures(statuses), "") << algorithm_name(forced);
  }
}

struct KindLayout {
  std::string kind;
  int size;
  int ranks_per_node;
};

class KindTest : public ::testing::TestWithParam<KindLayout> {};

TEST_P(KindTest, AllreduceAgreesWithTheReferenceAndPropertiesMatchTheLayout) {
  const KindLayout& layout = GetParam();
  auto statuses = on_loopback(layout.size, layout.kind, [&](Communicator& comm) -> Status {
    int nodes = (layout.size + layout.ranks_per_node - 1) / layout.ranks_per_node;
    if (comm.inter_size() != nodes) return internal_error("inter_size {} != {}", comm.inter_size(), nodes);
    if (comm.inter_rank() != comm.rank() / layout.ranks_per_node) return internal_error("inter_rank {}", comm.inter_rank());
    if (comm.intra_rank() != comm.rank() % layout.ranks_per_node) return internal_error("intra_rank {}", comm.intra_rank());
    for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
      COHORT_RETURN_IF_ERROR(testing::check_allreduce(comm, count));
    }
    return ok_status();
  }, nodes_of(layout.ranks_per_node));
  EXPECT_EQ(failures(statuses), "");
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, KindTest,
    ::testing::Values(KindLayout{"naive", 3, 3}, KindLayout{"naive", 4, 2}, KindLayout{"flat", 5, 2},
                      KindLayout{"hierarchical", 4, 2}, KindLayout{"hierarchical", 5, 2},
                      KindLayout{"hierarchical", 8, 4}, KindLayout{"hierarchical", 3, 1},
                      KindLayout{"two_dimensional", 4, 2}, KindLayout{"two_dimensional", 6, 3},
                      KindLayout{"two_dimensional", 8, 2}, KindLayout{"single_node", 4, 4},
                      KindLayout{"single_node", 1, 1}),
    [](const auto& info) {
      return info.param.kind + "_" + std::to_string(info.param.size) + "x" + std::to_string(info.param.ranks_per_node);
    });

TEST(CommunicatorKindsTest, SingleNodeRefusesRanksOnSeveralNodesNamingThem) {
  auto statuses = on_loopback(4, "single_node", [](Communicator&) { return ok_status(); }, nodes_of(2));
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find("node 'node1': ranks 2,3"), std::string::npos) << status.message();
  }
}

TEST(CommunicatorKindsTest, TwoDimensionalRefusesUnevenNodes) {
  auto statuses = on_loopback(3, "two_dimensional", [](Communicator&) { return ok_status(); }, nodes_of(2));
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition);
    EXPECT_NE(status.message().find("same number of ranks on every node"), std::string::npos) << status.message();
  }
}

TEST(CommunicatorKindsTest, PureNcclInACpuBuildSaysWhichBuildItNeeds) {
  auto worlds = loopback_worlds(1);
  auto comm = create_communicator("pure_nccl", worlds[0]);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(comm.status().message().find("--config=cuda"), std::string::npos);
}

TEST(CommunicatorKindsTest, UnknownKindListsTheKnownOnes) {
  auto worlds = loopback_worlds(1);
  auto comm = create_communicator("ring_of_fire", worlds[0]);
  ASSERT_FALSE(comm.ok());
  EXPECT_NE(comm.status().message().find("two_dimensional"), std::string::npos);
}

TEST(CommunicatorTest, SplitFollowsMpiSemantics) {
  // 6 ranks: colors by parity, keys reversed; rank 5 opts out.
  auto statuses = on_loopback(6, "flat", [](Communicator& comm) -> Status {
    int color = comm.rank() == 5 ? kUndefinedColor : comm.rank() % 2;
    COHORT_ASSIGN_OR_RETURN(auto sub, comm.split(color, -comm.rank()));
    if (comm.rank() == 5) {
      if (sub != nullptr) return internal_error("rank 5 got a communicator");
      COHORT_ASSIGN_OR_RETURN(double all, comm.allreduce_obj(1));
      return all == comm.size() ? ok_status() : internal_error("parent sum {}", all);
    }
    int expected_size = color == 0 ? 3 : 2;  // evens {0,2,4}; odds {1,3}
    if (sub->size() != expected_size) return internal_error("size {}", sub->size());
    // Reversed keys: the highest old rank becomes rank 0.
    int expected_rank = color == 0 ? (4 - comm.rank()) / 2 : (3 - comm.rank()) / 2;
    if (sub->rank() != expected_rank) return internal_error("rank {} expected {}", sub->rank(), expected_rank);
    // Traffic in the sub-communicators does not cross: sum the old ranks.
    double total = *sub->allreduce_obj(comm.rank());
    double want = color == 0 ? 6 : 4;
    if (total != want) return internal_error("sum {} expected {}", total, want);
    // And the parent still works afterwards.
    COHORT_ASSIGN_OR_RETURN(double all, comm.allreduce_obj(1));
    return all == comm.size() ? ok_status() : internal_error("parent sum {}", all);
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, NestedSplitsAndNewGroupGetDistinctContexts) {
  auto statuses = on_loopback(4, "flat", [](Communicator& comm) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto halves, comm.split(comm.rank() / 2, comm.rank()));
    COHORT_ASSIGN_OR_RETURN(auto quarter, halves->split(halves->rank(), 0));
    COHORT_ASSIGN_OR_RETURN(auto group, comm.new_group({3, 1}));
    if (comm.rank() == 0 || comm.rank() == 2) {
      if (group != nullptr) return internal_error("non-member got a group");
    } else {
      if (group->size() != 2 || group->rank() != (comm.rank() == 3 ? 0 : 1)) return internal_error("group order");
      COHORT_ASSIGN_OR_RETURN(double sum, group->allreduce_obj(comm.rank()));
      if (sum != 4) return internal_error("group sum {}", sum);
    }
    if (halves->context_id() == comm.context_id() || quarter->context_id() == halves->context_id()) {
      return internal_error("contexts reused");
    }
    COHORT_ASSIGN_OR_RETURN(double half_sum, halves->allreduce_obj(comm.rank()));
    return half_sum == (comm.rank() < 2 ? 1 : 5) ? ok_status() : internal_error("half sum {}", half_sum);
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, ObjectHelpers) {
  auto statuses = on_loopback(3, "flat", [](Communicator& comm) -> Status {
    COHORT_ASSIGN_OR_RETURN(std::string b, comm.bcast_obj(comm.rank() == 1 ? "hello from 1" : "", 1));
    if (b != "hello from 1") return internal_error("bcast_obj gave '{}'", b);
    std::string mine(comm.rank() * 3, static_cast<char>('a' + comm.rank()));
    COHORT_ASSIGN_OR_RETURN(auto all, comm.allgather_obj(mine));
    if (all.size() != 3 || all[2] != "cccccc" || !all[0].empty()) return internal_error("allgather_obj");
    COHORT_ASSIGN_OR_RETURN(auto gathered, comm.gather_obj(mine, 2));
    if (comm.rank() == 2 && (gathered.size() != 3 || gathered[1] != "bbb")) return internal_error("gather_obj");
    if (comm.rank() != 2 && !gathered.empty()) return internal_error("gather_obj off root");
    COHORT_ASSIGN_OR_RETURN(double m, comm.allreduce_obj(comm.rank() * 2.5, ReduceOp::kMax));
    return m == 5.0 ? ok_status() : internal_error("allreduce_obj max {}", m);
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, InvalidArgumentsFailAtTheCall) {
  auto worlds = loopback_worlds(2);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
    float x[4] = {};
    auto expect_invalid = [](const std::shared_ptr<Work>& work, const char* needle) -> Status {
      if (!work->is_completed()) return internal_error("not completed at the call ({})", needle);
      Status status = work->error();
      if (status.code() != StatusCode::kInvalidArgument || status.message().find(needle) == std::string::npos) {
        return internal_error("expected INVALID_ARGUMENT with '{}', got {}", needle, status.to_string());
      }
      return ok_status();
    };
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->broadcast(x, 4, DataType::kFloat32, 2), "root 2 is out of range"));
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->reduce(x, x, 4, DataType::kFloat32, ReduceOp::kSum, -1), "root -1"));
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->allgatherv(x, x, {1, 2, 3}, DataType::kFloat32), "3 entries"));
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->isend(x, 4, DataType::kFloat32, rank), "another rank"));
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->allreduce(nullptr, nullptr, 4, DataType::kFloat32, ReduceOp::kSum), "null"));
    COHORT_RETURN_IF_ERROR(expect_invalid(
        comm->allreduce(x, x, 4, static_cast<DataType>(42), ReduceOp::kSum), "invalid data type"));
    COHORT_RETURN_IF_ERROR(expect_invalid(comm->alltoall(x, x, 2, DataType::kFloat32), "in place"));
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, AbsentPeerTimesOutNamingOpPeerAndTimeWithFlightRecorder) {
  auto worlds = loopback_worlds(3);
  CommunicatorOptions options;
  options.timeout = std::chrono::milliseconds(300);
  // Rank 2 never shows up for the second allreduce.
  auto statuses = run_ranks(3, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank], options));
    float x = 1;
    COHORT_RETURN_IF_ERROR(comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait());
    if (rank == 2) return ok_status();
    auto start = Clock::now();
    Status status = comm->allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait();
    auto waited = Clock::now() - start;
    if (status.code() != StatusCode::kDeadlineExceeded) return internal_error("got {}", status.to_string());
    // Rank 1 waits on rank 2; rank 0 may be waiting on rank 1, which is itself stuck: each names
    // the peer it waits for.
    for (const char* needle : {"allreduce #1", "flat communicator", "waiting to receive from rank", "300 ms"}) {
      if (status.message().find(needle) == std::string::npos) return internal_error("'{}' missing: {}", needle, status.message());
    }
    if (waited > std::chrono::milliseconds(600)) return internal_error("took too long to time out");
    if (status.message().find("last operations of this communicator:\n  #0 allreduce") == std::string::npos) {
      return internal_error("flight recorder missing from the error: {}", status.message());
    }
    std::string dump = comm->flight_recorder_dump();
    if (dump.find("#0 allreduce") == std::string::npos || dump.find("DEADLINE_EXCEEDED") == std::string::npos) {
      return internal_error("flight recorder: {}", dump);
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, FailedPeerFailsPendingCollectiveWithTheRankNamed) {
  std::shared_ptr<LoopbackFabric> fabric;
  auto worlds = loopback_worlds(3, nodes_of(3), &fabric);
  auto statuses = run_ranks(3, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      fabric->fail_rank(1, unavailable_error("killed by the test"));
      return ok_status();
    }
    std::vector<float> x(1000, 1);
    Status status = comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    if (status.code() != StatusCode::kUnavailable || status.message().find("rank 1") == std::string::npos) {
      return internal_error("expected UNAVAILABLE naming rank 1, got {}", status.to_string());
    }
    return ok_status();
  }, std::chrono::seconds(30));
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, DebugModeReportsMismatchedCollectivesWithBothCalls) {
  CommunicatorOptions options;
  options.debug_checks = true;
  options.timeout = std::chrono::seconds(5);
  auto statuses = on_loopback(2, "flat", [](Communicator& comm) -> Status {
    float x[8] = {};
    Status status = comm.rank() == 0 ? comm.allreduce(x, x, 8, DataType::kFloat32, ReduceOp::kSum)->wait()
                                     : comm.broadcast(x, 4, DataType::kFloat32, 0)->wait();
    if (status.code() != StatusCode::kInvalidArgument) return internal_error("got {}", status.to_string());
    for (const char* needle : {"collective mismatch", "allreduce(f32 x 8, sum)", "broadcast(f32 x 4, root 0)"}) {
      if (status.message().find(needle) == std::string::npos) return internal_error("'{}' missing: {}", needle, status.message());
    }
    return ok_status();
  }, nodes_of(2), options);
  EXPECT_EQ(failures(statuses), "");
}

// A receive whose Work is dropped before it completed (its owner gave up and frees the buffer)
// is cancelled: the next message on the tag goes to the next receive, not into the dropped one's
// buffer. With the point-to-point check on too, whose signature transfers go with it.
TEST(CommunicatorTest, AReceiveDroppedUnfinishedLeavesTheNextMessageToTheNextReceive) {
  for (bool checked : {false, true}) {
    CommunicatorOptions options = test_options();
    options.debug_checks = checked;
    options.timeout = std::chrono::seconds(5);
    auto statuses = on_loopback(2, "flat", [](Communicator& comm) -> Status {
      if (comm.rank() == 1) {
        auto dropped_buffer = std::make_unique<int32_t>(-1);
        auto dropped = comm.irecv(dropped_buffer.get(), 1, DataType::kInt32, 0, 3);
        if (dropped->is_completed()) return internal_error("the receive completed before anything was sent");
      }
      // Rank 0 sends only once rank 1 dropped its receive.
      COHORT_RETURN_IF_ERROR(comm.barrier()->wait());
      int32_t first = 1, second = 2;
      if (comm.rank() == 0) {
        COHORT_RETURN_IF_ERROR(comm.send(&first, 1, DataType::kInt32, 1, 3));
        return comm.send(&second, 1, DataType::kInt32, 1, 3);
      }
      int32_t got[2] = {0, 0};
      for (int32_t& value : got) COHORT_RETURN_IF_ERROR(comm.recv(&value, 1, DataType::kInt32, 0, 3));
      if (got[0] != first || got[1] != second) return internal_error("received {} then {}, expected 1 then 2", got[0], got[1]);
      return ok_status();
    }, nodes_of(2), options);
    EXPECT_EQ(failures(statuses), "") << (checked ? "with" : "without") << " the point-to-point check";
  }
}

TEST(CommunicatorTest, ASendDroppedUnfinishedStillArrives) {
  // As MPI_Request_free lets a send complete, and a torch.distributed isend whose request is
  // dropped still arrives: the buffer stays the caller's to keep, the message goes out.
  for (bool checked : {false, true}) {
    CommunicatorOptions options = test_options();
    options.debug_checks = checked;
    options.timeout = std::chrono::seconds(5);
    auto statuses = on_loopback(2, "flat", [](Communicator& comm) -> Status {
      std::vector<int32_t> sent(4096, 7);
      if (comm.rank() == 0) {
        auto dropped = comm.isend(sent.data(), sent.size(), DataType::kInt32, 1, 4);
        if (dropped->is_completed()) return internal_error("the send completed before its receive was posted");
      }
      // Rank 1 posts its receive only once rank 0 dropped its send.
      COHORT_RETURN_IF_ERROR(comm.barrier()->wait());
      if (comm.rank() == 1) {
        std::vector<int32_t> got(sent.size(), 0);
        COHORT_RETURN_IF_ERROR(comm.recv(got.data(), got.size(), DataType::kInt32, 0, 4));
        if (got != sent) return internal_error("the dropped send's data did not arrive intact");
      }
      return comm.barrier()->wait();  // rank 0 keeps its buffer until the receive is done
    }, nodes_of(2), options);
    EXPECT_EQ(failures(statuses), "") << (checked ? "with" : "without") << " the point-to-point check";
  }
}

TEST(CommunicatorTest, ADroppedSendWhoseReceiveNeverComesIsCancelledAtItsDeadline) {
  // Not kept (with its buffers) for ever: past its deadline it is cancelled, as a wait() past it
  // would, so its message never arrives; a later send on the tag is not held up behind it.
  CommunicatorOptions options = test_options();
  options.timeout = std::chrono::milliseconds(300);
  auto statuses = on_loopback(2, "flat", [](Communicator& comm) -> Status {
    std::vector<int32_t> late(64, 1), on_time(64, 2);
    if (comm.rank() == 0) {
      auto dropped = comm.isend(late.data(), late.size(), DataType::kInt32, 1, 5);
      if (dropped->is_completed()) return internal_error("the send completed before its receive was posted");
      dropped.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(450));  // past its deadline
      auto next = comm.isend(on_time.data(), on_time.size(), DataType::kInt32, 1, 5);
      next.reset();  // dropping it sweeps the kept sends: the first, expired, is cancelled
    }
    COHORT_RETURN_IF_ERROR(comm.barrier(CallOptions{std::chrono::seconds(5)})->wait());
    if (comm.rank() == 1) {
      std::vector<int32_t> got(64, 0);
      COHORT_RETURN_IF_ERROR(comm.recv(got.data(), got.size(), DataType::kInt32, 0, 5, CallOptions{std::chrono::seconds(5)}));
      if (got != on_time) return internal_error("received {} first, expected the later send's 2", got[0]);
    }
    return comm.barrier(CallOptions{std::chrono::seconds(5)})->wait();
  }, nodes_of(2), options);
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, AsyncOperationsCompleteInIssueOrderAndOverlapTheCaller) {
  auto statuses = on_loopback(3, "flat", [](Communicator& comm) -> Status {
    std::vector<std::vector<float>> buffers(20, std::vector<float>(5000));
    std::vector<std::shared_ptr<Work>> works;
    for (size_t b = 0; b < buffers.size(); ++b) {
      std::fill(buffers[b].begin(), buffers[b].end(), static_cast<float>(b + comm.rank()));
      works.push_back(comm.allreduce(buffers[b].data(), buffers[b].data(), 5000, DataType::kFloat32, ReduceOp::kSum));
    }
    for (size_t b = 0; b < buffers.size(); ++b) {
      COHORT_RETURN_IF_ERROR(works[b]->wait());
      float want = static_cast<float>(3 * b + 3);
      if (buffers[b][4999] != want) return internal_error("bucket {}: {} != {}", b, buffers[b][4999], want);
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

// A blocking call issued while asynchronous ones are queued or running waits its turn (it runs
// after them, on the executor), and one issued when nothing is queued runs on the caller's thread;
// both hand back a completed Work. Alternating the two many times also exercises the run token
// passing between the executor and the caller.
TEST(CommunicatorTest, BlockingCallsKeepIssueOrderBehindAsynchronousOnes) {
  auto statuses = on_loopback(3, "flat", [](Communicator& comm) -> Status {
    CallOptions blocking;
    blocking.blocking = true;
    for (int round = 0; round < 50; ++round) {
      std::vector<std::vector<float>> buffers(4, std::vector<float>(64));
      std::vector<std::shared_ptr<Work>> works;
      for (size_t b = 0; b < buffers.size(); ++b) {
        std::fill(buffers[b].begin(), buffers[b].end(), static_cast<float>(b + comm.rank()));
        works.push_back(
            comm.allreduce(buffers[b].data(), buffers[b].data(), 64, DataType::kFloat32, ReduceOp::kSum));
      }
      // A blocking max over bucket 3, which is queued for a sum: in issue order the sum (12) comes
      // first and the max keeps it; run ahead of the queue, the max (5) would then be summed (15).
      auto done =
          comm.allreduce(nullptr, buffers[3].data(), 64, DataType::kFloat32, ReduceOp::kMax, blocking);
      if (!done->is_completed()) return internal_error("round {}: a blocking call returned pending", round);
      COHORT_RETURN_IF_ERROR(done->error());
      for (size_t b = 0; b < buffers.size(); ++b) {
        if (!works[b]->is_completed())
          return internal_error("round {}: bucket {} queued before a blocking call is still pending", round,
                                b);
        COHORT_RETURN_IF_ERROR(works[b]->error());
      }
      // Bucket 3: summed (3 * 3 + 0 + 1 + 2 = 12), then the max of 12 on every rank.
      if (buffers[3][63] != 12.0f)
        return internal_error("round {}: bucket 3 is {}, not 12", round, buffers[3][63]);
      for (size_t b = 0; b < 3; ++b) {
        const float want = static_cast<float>(3 * b + 3);
        if (buffers[b][0] != want)
          return internal_error("round {}: bucket {}: {} != {}", round, b, buffers[b][0], want);
      }
      // Nothing queued now: a blocking call runs here and still agrees with the others.
      float x = static_cast<float>(comm.rank() + 1);
      COHORT_RETURN_IF_ERROR(comm.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, blocking)->wait());
      if (x != 6.0f) return internal_error("round {}: blocking allreduce gave {}, not 6", round, x);
    }
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

}  // namespace
}  // namespace cohort::comm

namespace cohort::comm {

// Reaches the communicator's test seams.
class CommunicatorTestPeer {
 public:
  // Before any collective: blocking calls return the run token without notifying the executor.
  static void return_token_plainly(Communicator& comm) { comm.runner_.return_token_plainly_for_testing(); }
};

}  // namespace cohort::comm

namespace cohort::comm {
namespace {

// The executor starts (an asynchronous call from a second thread) while a blocking call holds the
// run token on the caller's thread, and the blocking call gives the token back without notifying
// it, as one does that did not see the executor start (forced here: that race lasts nanoseconds).
// The queued call still runs, after the blocking one: the new executor looks at the token again
// by itself. Without that it would wait for a notification forever.
TEST(CommunicatorTest, AnExecutorStartedDuringABlockingCallGetsTheToken) {
  auto statuses = on_loopback(2, "flat", [&](Communicator& comm) -> Status {
    CommunicatorTestPeer::return_token_plainly(comm);
    const CallOptions queued_call{std::chrono::seconds(20)};
    CallOptions blocking = queued_call;
    blocking.blocking = true;
    float first = static_cast<float>(comm.rank() + 1);           // summed: 3
    float second = 10.0f * static_cast<float>(comm.rank() + 1);  // summed: 30
    if (comm.rank() == 1) {
      // Late, so rank 0's blocking call holds its token for a while; then the same two calls.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      COHORT_RETURN_IF_ERROR(
          comm.allreduce(&first, &first, 1, DataType::kFloat32, ReduceOp::kSum, blocking)->error());
      COHORT_RETURN_IF_ERROR(
          comm.allreduce(&second, &second, 1, DataType::kFloat32, ReduceOp::kSum, queued_call)->wait());
    } else {
      Status blocking_status;
      std::thread caller([&] {
        blocking_status =
            comm.allreduce(&first, &first, 1, DataType::kFloat32, ReduceOp::kSum, blocking)->error();
      });
      // The asynchronous call only once the blocking one runs (holds the token), so both ranks
      // issue them in the same order.
      const Clock::time_point give_up = Clock::now() + std::chrono::seconds(10);
      while (comm.flight_recorder_dump().find("#0 allreduce f32 x 1, sum: RUNNING") ==
             std::string::npos) {
        if (Clock::now() > give_up) {
          caller.join();
          return internal_error("the blocking allreduce never showed as running:\n{}",
                                comm.flight_recorder_dump());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      Status queued =
          comm.allreduce(&second, &second, 1, DataType::kFloat32, ReduceOp::kSum, queued_call)->wait();
      caller.join();
      COHORT_RETURN_IF_ERROR(blocking_status);
      COHORT_RETURN_IF_ERROR(queued);
    }
    if (first != 3.0f || second != 30.0f) {
      return internal_error("the calls gave {} and {}, not 3 and 30 (out of order?)", first, second);
    }
    return ok_status();
  }, nodes_of(2));
  EXPECT_EQ(failures(statuses), "");
}

TEST(CommunicatorTest, BlockedTimeCountsWaitsOnCollectivesAsyncAndBlocking) {
  constexpr auto kLate = std::chrono::milliseconds(300);
  auto statuses = on_loopback(2, "flat", [&](Communicator& comm) -> Status {
    if (comm.blocked_time().count() != 0) return internal_error("blocked {} ns before any call", comm.blocked_time().count());
    float x = 1;
    // Rank 1 comes late twice: rank 0 waits about kLate in wait() and then in a blocking call.
    if (comm.rank() == 1) std::this_thread::sleep_for(kLate);
    const auto start = Clock::now();
    COHORT_RETURN_IF_ERROR(comm.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum)->wait());
    if (comm.rank() == 1) std::this_thread::sleep_for(kLate);
    CallOptions blocking;
    blocking.blocking = true;
    COHORT_RETURN_IF_ERROR(comm.allreduce(&x, &x, 1, DataType::kFloat32, ReduceOp::kSum, blocking)->error());
    const auto elapsed = Clock::now() - start;
    if (comm.rank() == 0 && comm.blocked_time() < 2 * kLate - std::chrono::milliseconds(100))
      return internal_error("rank 0 blocked only {} ns while its peer came {} ms late twice",
                            comm.blocked_time().count(), kLate.count());
    if (comm.blocked_time() > elapsed)
      return internal_error("blocked {} ns, more than the {} ns the calls took", comm.blocked_time().count(),
                            std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count());
    return ok_status();
  }, nodes_of(2));
  EXPECT_EQ(failures(statuses), "");
}

}  // namespace
}  // namespace cohort::comm
