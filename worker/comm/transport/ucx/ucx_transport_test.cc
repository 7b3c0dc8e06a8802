#include "worker/comm/transport/ucx/ucx_transport.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/store/file_store.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/store/store_test_util.h"
#include "worker/comm/testing/rank_threads.h"

extern char** environ;

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

#define ASSERT_OK(expr)                               \
  do {                                                \
    ::cohort::Status status_ = (expr);                \
    ASSERT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)
#define EXPECT_OK(expr)                               \
  do {                                                \
    ::cohort::Status status_ = (expr);                \
    EXPECT_TRUE(status_.ok()) << status_.to_string(); \
  } while (0)

// Generous per-transfer limit for tests that expect success on a loaded 2-core machine.
constexpr Duration kTestTimeout = seconds(20);

UcxOptions test_options() {
  UcxOptions options;
  options.connect_timeout = seconds(30);
  return options;
}

// Creates `size` connected transports, one per rank, as the ranks of one in-process job do:
// concurrently, since create() waits for every peer's address.
std::vector<std::unique_ptr<UcxTransport>> connect_ranks(int size,
                                                         const UcxOptions& options = test_options()) {
  HashStore store;
  std::vector<std::unique_ptr<UcxTransport>> transports(size);
  auto statuses = testing::run_ranks(size, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(transports[rank], UcxTransport::create(store, rank, size, options));
    return ok_status();
  });
  EXPECT_EQ(testing::failures(statuses), "");
  return transports;
}

// Waits for every work, polling them in turn. Tests that hold several ranks in one thread need
// this: UCX moves data only while someone progresses each rank's worker (a rendezvous send makes
// no progress while only its receiver is waited on), and is_completed() progresses a work's own
// transport. Returns the first failure, or DEADLINE_EXCEEDED naming the first unfinished work.
Status wait_all(const std::vector<std::shared_ptr<TransportWork>>& works, Duration timeout = kTestTimeout) {
  Deadline deadline = Deadline::after(timeout);
  for (;;) {
    bool all_done = true;
    for (const auto& work : works) all_done = work->is_completed() && all_done;
    if (all_done) break;
    if (deadline.expired()) {
      for (size_t i = 0; i < works.size(); ++i) {
        if (!works[i]->is_completed())
          return deadline_exceeded_error("work {} still pending after {}", i, format_duration(timeout));
      }
    }
  }
  for (const auto& work : works) COHORT_RETURN_IF_ERROR(work->error());
  return ok_status();
}

// Cancels the works it holds when it goes out of scope, so a rank that returns early with an
// error never leaves UCX writing into buffers that die with the scope. Declare after the buffers.
class CancelOnExit {
 public:
  explicit CancelOnExit(std::vector<std::shared_ptr<TransportWork>>* works) : works_(works) {}
  ~CancelOnExit() {
    for (auto& work : *works_) work->cancel(cancelled_error("test scope ended"));
  }

 private:
  std::vector<std::shared_ptr<TransportWork>>* works_;
};

// A byte pattern unique to (source, destination, index) so misdelivered messages show.
uint8_t pattern(int src, int dst, int index, size_t offset) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + index * 7 + offset * 13);
}

std::vector<uint8_t> make_message(int src, int dst, int index, size_t bytes) {
  std::vector<uint8_t> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = pattern(src, dst, index, i);
  return data;
}

