// Point-to-point operations in the flight recorder and in the COHORT_DEBUG=detail check, and the
// recorders dumped as a Chrome trace on demand (a call; a signal, in a forked process), parsed
// back with python3's json module. Ranks are threads over the loopback transport.

#include "worker/comm/flight_recorder_registry.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/communicator_factory.h"
#include "worker/comm/store/store_test_util.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::comm {
namespace {

using testing::failures;
using testing::loopback_worlds;
using testing::run_ranks;

Status expect_contains(const std::string& text, const std::string& part, const char* what) {
  if (text.find(part) != std::string::npos) return ok_status();
  return internal_error("{} lacks {:?}:\n{}", what, part, text);
}

// Runs python3 on `script` with `path`; its stdout, or the failure.
StatusOr<std::string> run_python(const std::string& script, const std::string& path) {
  testing::TempDir dir;
  const std::string script_path = dir.file("check.py");
  std::ofstream(script_path) << script;
  FILE* pipe = ::popen(fmt::format("python3 {} {} 2>&1", script_path, path).c_str(), "r");
  if (pipe == nullptr) return internal_error("popen python3 failed");
  std::string out;
  char buffer[4096];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, n);
  int rc = ::pclose(pipe);
  if (rc != 0) return internal_error("python3 check failed ({}):\n{}", rc, out);
  return out;
}

// Parses a dump as JSON and checks the Trace Event Format's shape; prints one line per distinct
// complete event "pid name cat state" and per thread name "thread pid tid name".
constexpr const char* kTraceCheck = R"(
import json, sys
doc = json.load(open(sys.argv[1]))
events = doc["traceEvents"]
lines = set()
for e in events:
    assert e["ph"] in ("X", "M"), e
    assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
    if e["ph"] == "X":
        assert isinstance(e["ts"], int) and e["ts"] > 1500000000000000, e   # wall clock, microseconds
        assert isinstance(e["dur"], int) and e["dur"] >= 0, e
        lines.add("%d %s %s %s" % (e["pid"], e["name"], e["cat"], e["args"]["state"]))
    elif e["name"] == "thread_name":
        lines.add("thread %d %d %s" % (e["pid"], e["tid"], e["args"]["name"]))
for line in sorted(lines):
    print(line)
)";

// Operations of one lane of `recorder` (capacity 3): started and finished through the ring's
// lock (start/finish) or through the one-at-a-time lane (start_exclusive/finish_exclusive).
class Lane {
 public:
  Lane(FlightRecorder& recorder, bool exclusive) : recorder_(recorder), exclusive_(exclusive) {}
  uint64_t start(uint64_t sequence, const OpInfo& info) {
    return exclusive_ ? recorder_.start_exclusive(sequence, info, Clock::now()) : recorder_.start(sequence, info);
  }
  void finish(uint64_t id, const Status& status) {
    if (exclusive_) {
      recorder_.finish_exclusive(id, status, Clock::now());
    } else {
      recorder_.finish(id, status);
    }
  }

 private:
  FlightRecorder& recorder_;
  const bool exclusive_;
};

