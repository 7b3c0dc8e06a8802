// worker/distributed with ranks as real processes over UCX on 127.0.0.1, bootstrapped through a
// TcpStore served by the test on an ephemeral port: the send/recv header protocol across
// processes, collectives with per-rank shapes, object collectives, monitored_barrier with a rank
// that exits, and a SIGKILLed rank failing its peers' async Works within their timeout. The
// parent never touches libtorch, so forking does not copy its thread pools half-initialised.

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"
#include "worker/distributed/process_group.h"
#include "worker/distributed/testing/expect_tensor.h"

namespace cohort::distributed {
namespace {

using comm::testing::failed_ranks;
using comm::testing::ProcessRanks;
using comm::testing::RankOutcome;
using testing::error_of;
using testing::expect_contains;
using testing::expect_equal;
using namespace std::chrono_literals;

// The whole run of one multi-process case; children left past it are SIGKILLed.
constexpr Duration kTestDeadline = 120s;
constexpr Duration kBootstrapTimeout = 30s;
// Per operation: a broken case fails well before kTestDeadline.
constexpr Duration kOpTimeout = 30s;

class ProcessGroupProcessTest : public ::testing::Test {
 protected:
  // Forks `size` ranks; each builds a flat communicator over UCX and runs body(comm), whose
  // exception fails the rank. Returns every rank's outcome.
  std::vector<RankOutcome> run(int size, const std::function<void(Communicator& comm)>& body) {
    comm::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    auto server = comm::TcpStoreServer::start(options);
    if (!server.ok()) {
      ADD_FAILURE() << "store server: " << server.status().to_string();
      return {};
    }
    int port = (*server)->port();
    ProcessRanks ranks(dir_.path());
    ranks.fork_ranks(size, [&](int rank) -> Status {
      at::set_num_threads(1);  // the ranks share the machine's cores
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<comm::TcpStore> store,
                              comm::TcpStore::connect("127.0.0.1", port, kBootstrapTimeout));
      comm::Bootstrap boot;
      boot.store = std::move(store);
      boot.rank = rank;
      boot.world_size = size;
      boot.node_id = "node0";
      COHORT_ASSIGN_OR_RETURN(auto world, comm::create_world(boot, kBootstrapTimeout));
      comm::CommunicatorOptions comm_options;
      comm_options.timeout = kOpTimeout;
      COHORT_ASSIGN_OR_RETURN(auto comm, comm::create_communicator("flat", world, comm_options));
      try {
        body(*comm);
      } catch (const std::exception& e) {
        return internal_error("rank {} threw: {}", rank, e.what());
      }
      return ok_status();
    });
    return ranks.wait_all(kTestDeadline);
  }

