// Ranks as real processes over UCX on 127.0.0.1, bootstrapped through a TcpStore (served by the
// test on an ephemeral port) or a FileStore (file:// init in a temporary directory), with fault
// injection: a SIGKILLed rank makes the others fail fast naming it; a SIGSTOPped rank makes them
// time out cleanly.

#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"
#include "worker/comm/testing/collective_matrix.h"

namespace cohort::comm {
namespace {

using testing::failed_ranks;
using testing::ProcessRanks;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kTestDeadline = seconds(120);

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/cohort-comm-test-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// The world of one child rank: a TcpStore client of the test's server, `ranks_per_node` ranks per
// simulated node.
StatusOr<std::shared_ptr<CommWorld>> child_world(int port, int rank, int size, int ranks_per_node) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store, TcpStore::connect("127.0.0.1", port, seconds(30)));
  Bootstrap boot;
  boot.store = std::move(store);
  boot.rank = rank;
  boot.world_size = size;
  boot.node_id = "node" + std::to_string(rank / ranks_per_node);
  return create_world(boot, seconds(30));
}

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = TcpStoreServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
  }
  int port() const { return server_->port(); }

  TempDir dir_;
  std::unique_ptr<TcpStoreServer> server_;
};

TEST_F(ProcessTest, EveryKindOnTwoSimulatedNodesOfTwoRanks) {
  for (const std::string kind : {"naive", "flat", "hierarchical", "two_dimensional"}) {
    ProcessRanks ranks(dir_.path());
    int port = this->port();
    ranks.fork_ranks(4, [&](int rank) -> Status {
      COHORT_ASSIGN_OR_RETURN(auto world, child_world(port, rank, 4, 2));
      // Each kind gets its own run of the store keys: a fresh prefix per kind is not needed
      // because every rank reads only keys of this job, but transports differ per run.
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator(kind, world));
      if (comm->inter_size() != 2 || comm->intra_size() != 2) return internal_error("layout");
      COHORT_RETURN_IF_ERROR(testing::check_allreduce(*comm, 100003));
      return testing::run_collective_matrix(*comm, {0, 7, 1000});
    });
    auto outcomes = ranks.wait_all(kTestDeadline);
    EXPECT_EQ(failed_ranks(outcomes), "") << kind;
    // The next kind runs on a fresh store so UCX address keys do not collide.
    server_.reset();
    SetUp();
  }
}

TEST_F(ProcessTest, SplitAcrossProcesses) {
  ProcessRanks ranks(dir_.path());
  int port = this->port();
  ranks.fork_ranks(4, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto world, child_world(port, rank, 4, 4));
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", world));
    COHORT_ASSIGN_OR_RETURN(auto sub, comm->split(rank % 2, rank));
    COHORT_ASSIGN_OR_RETURN(double sum, sub->allreduce_obj(rank));
    return sum == (rank % 2 == 0 ? 2 : 4) ? ok_status() : internal_error("sum {}", sum);
  });
  EXPECT_EQ(failed_ranks(ranks.wait_all(kTestDeadline)), "");
}

TEST_F(ProcessTest, FileInitMethodBuildsACommunicator) {
  ProcessRanks ranks(dir_.path());
  std::string store = dir_.path() + "/file_store";
  ranks.fork_ranks(3, [&](int rank) -> Status {
    InitOptions init = InitOptions::from_url("file://" + store + "?rank=" + std::to_string(rank) + "&world_size=3");
    init.timeout = seconds(30);
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", init));
    if (comm->rank() != rank || comm->size() != 3) return internal_error("rank/size");
    return testing::check_allreduce(*comm, 1000);
  });
  EXPECT_EQ(failed_ranks(ranks.wait_all(kTestDeadline)), "");
}