// The recorder keeps `capacity` slots a lane: the last operations stay, oldest first, a finish for
// an operation that fell out is ignored, and an OK outcome leaves no error behind in a reused
// slot. Leaves operation 3 running; returns its id.
uint64_t expect_window_keeps_the_last_operations(FlightRecorder& recorder, Lane lane) {
  std::vector<uint64_t> ids;
  for (uint64_t sequence = 0; sequence < 5; ++sequence) {
    OpInfo info;
    info.op = sequence % 2 == 0 ? "allreduce" : "broadcast";
    info.dtype = static_cast<int>(DataType::kFloat32);
    info.count = 8 * (sequence + 1);
    info.reduce_op = sequence % 2 == 0 ? static_cast<int>(ReduceOp::kMax) : -1;
    info.root = sequence % 2 == 0 ? -1 : 1;
    ids.push_back(lane.start(sequence, info));
    // Operation 1 fails; its slot is reused by operation 4, which succeeds.
    if (sequence != 3) lane.finish(ids.back(), sequence == 1 ? internal_error("boom") : ok_status());
  }
  lane.finish(ids[0], internal_error("late finish of an evicted operation"));
  const std::string dump = recorder.dump();
  EXPECT_EQ(dump.find("#0 "), std::string::npos) << dump;
  EXPECT_EQ(dump.find("#1 "), std::string::npos) << dump;
  EXPECT_EQ(dump.find("boom"), std::string::npos) << dump;
  EXPECT_EQ(dump.find("evicted"), std::string::npos) << dump;
  const size_t second = dump.find("  #2 allreduce f32 x 24, max: OK after ");
  const size_t third = dump.find("  #3 broadcast f32 x 32, root 1: RUNNING for ");
  const size_t fourth = dump.find("  #4 allreduce f32 x 40, max: OK after ");
  EXPECT_NE(second, std::string::npos) << dump;
  EXPECT_NE(third, std::string::npos) << dump;
  EXPECT_NE(fourth, std::string::npos) << dump;
  EXPECT_LT(second, third) << dump;
  EXPECT_LT(third, fourth) << dump;
  // The running operation still finishes; an error outcome is kept.
  lane.finish(ids[3], deadline_exceeded_error("stuck"));
  EXPECT_NE(recorder.dump().find("#3 broadcast f32 x 32, root 1: DEADLINE_EXCEEDED: stuck after "),
            std::string::npos)
      << recorder.dump();
  return ids[3];
}

TEST(FlightRecorderTest, TheWindowKeepsTheLastOperationsOldestFirst) {
  FlightRecorder recorder(3);
  expect_window_keeps_the_last_operations(recorder, Lane(recorder, /*exclusive=*/false));

  FlightRecorder none(0);
  none.finish(none.start(0, OpInfo{"barrier"}), ok_status());
  EXPECT_EQ(none.dump(), "");
}

// The one-at-a-time lane (a communicator's collectives) keeps the same window, and an error
// outcome only while its operation is in the window.
TEST(FlightRecorderTest, TheExclusiveLaneKeepsTheSameWindow) {
  FlightRecorder recorder(3);
  expect_window_keeps_the_last_operations(recorder, Lane(recorder, /*exclusive=*/true));
  EXPECT_EQ(recorder.exclusive_errors_kept(), 1u);
  // Three more operations push the failed one out: its error goes with it.
  for (uint64_t sequence = 5; sequence < 8; ++sequence) {
    recorder.finish_exclusive(recorder.start_exclusive(sequence, OpInfo{"barrier"}, Clock::now()),
                              ok_status(), Clock::now());
  }
  EXPECT_EQ(recorder.dump().find("stuck"), std::string::npos) << recorder.dump();
  EXPECT_EQ(recorder.exclusive_errors_kept(), 0u) << "the evicted operation's error is still kept";
  EXPECT_NE(recorder.dump().find("#7 barrier : OK after "), std::string::npos) << recorder.dump();

  FlightRecorder none(0);
  none.finish_exclusive(none.start_exclusive(0, OpInfo{"barrier"}, Clock::now()), ok_status(), Clock::now());
  EXPECT_EQ(none.dump(), "");
}

// A dump lists both lanes' operations together, oldest start first.
TEST(FlightRecorderTest, BothLanesAreDumpedInStartOrder) {
  FlightRecorder recorder(8);
  const Clock::time_point t0 = Clock::now();
  auto at = [&](int us) { return t0 + std::chrono::microseconds(us); };
  OpInfo send{"send", static_cast<int>(DataType::kFloat32), 4};
  send.peer = 1;
  send.tag = 0;
  recorder.finish_exclusive(recorder.start_exclusive(0, OpInfo{"barrier"}, at(10)), ok_status(), at(20));
  recorder.finish(recorder.start(0, send, at(15)), ok_status(), at(30));
  recorder.finish_exclusive(recorder.start_exclusive(1, OpInfo{"allreduce"}, at(25)), ok_status(), at(40));
  recorder.start(1, send, at(35));
  const std::string dump = recorder.dump();
  const size_t barrier = dump.find("#0 barrier");
  const size_t first_send = dump.find("#0 send");
  const size_t allreduce = dump.find("#1 allreduce");
  const size_t second_send = dump.find("#1 send f32 x 4, peer 1, tag 0: RUNNING");
  ASSERT_NE(barrier, std::string::npos) << dump;
  ASSERT_NE(first_send, std::string::npos) << dump;
  ASSERT_NE(allreduce, std::string::npos) << dump;
  ASSERT_NE(second_send, std::string::npos) << dump;
  EXPECT_LT(barrier, first_send) << dump;
  EXPECT_LT(first_send, allreduce) << dump;
  EXPECT_LT(allreduce, second_send) << dump;
}

