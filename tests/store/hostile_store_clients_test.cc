// Hostile clients of rank 0's tcp store while a 2-rank job runs: two forked ranks bootstrap with
// tcp:// init and the job secret (rank 0 serves the store in-process), then loop on a store
// round trip plus a UCX allreduce until the test tells them to stop. Meanwhile the test attacks
// the store: (a) a 4 GiB length prefix, (b) 10 000 idle connections, (c) pipelined gets that
// are never read. Each attack must leave the job finishing and rank 0's memory bounded.

#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/init/environment.h"
#include "worker/comm/store/store_test_util.h"
#include "worker/comm/store/tcp_socket.h"
#include "worker/comm/store/tcp_store_auth.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;
using testing::ProcessRanks;
using std::chrono::seconds;

constexpr const char* kSecret = "hostile-store-test-secret-0123456789";
// Limit for the whole job (bootstrap, attack, finish).
constexpr Duration kJobDeadline = seconds(60);
// Limit for one attack.
constexpr Duration kAttackDeadline = seconds(30);
// Pace of the ranks' loop: the job keeps communicating without taking both cores from the attacker.
constexpr Duration kIterationPause = milliseconds(5);
// Growth of rank 0's peak memory an attack may cause: generous (the store's own limits are far
// below), yet far below what an unbounded buffer of a 4 GiB frame or of unread replies would take.
constexpr int64_t kMaxMemoryGrowthKib = 256 * 1024;
constexpr int kIdleConnections = 10000;

bool file_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// A field of /proc/<pid>/status in KiB (VmRSS, VmHWM); -1 when unreadable.
int64_t proc_status_kib(pid_t pid, const std::string& field) {
  std::ifstream status(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

// One rank: bootstrap over tcp:// with the secret, then store round trip + allreduce per
// iteration until rank 0 sees `stop_file` (agreed on through the allreduce itself).
Status run_rank(int rank, int port, const std::string& dir) {
  InitOptions init = InitOptions::from_url(fmt::format("tcp://127.0.0.1:{}?rank={}&world_size=2", port, rank));
  init.timeout = seconds(30);
  init.env = environment_from({{kJobSecretEnvironmentVariable, kSecret}});
  COHORT_ASSIGN_OR_RETURN(Bootstrap boot, resolve_init(init));
  COHORT_ASSIGN_OR_RETURN(auto world, create_world(boot, seconds(30)));
  COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator("flat", world));
  if (rank == 0) std::ofstream(dir + "/ready") << "ready";
  const Deadline deadline = Deadline::after(kJobDeadline);
  for (int64_t i = 0; !deadline.expired(); ++i) {
    COHORT_RETURN_IF_ERROR(boot.store->set(fmt::format("beat/{}", rank), std::to_string(i)));
    COHORT_ASSIGN_OR_RETURN(std::string other, boot.store->get(fmt::format("beat/{}", 1 - rank), seconds(30)));
    const bool stop = rank == 0 && file_exists(dir + "/stop");
    COHORT_ASSIGN_OR_RETURN(double votes, comm->allreduce_obj(stop ? 1.0 : 0.0));
    if (votes > 0) return ok_status();
    std::this_thread::sleep_for(kIterationPause);
  }
  return deadline_exceeded_error("rank {}: never told to stop within {}", rank, format_duration(kJobDeadline));
}

// A raw connection to the store; `authenticate` completes the handshake with the job secret
// (an insider: a buggy or compromised rank).
ScopedFd raw_connection(int port, bool authenticate) {
  const Deadline deadline = Deadline::after(kAttackDeadline);
  StatusOr<ScopedFd> fd = connect_tcp("127.0.0.1", port, deadline);
  EXPECT_TRUE(fd.ok()) << fd.status().to_string();
  if (!fd.ok() || !authenticate) return fd.ok() ? std::move(fd).value() : ScopedFd();
  auto round_trip = [&](const std::string& body) {
    std::string header, reply;
    EXPECT_TRUE(send_all(fd->get(), tcp_store_frame(body), deadline).ok());
    EXPECT_TRUE(recv_exact(fd->get(), kTcpStoreFrameHeaderBytes, deadline, &header).ok());
    EXPECT_TRUE(recv_exact(fd->get(), tcp_store_frame_length(header).value_or(0), deadline, &reply).ok());
    return reply;
  };
  const std::string hello = round_trip(WireWriter()
                                           .u8(static_cast<uint8_t>(TcpStoreOp::kHello))
                                           .u32(kTcpStoreMagic)
                                           .u32(kTcpStoreProtocolVersion)
                                           .take());
  WireReader result(std::string_view(hello).substr(1));
  uint8_t required = 0;
  std::string nonce;
  EXPECT_TRUE(result.u8(&required) && result.str(&nonce));
  const std::string auth = round_trip(
      WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kAuth)).str(tcp_store_auth_response(kSecret, nonce)).take());
  EXPECT_EQ(static_cast<StatusCode>(auth.at(0)), StatusCode::kOk);
  return std::move(fd).value();
}

// Whether the server closes `fd` before the deadline (reading and discarding what it sends).
bool server_closes(int fd, Duration within) {
  const Deadline deadline = Deadline::after(within);
  while (!deadline.expired()) {
    std::string byte;
    Status status = recv_exact(fd, 1, deadline, &byte);
    if (status.code() == StatusCode::kUnavailable || (!status.ok() && status.code() != StatusCode::kDeadlineExceeded))
      return true;
  }
  return false;
}

class HostileStoreClientsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    port_ = testing::pick_free_port();
    ASSERT_NE(port_, 0);
    ranks_.fork_ranks(2, [this](int rank) { return run_rank(rank, port_, dir_.path()); });
    const Deadline ready = Deadline::after(seconds(30));
    while (!file_exists(dir_.path() + "/ready") && !ready.expired()) std::this_thread::sleep_for(milliseconds(10));
    ASSERT_TRUE(file_exists(dir_.path() + "/ready")) << "the job did not start";
    baseline_rss_kib_ = proc_status_kib(ranks_.pid(0), "VmRSS");
    ASSERT_GT(baseline_rss_kib_, 0);
  }

  // Stops the job; expects both ranks to finish cleanly and rank 0's memory to have stayed bounded.
  void finish_job() {
    const int64_t peak_kib = proc_status_kib(ranks_.pid(0), "VmHWM");
    std::ofstream(dir_.path() + "/stop") << "stop";
    EXPECT_EQ(testing::failed_ranks(ranks_.wait_all(kJobDeadline)), "");
    EXPECT_GT(peak_kib, 0);
    EXPECT_LT(peak_kib - baseline_rss_kib_, kMaxMemoryGrowthKib)
        << "rank 0 grew from " << baseline_rss_kib_ << " KiB to a peak of " << peak_kib << " KiB";
    finished_ = true;
  }

  void TearDown() override {
    if (!finished_) {
      std::ofstream(dir_.path() + "/stop") << "stop";
      static_cast<void>(ranks_.wait_all(kJobDeadline));
    }
  }

  testing::TempDir dir_;
  ProcessRanks ranks_{dir_.path()};
  int port_ = 0;
  int64_t baseline_rss_kib_ = 0;
  bool finished_ = false;
};


TEST_F(HostileStoreClientsTest, AFourGibLengthPrefixIsRefused) {
  for (bool authenticate : {false, true}) {
    ScopedFd fd = raw_connection(port_, authenticate);
    ASSERT_TRUE(fd.valid());
    // The length prefix, then the start of a "body" the server must not wait for or buffer.
    ASSERT_TRUE(send_all(fd.get(), WireWriter().u32(0xffffffffu).take(), Deadline::after(kAttackDeadline)).ok());
    const std::string garbage(1 << 20, 'x');
    static_cast<void>(send_all(fd.get(), garbage, Deadline::after(seconds(2))));
    EXPECT_TRUE(server_closes(fd.get(), kAttackDeadline)) << "authenticated=" << authenticate;
  }
  finish_job();
}

TEST_F(HostileStoreClientsTest, TenThousandIdleConnections) {
  rlimit limit{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &limit), 0);
  const rlim_t needed = kIdleConnections + 256;
  if (limit.rlim_cur < needed) {
    limit.rlim_cur = std::min<rlim_t>(std::max<rlim_t>(needed, limit.rlim_cur), limit.rlim_max);
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &limit), 0);
  }
  ASSERT_GE(limit.rlim_cur, needed) << "RLIMIT_NOFILE hard limit too low for this test";
  const Deadline deadline = Deadline::after(kAttackDeadline);
  std::vector<ScopedFd> idle;
  int refused = 0;
  for (int i = 0; i < kIdleConnections && !deadline.expired(); ++i) {
    StatusOr<ScopedFd> fd = connect_tcp("127.0.0.1", port_, Deadline::after(milliseconds(200)));
    if (fd.ok()) {
      idle.push_back(std::move(fd).value());
    } else {
      ++refused;
    }
  }
  EXPECT_EQ(idle.size() + refused, static_cast<size_t>(kIdleConnections)) << "the attack ran out of time";
  // The job goes on while they are open: a fresh authenticated client still gets in.
  ScopedFd fresh = raw_connection(port_, /*authenticate=*/true);
  EXPECT_TRUE(fresh.valid());
  // Most idle connections were closed by the server (shed or refused), not held.
  int closed = 0;
  for (const ScopedFd& fd : idle) {
    char byte = 0;
    if (::recv(fd.get(), &byte, 1, MSG_DONTWAIT) == 0) ++closed;
  }
  EXPECT_GT(closed + refused, kIdleConnections / 2);
  idle.clear();
  finish_job();
}

TEST_F(HostileStoreClientsTest, PipelinedGetsThatAreNeverRead) {
  ScopedFd fd = raw_connection(port_, /*authenticate=*/true);
  ASSERT_TRUE(fd.valid());
  const Deadline deadline = Deadline::after(kAttackDeadline);
  // A large value makes every reply large: unread replies pile up fast.
  const std::string set =
      WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kSet)).str("big").str(std::string(64 << 10, 'v')).take();
  ASSERT_TRUE(send_all(fd.get(), tcp_store_frame(set), deadline).ok());
  std::string batch;
  for (int i = 0; i < 256; ++i) {
    batch += tcp_store_frame(WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kGet)).str("big").i64(0).take());
  }
  bool disconnected = false;
  while (!deadline.expired() && !disconnected) {
    const ssize_t n = ::send(fd.get(), batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) disconnected = true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // Our send buffer is full: the server stopped reading or dropped us; look for the close
      // without reading its replies (peek at the socket's error state).
      int error = 0;
      socklen_t size = sizeof(error);
      ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &error, &size);
      if (error != 0) disconnected = true;
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  // Having never read, the client may see the close only as a reset on a later send or read.
  if (!disconnected) disconnected = server_closes(fd.get(), seconds(5));
  EXPECT_TRUE(disconnected) << "the server kept buffering replies nobody reads";
  finish_job();
}

}  // namespace
}  // namespace cohort::comm