// file:// without ranks (assigned in arrival order) on a file an earlier job left behind, then
// COHORT_DEBUG=detail's point-to-point check over UCX: a receive that posted another size and
// dtype than the send fails naming both sides, and so does the send; a matching pair still moves
// its data.
TEST_F(ProcessTest, FileInitAssignsRanksAndDetailChecksPointToPointOverUcx) {
  std::string store = dir_.path() + "/file_store_assigned";
  for (int job = 0; job < 2; ++job) {
    ProcessRanks ranks(dir_.path());
    ranks.fork_ranks(2, [&](int) -> Status {
      InitOptions init = InitOptions::from_url("file://" + store + "?world_size=2");
      init.timeout = seconds(30);
      init.env = environment_from({});  // no RANK from the test's environment
      CommunicatorOptions options;
      options.debug_checks = true;
      options.timeout = seconds(20);
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", init, options));
      COHORT_ASSIGN_OR_RETURN(double rank_sum, comm->allreduce_obj(comm->rank()));
      if (comm->size() != 2 || rank_sum != 1)
        return internal_error("ranks {} of {}", comm->rank(), comm->size());
      std::vector<uint8_t> buffer(64, 0);
      if (comm->rank() == 0) {
        // The send fails too, from the receive's reply (drained, not left hanging).
        Status sent = comm->send(buffer.data(), 4, DataType::kInt64, 1, 5);
        if (sent.code() != StatusCode::kInvalidArgument ||
            sent.message().find("rank 0 sent i64 x 4 (32 bytes, tag 5) to rank 1, but rank 1 posted recv of f32 "
                                "x 2 (8 bytes, tag 5)") == std::string::npos) {
          return internal_error("expected the send's mismatch naming both sides, got {}", sent.to_string());
        }
      } else {
        Status status = comm->recv(buffer.data(), 2, DataType::kFloat32, 0, 5);
        if (status.code() != StatusCode::kInvalidArgument ||
            status.message().find(
                "rank 1 posted recv of f32 x 2 (8 bytes, tag 5) from rank 0, but rank 0's send "
                "is i64 x 4 (32 bytes, tag 5)") == std::string::npos) {
          return internal_error("expected the mismatch naming both sides, got {}", status.to_string());
        }
      }
      std::vector<int32_t> x(3, comm->rank() == 0 ? 42 : 0);
      if (comm->rank() == 0) return comm->send(x.data(), 3, DataType::kInt32, 1, 6);
      COHORT_RETURN_IF_ERROR(comm->recv(x.data(), 3, DataType::kInt32, 0, 6));
      return x == std::vector<int32_t>(3, 42) ? ok_status() : internal_error("received {}", x[0]);
    });
    EXPECT_EQ(failed_ranks(ranks.wait_all(kTestDeadline)), "") << "job " << job;
  }
}

TEST_F(ProcessTest, KilledRankMakesTheOthersFailNamingItWithinTwiceTheTimeout) {
  ProcessRanks ranks(dir_.path());
  int port = this->port();
  constexpr Duration kTimeout = seconds(3);
  ranks.fork_ranks(3, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto world, child_world(port, rank, 3, 3));
    CommunicatorOptions options;
    options.timeout = kTimeout;
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", world, options));
    std::vector<float> x(1 << 16, 1.0f);
    COHORT_RETURN_IF_ERROR(comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait());
    if (rank == 2) raise(SIGKILL);
    auto start = Clock::now();
    Status status = comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    auto waited = Clock::now() - start;
    if (status.ok()) return internal_error("allreduce succeeded without rank 2");
    // Named as the peer waited on, or in the list of ranks the transport knows are dead.
    const std::string& text = status.message();
    size_t list = text.find("known to have failed: ");
    bool listed = list != std::string::npos &&
                  (" " + text.substr(list + 21, text.find(']', list) - list - 21) + ",").find(" 2,") != std::string::npos;
    if (text.find("rank 2") == std::string::npos && !listed) {
      return internal_error("rank 2 not named: {}", status.to_string());
    }
    if (waited > 2 * kTimeout) return internal_error("took {} ms", std::chrono::duration_cast<milliseconds>(waited).count());
    return ok_status();
  });
  auto outcomes = ranks.wait_all(kTestDeadline);
  EXPECT_EQ(outcomes[2].signal, SIGKILL);
  for (int r : {0, 1}) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].message;
}

TEST_F(ProcessTest, StoppedRankMakesTheOthersTimeOutCleanly) {
  ProcessRanks ranks(dir_.path());
  int port = this->port();
  constexpr Duration kTimeout = seconds(2);
  ranks.fork_ranks(3, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto world, child_world(port, rank, 3, 3));
    CommunicatorOptions options;
    options.timeout = kTimeout;
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", world, options));
    std::vector<float> x(1 << 16, 1.0f);
    COHORT_RETURN_IF_ERROR(comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait());
    if (rank == 2) {
      raise(SIGSTOP);
      return ok_status();
    }
    auto start = Clock::now();
    Status status = comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait();
    auto waited = Clock::now() - start;
    if (status.code() != StatusCode::kDeadlineExceeded && status.code() != StatusCode::kUnavailable) {
      return internal_error("expected a timeout, got {}", status.to_string());
    }
    if (waited > 2 * kTimeout + seconds(1)) {
      return internal_error("took {} ms", std::chrono::duration_cast<milliseconds>(waited).count());
    }
    return ok_status();
  });
  // Release the stopped rank once the others have had time to fail.
  std::this_thread::sleep_for(kTimeout * 3);
  kill(ranks.pid(2), SIGKILL);
  auto outcomes = ranks.wait_all(kTestDeadline);
  for (int r : {0, 1}) EXPECT_EQ(outcomes[r].exit_code, 0) << outcomes[r].message;
}

}  // namespace
}  // namespace cohort::comm