// The lane's writer takes no lock, so a dump may race it: every record a dump shows is one the
// writer wrote whole (the writer makes sequence and count equal; a torn read would mix two).
TEST(FlightRecorderTest, ADumpRacingTheExclusiveWriterSeesWholeRecords) {
  FlightRecorder recorder(4);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> written{0};
  std::thread writer([&] {
    for (uint64_t i = 1; !stop.load(std::memory_order_relaxed); ++i) {
      OpInfo info{i % 2 == 0 ? "allreduce" : "allgather", static_cast<int>(DataType::kInt32), i};
      const Clock::time_point start(Clock::duration(static_cast<Clock::rep>(i) * 1000));
      recorder.finish_exclusive(recorder.start_exclusive(i, info, start),
                                i % 1000 == 0 ? internal_error("failed {} ", i) : ok_status(),
                                start + std::chrono::microseconds(i % 7));
      written.store(i, std::memory_order_relaxed);
    }
  });
  // Dump while the writer writes, until enough records were checked (or, on a starved machine,
  // for at most a few seconds).
  const Clock::time_point give_up = Clock::now() + std::chrono::seconds(3);
  while (written.load() == 0) std::this_thread::yield();
  int dumps = 0, records = 0;
  while (records < 20000 && Clock::now() < give_up) {
    std::istringstream lines(recorder.dump());
    ++dumps;
    for (std::string line; std::getline(lines, line);) {
      unsigned long long sequence = 0, count = 0;
      char op[16] = {0};
      ASSERT_EQ(std::sscanf(line.c_str(), "  #%llu %15s i32 x %llu", &sequence, op, &count), 3) << line;
      EXPECT_EQ(sequence, count) << line;
      EXPECT_STREQ(op, sequence % 2 == 0 ? "allreduce" : "allgather") << line;
      if (line.find("INTERNAL") != std::string::npos) {
        // Its own error, or (when evicted between the record's read and the error's) that it left.
        EXPECT_TRUE(line.find(fmt::format("failed {} ", sequence)) != std::string::npos ||
                    line.find("its error left the flight recorder") != std::string::npos)
            << line;
      }
      ++records;
    }
  }
  stop = true;
  writer.join();
  EXPECT_GT(records, 0);
  GTEST_LOG_(INFO) << dumps << " dumps, " << records << " records checked during " << written.load()
                   << " writes";
}

TEST(FlightRecorderTest, PointToPointOperationsAreRecorded) {
  auto worlds = loopback_worlds(2);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
    std::vector<float> x(8, 1.0f);
    if (rank == 0) {
      COHORT_RETURN_IF_ERROR(comm->send(x.data(), x.size(), DataType::kFloat32, 1, 3));
    } else {
      COHORT_RETURN_IF_ERROR(comm->recv(x.data(), x.size(), DataType::kFloat32, 0, 3));
    }
    COHORT_RETURN_IF_ERROR(comm->barrier({std::nullopt, true})->wait());
    const std::string dump = comm->flight_recorder_dump();
    COHORT_RETURN_IF_ERROR(expect_contains(
        dump, rank == 0 ? "#0 send f32 x 8, peer 1, tag 3: OK" : "#0 recv f32 x 8, peer 0, tag 3: OK",
        "dump"));
    return expect_contains(dump, "#0 barrier", "dump");
  });
  EXPECT_EQ(failures(statuses), "");
}