  coordinator::testing::TempDir dir_;
};

TEST_F(ProcessGroupProcessTest, SendRecvExchangeShapesAcrossProcesses) {
  for (int size : {2, 3}) {
    auto outcomes = run(size, [](Communicator& comm) {
      const int rank = comm.rank(), size = comm.size();
      const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
      // A ring of tensors whose shape and dtype only the sender knows.
      at::Tensor mine = at::arange((rank + 1) * 6, at::kDouble).reshape({rank + 1, 2, 3}).add(rank);
      auto sent = isend(comm, mine.transpose(1, 2), next, 4);
      at::Tensor got = recv(comm, prev, 4);
      sent->wait();
      expect_equal(
          got, at::arange((prev + 1) * 6, at::kDouble).reshape({prev + 1, 2, 3}).add(prev).transpose(1, 2),
          "shape-less recv");
      // In place into a tensor of another dtype (the same bytes, so the data transfer itself
      // succeeds): the header makes it an error naming both sides, on the receiver.
      if (rank == 0) {
        send(comm, at::ones({4}), 1, 5);
      } else if (rank == 1) {
        expect_contains(error_of([&] { recv(comm, at::zeros({4}, at::kInt), 0, 5); }, "mismatch"),
                        "the sender sent Float [4] but this rank posted Int [4]", "mismatch");
      }
    });
    EXPECT_EQ(failed_ranks(outcomes), "") << "size " << size;
  }
}

TEST_F(ProcessGroupProcessTest, CollectivesWithPerRankShapesAndAsyncWorks) {
  auto outcomes = run(3, [](Communicator& comm) {
    const int rank = comm.rank(), size = comm.size();
    std::vector<at::Tensor> list;
    for (int r = 0; r < size; ++r) list.push_back(at::zeros({r + 1}));
    auto work = all_gather(comm, list, at::full({rank + 1}, rank * 1.0), {.async_op = true, .timeout = 10s});
    at::Tensor t = at::ones({2, 3}).t();  // non-contiguous
    all_reduce(comm, t, ReduceOp::kSum);
    work->wait();
    for (int r = 0; r < size; ++r) expect_equal(list[r], at::full({r + 1}, r * 1.0), "all_gather");
    expect_equal(t, at::full({3, 2}, 3.0), "all_reduce");
    std::vector<int64_t> in_splits = {1, 2, 3}, out_splits = {rank + 1, rank + 1, rank + 1};
    at::Tensor out = at::zeros({3 * (rank + 1)});
    all_to_all_single(comm, out, at::full({6}, rank * 1.0), out_splits, in_splits);
    for (int q = 0; q < size; ++q) {
      expect_equal(out.narrow(0, q * (rank + 1), rank + 1), at::full({rank + 1}, q * 1.0),
                   "all_to_all_single");
    }
    monitored_barrier(comm, 10s);
  });
  EXPECT_EQ(failed_ranks(outcomes), "");
}

TEST_F(ProcessGroupProcessTest, ObjectCollectivesCarryPickledValues) {
  auto outcomes = run(3, [](Communicator& comm) {
    const int rank = comm.rank();
    std::vector<c10::IValue> list;
    if (rank == 1) list = {c10::IValue("foo"), c10::IValue(at::arange(4)), c10::IValue(2.5)};
    broadcast_object_list(comm, list, 1);
    if (list.size() != 3 || list[0].toStringRef() != "foo" || list[2].toDouble() != 2.5) {
      throw std::runtime_error("broadcast_object_list");
    }
    expect_equal(list[1].toTensor(), at::arange(4), "pickled tensor");
    if (rank == 0) send_obj(comm, c10::IValue(std::vector<int64_t>{7, 8, 9}), 2, 1);
    if (rank == 2 && recv_obj(comm, 0, 1).toIntVector() != std::vector<int64_t>{7, 8, 9}) {
      throw std::runtime_error("recv_obj");
    }
  });
  EXPECT_EQ(failed_ranks(outcomes), "");
}

TEST_F(ProcessGroupProcessTest, MonitoredBarrierNamesARankThatExited) {
  auto outcomes = run(3, [](Communicator& comm) {
    if (comm.rank() == 2) return;  // exits without arriving
    std::string error = error_of([&] { monitored_barrier(comm, 2s, true); }, "monitored_barrier");
    expect_contains(error, comm.rank() == 0 ? "rank 2 did not arrive within 2.0 s" : "rank 0 found 1 rank(s)",
                    "monitored_barrier");
  });
  EXPECT_EQ(failed_ranks(outcomes), "");
}

TEST_F(ProcessGroupProcessTest, ASigkilledRankFailsItsPeersAsyncWorkWithinItsTimeout) {
  auto outcomes = run(3, [](Communicator& comm) {
    if (comm.rank() == 1) raise(SIGKILL);
    at::Tensor t = at::ones({1024});
    auto start = std::chrono::steady_clock::now();
    auto work = all_reduce(comm, t, ReduceOp::kSum, {.async_op = true, .timeout = 2s});
    std::string error = error_of([&] { work->wait(); }, "all_reduce with a dead rank");
    expect_contains(error, "all_reduce", "error");
    if (!work->is_completed() || work->exception() == nullptr) throw std::runtime_error("no exception");
    if (std::chrono::steady_clock::now() - start > 6s) throw std::runtime_error("took over 3x the timeout");
  });
  ASSERT_EQ(outcomes.size(), 3u);
  EXPECT_EQ(outcomes[1].signal, SIGKILL);
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].message;
  EXPECT_EQ(outcomes[2].exit_code, 0) << outcomes[2].message;
}

}  // namespace
}  // namespace cohort::distributed