Status check_message(const std::vector<uint8_t>& got, int src, int dst, int index) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != pattern(src, dst, index, i)) {
      return data_loss_error("message {} from rank {} to rank {}: byte {} of {} is {}, expected {}", index,
                             src, dst, i, got.size(), got[i], pattern(src, dst, index, i));
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Ranks as threads of this process.

TEST(UcxTransportTest, PingPong) {
  auto transports = connect_ranks(2);
  ASSERT_EQ(transports.size(), 2u);
  EXPECT_EQ(transports[0]->name(), "ucx");
  EXPECT_EQ(transports[1]->rank(), 1);
  EXPECT_EQ(transports[1]->size(), 2);
  constexpr int kRounds = 200;
  auto statuses = testing::run_ranks(2, [&](int rank) -> Status {
    Transport& t = *transports[rank];
    int peer = 1 - rank;
    for (int round = 0; round < kRounds; ++round) {
      int64_t out = round * 10 + rank, in = -1;
      if (rank == 0) {
        COHORT_RETURN_IF_ERROR(t.isend(peer, 1, &out, sizeof(out))->wait(kTestTimeout));
        auto recv = t.irecv(peer, 1, &in, sizeof(in));
        COHORT_RETURN_IF_ERROR(recv->wait(kTestTimeout));
        if (in != round * 10 + 1 || recv->received_bytes() != sizeof(in)) {
          return internal_error("round {}: rank 0 got {} ({} bytes)", round, in, recv->received_bytes());
        }
      } else {
        COHORT_RETURN_IF_ERROR(t.irecv(peer, 1, &in, sizeof(in))->wait(kTestTimeout));
        if (in != round * 10) return internal_error("round {}: rank 1 got {}", round, in);
        COHORT_RETURN_IF_ERROR(t.isend(peer, 1, &out, sizeof(out))->wait(kTestTimeout));
      }
    }
    return ok_status();
  });
  EXPECT_EQ(testing::failures(statuses), "");
}

TEST(UcxTransportTest, MatchesFifoPerTagAndSeparatesTags) {
  auto transports = connect_ranks(2);
  Transport& t0 = *transports[0];
  Transport& t1 = *transports[1];
  int a = 1, b = 2, c = 3;
  auto s1 = t0.isend(1, 5, &a, 4);
  auto s2 = t0.isend(1, 5, &b, 4);
  auto s3 = t0.isend(1, 6, &c, 4);
  int r1 = 0, r2 = 0, r3 = 0;
  auto q3 = t1.irecv(0, 6, &r3, 4);
  auto q1 = t1.irecv(0, 5, &r1, 4);
  auto q2 = t1.irecv(0, 5, &r2, 4);
  ASSERT_OK(wait_all({q1, q2, q3, s1, s2, s3}));
  EXPECT_EQ(r1, 1);
  EXPECT_EQ(r2, 2);
  EXPECT_EQ(r3, 3);
  // The largest usable tag round-trips (the rank bits below it are framing).
  uint64_t big_tag = kTransportTagMask;
  int d = 4, r4 = 0;
  auto q4 = t1.irecv(0, big_tag, &r4, 4);
  ASSERT_OK(wait_all({q4, t0.isend(1, big_tag, &d, 4)}));
  EXPECT_EQ(r4, 4);
}

// Every rank sends kMessages to every other rank, reusing a few tags, with sizes from a byte to
// past the rendezvous threshold; half the ranks post their receives first. Checks FIFO matching
// and contents under load, for odd and even group sizes.
TEST(UcxTransportTest, ManyConcurrentTransfers) {
  for (int size : {3, 5}) {
    auto transports = connect_ranks(size);
    constexpr int kMessages = 24;
    auto bytes_of = [](int index) { return static_cast<size_t>((index * 7919) % 200'000 + 1); };
    auto statuses = testing::run_ranks(size, [&](int rank) -> Status {
      Transport& t = *transports[rank];
      std::vector<std::vector<uint8_t>> outgoing, incoming;
      std::vector<std::shared_ptr<TransportWork>> sends, recvs;
      std::vector<std::pair<int, int>> recv_ids;  // (source, index)
      CancelOnExit cancel_sends(&sends), cancel_recvs(&recvs);
      auto post_recvs = [&] {
        for (int src = 0; src < size; ++src) {
          if (src == rank) continue;
          for (int i = 0; i < kMessages; ++i) {
            incoming.emplace_back(bytes_of(i));
            recvs.push_back(t.irecv(src, i % 3, incoming.back().data(), incoming.back().size()));
            recv_ids.emplace_back(src, i);
          }
        }
      };
      incoming.reserve(size * kMessages);
      outgoing.reserve(size * kMessages);
      if (rank % 2 == 0) post_recvs();
      for (int dst = 0; dst < size; ++dst) {
        if (dst == rank) continue;
        for (int i = 0; i < kMessages; ++i) {
          outgoing.push_back(make_message(rank, dst, i, bytes_of(i)));
          sends.push_back(t.isend(dst, i % 3, outgoing.back().data(), outgoing.back().size()));
        }
      }
      if (rank % 2 == 1) post_recvs();
      for (auto& w : sends) COHORT_RETURN_IF_ERROR(w->wait(kTestTimeout));
      for (size_t k = 0; k < recvs.size(); ++k) {
        COHORT_RETURN_IF_ERROR(recvs[k]->wait(kTestTimeout));
        auto [src, index] = recv_ids[k];
        if (recvs[k]->received_bytes() != bytes_of(index)) {
          return internal_error("message {} from rank {}: {} bytes", index, src, recvs[k]->received_bytes());
        }
        COHORT_RETURN_IF_ERROR(check_message(incoming[k], src, rank, index));
      }
      return ok_status();
    });
    EXPECT_EQ(testing::failures(statuses), "") << "size " << size;
    if (!testing::failures(statuses).empty()) {
      for (auto& t : transports) std::printf("%s", t->describe_pending().c_str());
    }
  }
}

TEST(UcxTransportTest, ZeroByteAndLargeMessages) {
  auto transports = connect_ranks(2);
  Transport& t0 = *transports[0];
  Transport& t1 = *transports[1];
  // Zero bytes, with and without a buffer, both orders of posting.
  auto early_recv = t1.irecv(0, 1, nullptr, 0);
  ASSERT_OK(wait_all({early_recv, t0.isend(1, 1, nullptr, 0)}));
  EXPECT_EQ(early_recv->received_bytes(), 0u);
  char unused = 'x';
  auto send0 = t0.isend(1, 2, &unused, 0);
  auto late_recv = t1.irecv(0, 2, &unused, 0);
  ASSERT_OK(wait_all({late_recv, send0}));
  EXPECT_EQ(unused, 'x');

  // 4 MiB + 3 bytes (rendezvous, odd length), into a larger buffer: received_bytes is exact.
  const size_t bytes = (size_t{4} << 20) + 3;
  std::vector<uint8_t> out = make_message(0, 1, 0, bytes);
  std::vector<uint8_t> in(bytes + 100, 0);
  auto recv = t1.irecv(0, 3, in.data(), in.size());
  auto send = t0.isend(1, 3, out.data(), out.size());
  ASSERT_OK(wait_all({recv, send}));
  EXPECT_EQ(recv->received_bytes(), bytes);
  in.resize(bytes);
  EXPECT_OK(check_message(in, 0, 1, 0));
}

TEST(UcxTransportTest, TruncationNamesBothSizes) {
  auto transports = connect_ranks(2);
  Transport& t0 = *transports[0];
  Transport& t1 = *transports[1];
  // Eager (small) and rendezvous (large) messages take different paths through UCX.
  for (auto [sent, posted] : {std::pair<size_t, size_t>{16, 8}, {size_t{1} << 20, size_t{1} << 19}}) {
    std::vector<uint8_t> big(sent, 1), small(posted, 0);
    auto r = t1.irecv(0, 1, small.data(), small.size());
    auto s = t0.isend(1, 1, big.data(), big.size());
    wait_all({r, s}).ignore_error();  // the sender's outcome is UCX's business
    Status status = r->wait(milliseconds(0));
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(fmt::format("{} bytes", sent)), std::string::npos) << status.message();
    EXPECT_NE(status.message().find(fmt::format("{}-byte", posted)), std::string::npos) << status.message();
  }
  // The pair still works afterwards.
  int value = 5, got = 0;
  auto r = t1.irecv(0, 2, &got, sizeof(got));
  ASSERT_OK(wait_all({r, t0.isend(1, 2, &value, sizeof(value))}));
  EXPECT_EQ(got, 5);
}

TEST(UcxTransportTest, CancelledReceiveLeavesBufferUntouched) {
  auto transports = connect_ranks(2);
  Transport& t0 = *transports[0];
  Transport& t1 = *transports[1];
  int first = 0, second = 0, value = 9;
  auto cancelled = t1.irecv(0, 3, &first, sizeof(first));
  EXPECT_EQ(cancelled->wait(milliseconds(20)).code(), StatusCode::kDeadlineExceeded);
  cancelled->cancel(cancelled_error("test gave up"));
  Status status = cancelled->wait(milliseconds(100));
  EXPECT_EQ(status.code(), StatusCode::kCancelled);
  EXPECT_EQ(status.message(), "test gave up");
  EXPECT_TRUE(cancelled->is_completed());
  cancelled->cancel(cancelled_error("again"));  // no-op once completed
  EXPECT_EQ(cancelled->error().message(), "test gave up");

  auto recv = t1.irecv(0, 3, &second, sizeof(second));
  ASSERT_OK(wait_all({recv, t0.isend(1, 3, &value, sizeof(value))}));
  EXPECT_EQ(first, 0);  // the cancelled buffer was never written
  EXPECT_EQ(second, 9);
}

TEST(UcxTransportTest, WaitTimesOutAndIsCompletedDoesNotBlock) {
  auto transports = connect_ranks(2);
  int buf = 0;
  auto recv = transports[0]->irecv(1, 4, &buf, sizeof(buf));
  EXPECT_FALSE(recv->is_completed());
  EXPECT_TRUE(recv->error().ok());
  auto start = Clock::now();
  Status status = recv->wait(milliseconds(300));
  auto waited = Clock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("receive from rank 1"), std::string::npos) << status.message();
  EXPECT_GE(waited, milliseconds(300));
  EXPECT_LT(waited, milliseconds(1500));
  EXPECT_FALSE(recv->is_completed());
  std::string pending = transports[0]->describe_pending();
  EXPECT_NE(pending.find("receive from rank 1, 4 bytes, tag 4"), std::string::npos) << pending;
  // A message arriving later completes it; is_completed() drives progress by itself.
  int value = 11;
  auto send = transports[1]->isend(0, 4, &value, sizeof(value));
  ASSERT_OK(wait_all({recv, send}));
  ASSERT_TRUE(recv->is_completed());
  EXPECT_TRUE(recv->error().ok());
  EXPECT_EQ(buf, 11);
}

TEST(UcxTransportTest, InvalidArgumentsAreErrorsAtTheCall) {
  auto transports = connect_ranks(2);
  Transport& t0 = *transports[0];
  int v = 0;
  EXPECT_EQ(t0.isend(5, 1, &v, 4)->wait(milliseconds(10)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t0.irecv(0, 1, &v, 4)->wait(milliseconds(10)).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(t0.isend(1, kTransportTagMask + 1, &v, 4)->wait(milliseconds(10)).code(),
            StatusCode::kInvalidArgument);
  EXPECT_TRUE(t0.peer_status(1).ok());
  EXPECT_EQ(t0.peer_status(7).code(), StatusCode::kInvalidArgument);
  HashStore store;
  EXPECT_EQ(UcxTransport::create(store, 2, 2).status().code(), StatusCode::kInvalidArgument);
}

TEST(UcxTransportTest, CreateNamesRanksThatNeverPublished) {
  HashStore store;
  UcxOptions options = test_options();
  options.connect_timeout = milliseconds(300);
  // Ranks 0 and 1 of 4 start; 2 and 3 never do.
  auto statuses = testing::run_ranks(2, [&](int rank) -> Status {
    auto transport = UcxTransport::create(store, rank, 4, options);
    return transport.status();
  });
  for (const Status& status : statuses) {
    EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.to_string();
    EXPECT_NE(status.message().find("rank(s) 2, 3"), std::string::npos) << status.message();
    EXPECT_NE(status.message().find("ucx/worker_address/"), std::string::npos) << status.message();
  }
}

// Several threads of each rank use one transport at once: each pair of threads ping-pongs on
// its own tag while the others progress the same worker.
TEST(UcxTransportTest, ThreadsShareOneTransport) {
  auto transports = connect_ranks(2);
  constexpr int kThreads = 4;
  constexpr int kRounds = 100;
  auto statuses = testing::run_ranks(2 * kThreads, [&](int id) -> Status {
    int rank = id % 2, thread = id / 2;
    Transport& t = *transports[rank];
    uint64_t tag = 100 + thread;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<uint8_t> out = make_message(rank, thread, round, 64 + thread * 3000);
      std::vector<uint8_t> in(out.size());
      std::vector<std::shared_ptr<TransportWork>> works = {t.irecv(1 - rank, tag, in.data(), in.size()),
                                                           t.isend(1 - rank, tag, out.data(), out.size())};
      CancelOnExit cancel(&works);
      COHORT_RETURN_IF_ERROR(works[1]->wait(kTestTimeout));
      COHORT_RETURN_IF_ERROR(works[0]->wait(kTestTimeout));
      COHORT_RETURN_IF_ERROR(check_message(in, 1 - rank, thread, round));
    }
    return ok_status();
  });
  EXPECT_EQ(testing::failures(statuses), "");
}

TEST(UcxTransportTest, RingOfSendrecvThroughCollectiveContext) {
  for (int size : {2, 3, 5}) {
    auto transports = connect_ranks(size);
    std::vector<int> ranks(size);
    std::iota(ranks.begin(), ranks.end(), 0);
    auto statuses = testing::run_ranks(size, [&](int rank) -> Status {
      CollectiveContext ctx(transports[rank].get(), &ranks, rank, collective_tag_base(0, 0),
                            Deadline::after(kTestTimeout), "ring");
      int64_t mine = rank * 10, got = -1;
      for (uint32_t step = 0; step < 50; ++step) {
        COHORT_RETURN_IF_ERROR(
            ctx.sendrecv((rank + 1) % size, &mine, 8, (rank + size - 1) % size, &got, 8, step));
        if (got != ((rank + size - 1) % size) * 10)
          return internal_error("rank {} step {} got {}", rank, step, got);
      }
      return ok_status();
    });
    EXPECT_EQ(testing::failures(statuses), "") << "size " << size;
  }
}

// A rank that posted a receive and went off to compute (no waits, no polls) still serves the
// rendezvous: its idle-progress thread pulls the data, so the sender's wait succeeds.
TEST(UcxTransportTest, IdleRankStillServesItsPeers) {
  auto transports = connect_ranks(2);
  const size_t bytes = size_t{4} << 20;
  std::vector<uint8_t> out = make_message(0, 1, 0, bytes), in(bytes);
  auto recv = transports[1]->irecv(0, 5, in.data(), in.size());  // never waited on
  ASSERT_OK(transports[0]->isend(1, 5, out.data(), out.size())->wait(kTestTimeout));
  // The receive completed in the background; only look, never progress.
  Deadline deadline = Deadline::after(kTestTimeout);
  while (recv->received_bytes() != bytes && recv->error().ok() && !deadline.expired()) {
    std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_OK(recv->error());
  ASSERT_EQ(recv->received_bytes(), bytes);
  EXPECT_OK(check_message(in, 0, 1, 0));

  // Without the thread only waiters progress: the same exchange stalls until the receiver waits.
  UcxOptions no_idle = test_options();
  no_idle.idle_progress_interval = Duration::zero();
  auto quiet = connect_ranks(2, no_idle);
  auto stalled_recv = quiet[1]->irecv(0, 5, in.data(), in.size());
  auto stalled_send = quiet[0]->isend(1, 5, out.data(), out.size());
  EXPECT_EQ(stalled_send->wait(milliseconds(300)).code(), StatusCode::kDeadlineExceeded);
  ASSERT_OK(wait_all({stalled_recv, stalled_send}));
}

TEST(UcxTransportTest, WorksOutliveTheTransport) {
  auto transports = connect_ranks(2);
  int buf = 0;
  auto pending = transports[0]->irecv(1, 9, &buf, sizeof(buf));
  auto start = Clock::now();
  transports[0].reset();
  EXPECT_LT(Clock::now() - start, seconds(3));  // close is bounded
  ASSERT_TRUE(pending->is_completed());
  EXPECT_EQ(pending->wait(milliseconds(10)).code(), StatusCode::kCancelled);
  pending->cancel(cancelled_error("late"));  // still safe
  transports[1].reset();
}

// ---------------------------------------------------------------------------------------------
// Ranks as processes: this binary re-executed with COHORT_UCX_TEST_* variables runs one rank of a
// scenario (UcxChildProcess.Main below) and reports through the FileStore the ranks share.

constexpr char kScenarioVar[] = "COHORT_UCX_TEST_SCENARIO";
constexpr char kRankVar[] = "COHORT_UCX_TEST_RANK";
constexpr char kSizeVar[] = "COHORT_UCX_TEST_SIZE";
constexpr char kStoreVar[] = "COHORT_UCX_TEST_STORE";

// The op timeout of the fault-injection scenarios: failures must show within 2x of it. Detection
// takes ~0.5 s (the keepalive interval) on a quiet machine; 2 s proved too tight while other
// builds loaded both cores of this VM, so the budget leaves room for that.
constexpr Duration kFaultOpTimeout = seconds(6);
constexpr Duration kChildTimeout = seconds(45);

// Child processes of one test; every one still alive is SIGKILLed and reaped on destruction.
class Children {
 public:
  ~Children() {
    for (pid_t pid : pids_) {
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
    }
  }

  // Starts rank `rank` of `scenario` (fork + exec of this test binary, so each child has a fresh
  // UCX, unaffected by the parent's threads).
  pid_t spawn(const std::string& scenario, int rank, int size, const std::string& store_path) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    env.push_back(fmt::format("{}={}", kScenarioVar, scenario));
    env.push_back(fmt::format("{}={}", kRankVar, rank));
    env.push_back(fmt::format("{}={}", kSizeVar, size));
    env.push_back(fmt::format("{}={}", kStoreVar, store_path));
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::string filter = "--gtest_filter=UcxChildProcess.Main";
    char exe[] = "/proc/self/exe";
    char* argv[] = {exe, filter.data(), nullptr};
    pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(exe, argv, envp.data());
      ::_exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }

  // The child's exit code, or -1 if it is still running after `timeout` (it is then killed).
  int wait(pid_t pid, Duration timeout) {
    Deadline deadline = Deadline::after(timeout);
    for (;;) {
      int status = 0;
      pid_t done = ::waitpid(pid, &status, WNOHANG);
      if (done == pid) {
        std::replace(pids_.begin(), pids_.end(), pid, pid_t{-1});
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (deadline.expired()) return -1;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }

 private:
  std::vector<pid_t> pids_;
};

// "code|elapsed_ms|message" records written by children under "result/<rank>".
struct ChildResult {
  StatusCode code = StatusCode::kUnknown;
  int64_t elapsed_ms = -1;
  std::string message;
};

std::string encode_result(const Status& status, Duration elapsed) {
  return fmt::format("{}|{}|{}", static_cast<int>(status.code()), elapsed.count(), status.message());
}

ChildResult decode_result(const std::string& text) {
  ChildResult result;
  size_t a = text.find('|'), b = text.find('|', a + 1);
  if (a == std::string::npos || b == std::string::npos) return result;
  result.code = static_cast<StatusCode>(std::stoi(text.substr(0, a)));
  result.elapsed_ms = std::stoll(text.substr(a + 1, b - a - 1));
  result.message = text.substr(b + 1);
  return result;
}

Duration since(Clock::time_point start) { return std::chrono::duration_cast<Duration>(Clock::now() - start); }

// Ring exchange through every rank, so all endpoints have carried traffic before faults start.
Status warm_up(Transport& t) {
  int size = t.size(), rank = t.rank();
  int64_t out = rank, in = -1;
  auto recv = t.irecv((rank + size - 1) % size, 1, &in, sizeof(in));
  auto send = t.isend((rank + 1) % size, 1, &out, sizeof(out));
  COHORT_RETURN_IF_ERROR(send->wait(kTestTimeout));
  COHORT_RETURN_IF_ERROR(recv->wait(kTestTimeout));
  if (in != (rank + size - 1) % size) return internal_error("warm-up: rank {} got {}", rank, in);
  return ok_status();
}

// One 8-byte exchange between ranks 0 and 1: proof that the survivors still talk.
Status ping_between_0_and_1(Transport& t) {
  int peer = 1 - t.rank();
  int64_t out = 42 + t.rank(), in = 0;
  auto recv = t.irecv(peer, 2, &in, sizeof(in));
  COHORT_RETURN_IF_ERROR(t.isend(peer, 2, &out, sizeof(out))->wait(kTestTimeout));
  COHORT_RETURN_IF_ERROR(recv->wait(kTestTimeout));
  if (in != 42 + peer) return internal_error("ping: rank {} got {}", t.rank(), in);
  return ok_status();
}

// Rank 2 of the fault scenarios: connected, then idle until the parent kills or stops it.
void idle_until_killed(Store& store, int rank) {
  store.set(fmt::format("ready/{}", rank), "1").ignore_error();
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(milliseconds(50));
}

// Ranks 0 and 1 of the fault scenarios: wait on a transfer with rank 2 (rank 0 a receive, rank 1
// a rendezvous-sized send), report how it ended, then check the survivors still work.
Status wait_on_rank_2(Store& store, Transport& t, bool cancel_after) {
  int rank = t.rank();
  std::vector<uint8_t> buffer(rank == 0 ? 8 : (size_t{4} << 20), 7);
  auto work =
      rank == 0 ? t.irecv(2, 7, buffer.data(), buffer.size()) : t.isend(2, 7, buffer.data(), buffer.size());
  COHORT_RETURN_IF_ERROR(store.set(fmt::format("posted/{}", rank), "1"));
  Clock::time_point start = Clock::now();
  Status status = work->wait(kFaultOpTimeout);
  Duration elapsed = since(start);
  if (cancel_after) {
    Clock::time_point cancel_start = Clock::now();
    work->cancel(cancelled_error("gave up"));
    COHORT_RETURN_IF_ERROR(
        store.set(fmt::format("cancel_ms/{}", rank), std::to_string(since(cancel_start).count())));
    if (!work->is_completed()) return internal_error("rank {}: work pending after cancel()", rank);
  }
  COHORT_RETURN_IF_ERROR(store.set(fmt::format("result/{}", rank), encode_result(status, elapsed)));
  COHORT_RETURN_IF_ERROR(store.set(fmt::format("peer_status/{}", rank), t.peer_status(2).to_string()));
  if (!cancel_after) {
    // Later transfers with the failed rank fail at once.
    int64_t v = 0;
    Status later = t.isend(2, 8, &v, sizeof(v))->wait(kFaultOpTimeout);
    COHORT_RETURN_IF_ERROR(store.set(fmt::format("later/{}", rank), later.to_string()));
  }
  COHORT_RETURN_IF_ERROR(ping_between_0_and_1(t));
  // Neither survivor exits (and closes its endpoints) before both have their ping: what an exit
  // does to the other's last receive is LastMessageOfAnExitedPeerIsStillDelivered's subject.
  COHORT_RETURN_IF_ERROR(store.set(fmt::format("pinged/{}", rank), "1"));
  return store.wait({"pinged/0", "pinged/1"}, kTestTimeout);
}

// Rank 0 measures 8-byte ping-pong latency and 4 MiB streaming bandwidth to rank 1.
Status measure(Store& store, Transport& t) {
  constexpr int kWarmup = 200, kRounds = 5000;
  constexpr size_t kBigBytes = size_t{4} << 20;
  constexpr int kBigMessages = 64, kWindow = 8;
  int rank = t.rank(), peer = 1 - rank;
  int64_t small = 0;
  Clock::time_point start;
  for (int i = 0; i < kWarmup + kRounds; ++i) {
    if (i == kWarmup) start = Clock::now();
    if (rank == 0) {
      COHORT_RETURN_IF_ERROR(t.isend(peer, 1, &small, 8)->wait(kTestTimeout));
      COHORT_RETURN_IF_ERROR(t.irecv(peer, 1, &small, 8)->wait(kTestTimeout));
    } else {
      COHORT_RETURN_IF_ERROR(t.irecv(peer, 1, &small, 8)->wait(kTestTimeout));
      COHORT_RETURN_IF_ERROR(t.isend(peer, 1, &small, 8)->wait(kTestTimeout));
    }
  }
  double latency_us =
      std::chrono::duration<double, std::micro>(Clock::now() - start).count() / (2.0 * kRounds);

  std::vector<uint8_t> big(kBigBytes, 3);
  int64_t ack = 0;
  start = Clock::now();
  for (int sent = 0; sent < kBigMessages; sent += kWindow) {
    std::vector<std::shared_ptr<TransportWork>> window;
    for (int i = 0; i < kWindow; ++i) {
      window.push_back(rank == 0 ? t.isend(peer, 2, big.data(), big.size())
                                 : t.irecv(peer, 2, big.data(), big.size()));
    }
    for (auto& w : window) COHORT_RETURN_IF_ERROR(w->wait(kTestTimeout));
  }
  if (rank == 0) {
    COHORT_RETURN_IF_ERROR(t.irecv(peer, 3, &ack, 8)->wait(kTestTimeout));
  } else {
    COHORT_RETURN_IF_ERROR(t.isend(peer, 3, &ack, 8)->wait(kTestTimeout));
  }
  double seconds_taken = std::chrono::duration<double>(Clock::now() - start).count();
  double bandwidth = kBigMessages * static_cast<double>(kBigBytes) / seconds_taken / 1e6;
  if (rank == 0) {
    COHORT_RETURN_IF_ERROR(store.set(
        "measure",
        fmt::format("8-byte one-way latency {:.2f} us, 4 MiB bandwidth {:.0f} MB/s", latency_us, bandwidth)));
    COHORT_RETURN_IF_ERROR(store.set("endpoint", dynamic_cast<UcxTransport&>(t).describe_endpoint(1)));
  }
  return ok_status();
}

// The "last_words" scenario. Rank 0 sends one message and exits at once, without closing its
// transport, as a program that finished (or crashed) right after its last send does. Rank 1 runs
// no progress until the parent has reaped rank 0. Rank 1 then learns of the death first, and
// only then posts the receive: the message rank 0 sent while alive must still be delivered.
Status last_words(Store& store, Transport& t) {
  int64_t value = 4242;
  if (t.rank() == 0) {
    COHORT_RETURN_IF_ERROR(store.wait({"go"}, kTestTimeout));
    COHORT_RETURN_IF_ERROR(t.isend(1, 9, &value, sizeof(value))->wait(kTestTimeout));
    std::fflush(nullptr);
    std::_Exit(0);
  }
  COHORT_RETURN_IF_ERROR(store.set("ready/1", "1"));
  COHORT_RETURN_IF_ERROR(store.wait({"reaped/0"}, kTestTimeout));
  // Let the keepalive interval pass, so the first progress call also finds rank 0 gone.
  std::this_thread::sleep_for(2 * kDefaultUcxKeepaliveInterval);
  // A receive rank 0 never sent runs progress until the death is noticed; that progress has also
  // taken rank 0's message off the FIFO.
  int64_t never = 0;
  Status noticed = t.irecv(0, 10, &never, sizeof(never))->wait(kFaultOpTimeout);
  if (noticed.code() != StatusCode::kUnavailable) {
    return internal_error("rank 1: waiting on a message the dead rank 0 never sent gave {}", noticed.to_string());
  }
  value = 0;
  Status status = t.irecv(0, 9, &value, sizeof(value))->wait(kFaultOpTimeout);
  COHORT_RETURN_IF_ERROR(store.set("result/1", encode_result(status, Duration::zero())));
  COHORT_RETURN_IF_ERROR(status);
  if (value != 4242) return internal_error("rank 1 received {} instead of 4242", value);
  return ok_status();
}

int run_child_rank(const std::string& scenario, int rank, int size, const std::string& store_path) {
  FileStore store(store_path);
  UcxOptions options = test_options();
  // No progress behind the test's back: rank 1 of "last_words" must not read the FIFO early.
  if (scenario == "last_words") options.idle_progress_interval = Duration::zero();
  auto transport = UcxTransport::create(store, rank, size, options);
  Status status = transport.status();
  if (status.ok()) status = warm_up(**transport);
  if (status.ok()) {
    if (scenario == "measure") {
      status = measure(store, **transport);
    } else if (scenario == "last_words") {
      status = last_words(store, **transport);
    } else if (rank == 2) {
      idle_until_killed(store, rank);
    } else {
      status = wait_on_rank_2(store, **transport, /*cancel_after=*/scenario == "stop");
    }
  }
  if (!status.ok()) {
    store.set(fmt::format("error/{}", rank), status.to_string()).ignore_error();
    fmt::print(stderr, "rank {}: {}\n", rank, status.to_string());
  }
  return status.ok() ? 0 : 1;
}

TEST(UcxChildProcess, Main) {
  const char* scenario = std::getenv(kScenarioVar);
  if (scenario == nullptr) GTEST_SKIP() << "runs only as a child of the process tests";
  int code = run_child_rank(scenario, std::atoi(std::getenv(kRankVar)), std::atoi(std::getenv(kSizeVar)),
                            std::getenv(kStoreVar));
  std::fflush(nullptr);
  std::_Exit(code);  // no gtest teardown or output files in a child
}

class UcxProcessTest : public ::testing::Test {
 protected:
  void kill_rank_2_and_expect_its_failure(const std::string& cause);

  std::string store_path() const { return dir_.file("store"); }
  FileStore& store() { return store_; }

  testing::TempDir dir_;
  FileStore store_{dir_.file("store")};
  Children children_;
};

TEST_F(UcxProcessTest, PingPongLatencyAndBandwidthBetweenTwoProcesses) {
  pid_t p0 = children_.spawn("measure", 0, 2, store_path());
  pid_t p1 = children_.spawn("measure", 1, 2, store_path());
  EXPECT_EQ(children_.wait(p0, kChildTimeout), 0);
  EXPECT_EQ(children_.wait(p1, kChildTimeout), 0);
  auto measured = store().get("measure", milliseconds(100));
  ASSERT_TRUE(measured.ok()) << measured.status().to_string();
  std::printf("[ UCX 2 processes ] %s\n", measured->c_str());
  auto endpoint = store().get("endpoint", milliseconds(100));
  if (endpoint.ok()) std::printf("%s\n", endpoint->c_str());
  RecordProperty("ucx_measure", *measured);
}

// SIGKILL rank 2 while rank 0 waits on a receive from it and rank 1 on a send to it: both fail
// with UNAVAILABLE naming rank 2 (and `cause`) well within 2x the op timeout, later transfers
// with rank 2 fail at once, and ranks 0 and 1 still talk to each other.
void UcxProcessTest::kill_rank_2_and_expect_its_failure(const std::string& cause) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) pids.push_back(children_.spawn("kill", rank, 3, store_path()));
  ASSERT_OK(store().wait({"posted/0", "posted/1", "ready/2"}, seconds(30)));
  ::kill(pids[2], SIGKILL);
  // Reap it at once, as a launcher does: over shared memory UCX's keepalive asks whether the
  // process still exists, and a zombie does.
  EXPECT_EQ(children_.wait(pids[2], kChildTimeout), 128 + SIGKILL);
  EXPECT_EQ(children_.wait(pids[0], kChildTimeout), 0);
  EXPECT_EQ(children_.wait(pids[1], kChildTimeout), 0);
  for (int rank = 0; rank < 2; ++rank) {
    auto error = store().get(fmt::format("error/{}", rank), milliseconds(1));
    EXPECT_FALSE(error.ok()) << "rank " << rank << ": " << *error;
    auto text = store().get(fmt::format("result/{}", rank), milliseconds(100));
    ASSERT_TRUE(text.ok()) << "rank " << rank;
    ChildResult result = decode_result(*text);
    EXPECT_EQ(result.code, StatusCode::kUnavailable) << "rank " << rank << ": " << *text;
    EXPECT_NE(result.message.find("rank 2"), std::string::npos) << result.message;
    EXPECT_NE(result.message.find(cause), std::string::npos) << result.message;
    EXPECT_LT(result.elapsed_ms, 2 * kFaultOpTimeout.count()) << "rank " << rank;
    auto peer_status = store().get(fmt::format("peer_status/{}", rank), milliseconds(100));
    EXPECT_NE(peer_status.value_or("").find("UNAVAILABLE"), std::string::npos) << peer_status.value_or("");
    auto later = store().get(fmt::format("later/{}", rank), milliseconds(100));
    EXPECT_NE(later.value_or("").find("UNAVAILABLE: peer rank 2 failed"), std::string::npos)
        << later.value_or("");
    std::printf("rank %d: %s after %lld ms\n", rank, result.message.c_str(),
                static_cast<long long>(result.elapsed_ms));
  }
}

TEST_F(UcxProcessTest, KilledPeerFailsPendingTransfersWithItsName) { kill_rank_2_and_expect_its_failure(""); }

// The same with UCX's keepalive off in the ranks (the environment wins over the transport's
// option), so only the transport's own check of the peer's process can tell: UCX keepalive
// covers only endpoints whose wireup completed, and a send to a rank killed before its side
// completed it once waited out the whole timeout under load (DEADLINE_EXCEEDED instead of
// UNAVAILABLE, a flake of KilledPeerFailsPendingTransfersWithItsName).
TEST_F(UcxProcessTest, KilledPeerOnThisHostIsFoundByItsProcessWithoutUcxKeepalive) {
  ASSERT_EQ(::setenv("UCX_KEEPALIVE_INTERVAL", "1000s", 1), 0);
  kill_rank_2_and_expect_its_failure("(pid ");
  ::unsetenv("UCX_KEEPALIVE_INTERVAL");
}

// SIGSTOP rank 2: the waits of ranks 0 and 1 time out cleanly (DEADLINE_EXCEEDED, not a peer
// failure) within about 2x the timeout, cancel() returns promptly, and ranks 0 and 1 still talk.
TEST_F(UcxProcessTest, StoppedPeerTimesOutCleanly) {
  std::vector<pid_t> pids;
  for (int rank = 0; rank < 3; ++rank) pids.push_back(children_.spawn("stop", rank, 3, store_path()));
  ASSERT_OK(store().wait({"posted/0", "posted/1", "ready/2"}, seconds(30)));
  ::kill(pids[2], SIGSTOP);
  EXPECT_EQ(children_.wait(pids[0], kChildTimeout), 0);
  EXPECT_EQ(children_.wait(pids[1], kChildTimeout), 0);
  ::kill(pids[2], SIGCONT);
  ::kill(pids[2], SIGKILL);
  for (int rank = 0; rank < 2; ++rank) {
    auto error = store().get(fmt::format("error/{}", rank), milliseconds(1));
    EXPECT_FALSE(error.ok()) << "rank " << rank << ": " << *error;
    auto text = store().get(fmt::format("result/{}", rank), milliseconds(100));
    ASSERT_TRUE(text.ok()) << "rank " << rank;
    ChildResult result = decode_result(*text);
    EXPECT_EQ(result.code, StatusCode::kDeadlineExceeded) << "rank " << rank << ": " << *text;
    EXPECT_GE(result.elapsed_ms, kFaultOpTimeout.count() - 1);
    EXPECT_LT(result.elapsed_ms, 2 * kFaultOpTimeout.count()) << "rank " << rank;
    auto cancel_ms = store().get(fmt::format("cancel_ms/{}", rank), milliseconds(100));
    ASSERT_TRUE(cancel_ms.ok());
    EXPECT_LT(std::stoll(*cancel_ms), 1000) << "rank " << rank;
    std::printf("rank %d: %s after %lld ms, cancel took %s ms\n", rank, result.message.c_str(),
                static_cast<long long>(result.elapsed_ms), cancel_ms->c_str());
  }
}

// A peer's last message arrives even when the peer exited before the receive was posted and UCX
// reports the peer's death in the same progress call that finds the message. (CI once failed
// StoppedPeerTimesOutCleanly this way: the survivors' final ping was lost when the faster one
// exited first.)
TEST_F(UcxProcessTest, LastMessageOfAnExitedPeerIsStillDelivered) {
  pid_t p0 = children_.spawn("last_words", 0, 2, store_path());
  pid_t p1 = children_.spawn("last_words", 1, 2, store_path());
  ASSERT_OK(store().wait({"ready/1"}, seconds(30)));
  ASSERT_OK(store().set("go", "1"));
  EXPECT_EQ(children_.wait(p0, kChildTimeout), 0);
  ASSERT_OK(store().set("reaped/0", "1"));
  EXPECT_EQ(children_.wait(p1, kChildTimeout), 0);
  auto error = store().get("error/1", milliseconds(1));
  EXPECT_FALSE(error.ok()) << *error;
}

}  // namespace
}  // namespace cohort::comm