// A send and a receive that disagree, under COHORT_DEBUG=detail (options.debug_checks): both
// calls fail with INVALID_ARGUMENT naming both sides (`expected` on the receive, `expected_send`
// on the send), well before the communicator's timeout.
Status mismatch(int rank, Communicator& comm, DataType send_type, size_t send_count, DataType recv_type,
                size_t recv_count, const std::vector<std::string>& expected,
                const std::vector<std::string>& expected_send) {
  std::vector<uint8_t> buffer(64, 0);
  if (rank == 0) {
    // The sender learns the receive's signature from its reply; the receiver drains the payload,
    // so the send is not left to time out either.
    const auto start = std::chrono::steady_clock::now();
    Status sent = comm.send(buffer.data(), send_count, send_type, 1, 5);
    const auto waited = std::chrono::steady_clock::now() - start;
    if (sent.code() != StatusCode::kInvalidArgument) {
      return internal_error("the send: expected INVALID_ARGUMENT, got {}", sent.to_string());
    }
    if (waited > comm.options().timeout / 2) {
      return internal_error("the send's mismatch took {} ms", std::chrono::duration_cast<std::chrono::milliseconds>(waited).count());
    }
    for (const std::string& part : expected_send)
      COHORT_RETURN_IF_ERROR(expect_contains(sent.message(), part, "the send's error"));
    return expect_contains(comm.flight_recorder_dump(), "send " + std::string(data_type_name(send_type)),
                           "dump");
  }
  Status status = comm.recv(buffer.data(), recv_count, recv_type, 0, 5);
  if (status.code() != StatusCode::kInvalidArgument) {
    return internal_error("expected INVALID_ARGUMENT, got {}", status.to_string());
  }
  for (const std::string& part : expected)
    COHORT_RETURN_IF_ERROR(expect_contains(status.message(), part, "error"));
  return expect_contains(comm.flight_recorder_dump(), "recv " + std::string(data_type_name(recv_type)),
                         "dump");
}

TEST(FlightRecorderTest, DebugDetailNamesBothSidesOfAPointToPointMismatch) {
  auto worlds = loopback_worlds(2);
  CommunicatorOptions options;
  options.debug_checks = true;
  options.timeout = std::chrono::seconds(20);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank], options));
    // Sizes differ (a longer send than the receive posted).
    COHORT_RETURN_IF_ERROR(mismatch(rank, *comm, DataType::kInt64, 4, DataType::kFloat32, 2,
                                    {"rank 1 posted recv of f32 x 2 (8 bytes, tag 5) from rank 0",
                                     "rank 0's send is i64 x 4 (32 bytes, tag 5)"},
                                    {"rank 0 sent i64 x 4 (32 bytes, tag 5) to rank 1, but rank 1 posted recv "
                                     "of f32 x 2 (8 bytes, tag 5)"}));
    // Same bytes, different dtype.
    COHORT_RETURN_IF_ERROR(mismatch(rank, *comm, DataType::kInt32, 2, DataType::kFloat32, 2,
                                    {"recv of f32 x 2", "send is i32 x 2"},
                                    {"rank 0 sent i32 x 2", "rank 1 posted recv of f32 x 2"}));
    // A shorter send than the receive.
    COHORT_RETURN_IF_ERROR(mismatch(rank, *comm, DataType::kFloat32, 1, DataType::kFloat32, 3,
                                    {"recv of f32 x 3", "send is f32 x 1"},
                                    {"rank 0 sent f32 x 1", "rank 1 posted recv of f32 x 3"}));
    // A matching pair still moves its data.
    std::vector<double> x(5, rank == 0 ? 2.5 : 0.0);
    if (rank == 0) return comm->send(x.data(), x.size(), DataType::kFloat64, 1, 6);
    auto work = comm->irecv(x.data(), x.size(), DataType::kFloat64, 0, 6);
    COHORT_RETURN_IF_ERROR(work->wait());
    if (x != std::vector<double>(5, 2.5)) return internal_error("received {}", fmt::join(x, ","));
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(FlightRecorderTest, WithoutDebugChecksNoSignatureTravels) {
  // The same shape of mismatch with the check off is the transport's business (truncation), not
  // a signature comparison: the check really is what names both sides above.
  auto worlds = loopback_worlds(2);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    CommunicatorOptions options;
    options.timeout = std::chrono::seconds(20);
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank], options));
    std::vector<int32_t> x(2, 7);
    if (rank == 0) return comm->send(x.data(), 2, DataType::kInt32, 1, 1);
    Status status = comm->recv(x.data(), 2, DataType::kFloat32, 0, 1);
    if (!status.ok()) return internal_error("same bytes must pass without the check: {}", status.to_string());
    return ok_status();
  });
  EXPECT_EQ(failures(statuses), "");
}

TEST(FlightRecorderTest, DumpOnCallIsAValidChromeTraceWithRunningOperations) {
  testing::TempDir dir;
  const std::string path = dir.file("trace.json");
  auto worlds = loopback_worlds(2);
  auto statuses = run_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
    std::vector<float> x(16, 1.0f), late(4, 0.0f);
    COHORT_RETURN_IF_ERROR(
        comm->allreduce(x.data(), x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)->wait());
    if (rank == 0) COHORT_RETURN_IF_ERROR(comm->send(x.data(), 4, DataType::kFloat32, 1, 2));
    if (rank == 1) COHORT_RETURN_IF_ERROR(comm->recv(x.data(), 4, DataType::kFloat32, 0, 2));
    // A receive still pending at the dump.
    std::shared_ptr<Work> pending;
    if (rank == 1) pending = comm->irecv(late.data(), late.size(), DataType::kFloat32, 0, 9);
    COHORT_RETURN_IF_ERROR(comm->barrier()->wait());
    if (rank == 0) {
      StatusOr<std::string> written = dump_flight_recorders(path);
      if (!written.ok()) return written.status();
      if (*written != path) return internal_error("wrote {}, asked for {}", *written, path);
    }
    COHORT_RETURN_IF_ERROR(comm->barrier()->wait());
    if (rank == 0) return comm->send(late.data(), late.size(), DataType::kFloat32, 1, 9);
    return pending->wait();
  });
  ASSERT_EQ(failures(statuses), "");
  StatusOr<std::string> summary = run_python(kTraceCheck, path);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  for (const char* line : {"0 allreduce collective ok", "1 allreduce collective ok", "0 send p2p ok",
                           "1 recv p2p ok", "1 recv p2p running", "0 barrier collective ok",
                           "thread 0 0 flat communicator (context 0, rank 0 of 2) collectives",
                           "thread 1 1 flat communicator (context 0, rank 1 of 2) point-to-point"}) {
    EXPECT_NE(summary->find(line), std::string::npos) << line << " in\n" << *summary;
  }
}

TEST(FlightRecorderTest, SignalNamesParse) {
  EXPECT_EQ(parse_flight_recorder_signal(nullptr).value(), SIGUSR1);
  EXPECT_EQ(parse_flight_recorder_signal("SIGUSR2").value(), SIGUSR2);
  EXPECT_EQ(parse_flight_recorder_signal("usr1").value(), SIGUSR1);
  EXPECT_EQ(parse_flight_recorder_signal("off").value(), 0);
  EXPECT_EQ(parse_flight_recorder_signal("10").value(), 10);
  Status bad = parse_flight_recorder_signal("HUPP").status();
  EXPECT_NE(bad.message().find("COHORT_FLIGHT_RECORDER_SIGNAL=\"HUPP\""), std::string::npos) << bad.message();
  EXPECT_EQ(install_flight_recorder_signal_handler(SIGKILL).code(), StatusCode::kInvalidArgument);
}

// A process: communicators made with COHORT_FLIGHT_RECORDER_DIR set install the default SIGUSR1
// handler; the signal makes a dump file appear there, which parses.
TEST(FlightRecorderTest, SigusrOneDumpsIntoTheDirectoryInAChildProcess) {
  testing::TempDir dir;
  std::vector<std::string> child_failures = testing::run_children(1, [&](int) {
    ::setenv(kFlightRecorderDirEnv, dir.path().c_str(), 1);
    ::unsetenv(kFlightRecorderSignalEnv);
    auto worlds = loopback_worlds(2);
    auto statuses = run_ranks(2, [&](int rank) -> Status {
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank]));
      std::vector<float> x(4, 1.0f);
      COHORT_RETURN_IF_ERROR(
          comm->allreduce(x.data(), x.data(), 4, DataType::kFloat32, ReduceOp::kMax)->wait());
      COHORT_RETURN_IF_ERROR(comm->barrier()->wait());
      if (rank == 0) ::kill(::getpid(), SIGUSR1);
      // Keep the communicators alive until the dump thread has written.
      for (int i = 0; i < 200; ++i) {
        std::ifstream probe(
            fmt::format("{}/cohort-flight-recorder-rank0-pid{}-0.json", dir.path(), ::getpid()));
        if (probe.good()) return ok_status();
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
      return deadline_exceeded_error("no dump file after SIGUSR1");
    });
    return failures(statuses).empty() ? 0 : 1;
  });
  ASSERT_TRUE(child_failures.empty()) << fmt::format("{}", fmt::join(child_failures, "; "));
  // The child's pid is in the name; find the file.
  FILE* ls = ::popen(fmt::format("ls {}/cohort-flight-recorder-rank0-pid*-0.json", dir.path()).c_str(), "r");
  ASSERT_NE(ls, nullptr);
  char name[4096] = {};
  ASSERT_NE(std::fgets(name, sizeof(name), ls), nullptr);
  ::pclose(ls);
  std::string file(name);
  file.erase(file.find_last_not_of('\n') + 1);
  StatusOr<std::string> summary = run_python(kTraceCheck, file);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  EXPECT_NE(summary->find("0 allreduce collective ok"), std::string::npos) << *summary;
  // Rank 1's barrier may still be finishing when rank 0 raises the signal.
  EXPECT_NE(summary->find("1 barrier collective "), std::string::npos) << *summary;
}

// A process: with COHORT_FLIGHT_RECORDER_DIR set, a collective that times out writes the trace
// there, naming the operation that hung as running... and then timed out.
TEST(FlightRecorderTest, ATimeoutWritesTheTraceWhenTheDirectoryIsSet) {
  testing::TempDir dir;
  std::vector<std::string> child_failures = testing::run_children(1, [&](int) {
    ::setenv(kFlightRecorderDirEnv, dir.path().c_str(), 1);
    auto worlds = loopback_worlds(2);
    auto statuses = run_ranks(2, [&](int rank) -> Status {
      CommunicatorOptions options;
      options.timeout = std::chrono::milliseconds(200);
      COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", worlds[rank], options));
      if (rank == 1) return ok_status();  // never joins the allreduce
      std::vector<float> x(4, 1.0f);
      Status status = comm->allreduce(x.data(), x.data(), 4, DataType::kFloat32, ReduceOp::kSum)->wait();
      if (status.code() != StatusCode::kDeadlineExceeded) return internal_error("got {}", status.to_string());
      return ok_status();
    });
    return failures(statuses).empty() ? 0 : 1;
  });
  ASSERT_TRUE(child_failures.empty()) << fmt::format("{}", fmt::join(child_failures, "; "));
  FILE* ls = ::popen(fmt::format("ls {}/cohort-flight-recorder-rank*-pid*-*.json", dir.path()).c_str(), "r");
  ASSERT_NE(ls, nullptr);
  char name[4096] = {};
  ASSERT_NE(std::fgets(name, sizeof(name), ls), nullptr) << "no trace written on timeout";
  ::pclose(ls);
  std::string file(name);
  file.erase(file.find_last_not_of('\n') + 1);
  StatusOr<std::string> summary = run_python(kTraceCheck, file);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  EXPECT_NE(summary->find("0 allreduce collective DEADLINE_EXCEEDED"), std::string::npos) << *summary;
}

}  // namespace
}  // namespace cohort::comm
