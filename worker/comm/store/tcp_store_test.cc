// TcpStore and TcpStoreServer beyond the common contract: connecting to a server that starts
// later, servers that die, stop or freeze under a blocked client, and peers that speak nonsense.

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/store/store_test_util.h"
#include "worker/comm/store/tcp_socket.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/tcp_store_server.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;

constexpr Duration kShortTimeout = milliseconds(300);
constexpr Duration kLongTimeout = std::chrono::seconds(20);
// A dead server must surface well within this.
constexpr Duration kPromptly = std::chrono::seconds(3);

Duration elapsed_since(Clock::time_point start) {
  return std::chrono::duration_cast<Duration>(Clock::now() - start);
}

std::unique_ptr<TcpStoreServer> start_local_server(int port = 0) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::start(options);
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  return server.ok() ? std::move(server).value() : nullptr;
}

// A TcpStoreServer in a forked child, so the test can SIGKILL or SIGSTOP it like a real rank 0.
class ChildServer {
 public:
  ChildServer() {
    int pipe_fds[2];
    if (::pipe(pipe_fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) serve_in_child(pipe_fds[1]);
    ::close(pipe_fds[1]);
    port_ = read_port(pipe_fds[0]);
    ::close(pipe_fds[0]);
  }
  ~ChildServer() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  int port() const { return port_; }
  // SIGSTOP, returning once the child is really stopped (signal delivery is asynchronous).
  void freeze() const {
    ::kill(pid_, SIGSTOP);
    int status = 0;
    ::waitpid(pid_, &status, WUNTRACED);
  }
  void thaw() const { ::kill(pid_, SIGCONT); }
  void kill_and_reap() {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  [[noreturn]] static void serve_in_child(int port_fd) {
    std::unique_ptr<TcpStoreServer> server = start_local_server();
    const int port = server ? server->port() : 0;
    if (::write(port_fd, &port, sizeof(port)) != sizeof(port)) ::_exit(1);
    // Serve until killed; the limit only guards against a parent that died without killing us.
    std::this_thread::sleep_for(std::chrono::seconds(120));
    ::_exit(0);
  }
  static int read_port(int fd) {
    pollfd entry{fd, POLLIN, 0};
    int port = 0;
    if (::poll(&entry, 1, 10'000) != 1 || ::read(fd, &port, sizeof(port)) != sizeof(port)) return 0;
    return port;
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

TEST(TcpStoreTest, ConnectRetriesUntilALateServerAppears) {
  const int port = testing::pick_free_port();
  ASSERT_NE(port, 0);
  std::unique_ptr<TcpStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    server = start_local_server(port);
  });
  const auto start = Clock::now();
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", port, kLongTimeout);
  starter.join();
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_GE(elapsed_since(start), milliseconds(250));
  ASSERT_TRUE((*store)->set("k", "v").ok());
  EXPECT_EQ((*store)->get("k", kShortTimeout).value(), "v");
}

TEST(TcpStoreTest, ConnectGivesUpAtItsTimeoutNamingHostAndPort) {
  const int port = testing::pick_free_port();  // nothing listens there
  const auto start = Clock::now();
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", port, kShortTimeout);
  EXPECT_EQ(store.status().code(), StatusCode::kDeadlineExceeded) << store.status().to_string();
  EXPECT_NE(store.status().message().find(fmt::format("127.0.0.1:{}", port)), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find("refused"), std::string::npos) << store.status().message();
  EXPECT_LT(elapsed_since(start), kShortTimeout + kPromptly);
}

TEST(TcpStoreTest, ConnectRejectsAnInvalidPort) {
  EXPECT_EQ(TcpStore::connect("127.0.0.1", 0, kShortTimeout).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(TcpStore::connect("127.0.0.1", 70000, kShortTimeout).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(TcpStoreTest, ConnectToSomethingThatNeverAnswersTimesOut) {
  // A listening socket nobody accepts on: TCP connects (the kernel's backlog), the hello hangs.
  StatusOr<ScopedFd> silent = listen_tcp("127.0.0.1", 0);
  ASSERT_TRUE(silent.ok());
  const int port = bound_port(silent->get()).value();
  const auto start = Clock::now();
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", port, kShortTimeout);
  EXPECT_EQ(store.status().code(), StatusCode::kDeadlineExceeded) << store.status().to_string();
  EXPECT_NE(store.status().message().find("hello"), std::string::npos) << store.status().message();
  EXPECT_LT(elapsed_since(start), kShortTimeout + kPromptly);
}

TEST(TcpStoreTest, KillingTheServerFailsABlockedGetPromptly) {
  ChildServer server;
  ASSERT_NE(server.port(), 0);
  std::unique_ptr<TcpStore> store =
      std::move(TcpStore::connect("127.0.0.1", server.port(), kLongTimeout)).value();
  ASSERT_TRUE(store->set("alive", "1").ok());
  auto blocked = std::async(std::launch::async, [&] { return store->get("never", kLongTimeout); });
  std::this_thread::sleep_for(milliseconds(100));  // let the get park on the server
  const auto killed_at = Clock::now();
  server.kill_and_reap();
  ASSERT_EQ(blocked.wait_for(kPromptly), std::future_status::ready)
      << "get still blocked after the server died";
  StatusOr<std::string> value = blocked.get();
  EXPECT_LT(elapsed_since(killed_at), kPromptly);
  EXPECT_EQ(value.status().code(), StatusCode::kUnavailable) << value.status().to_string();
  EXPECT_NE(value.status().message().find(fmt::format("127.0.0.1:{}", server.port())), std::string::npos)
      << value.status().message();
  // Later calls fail at once too: the server is gone, nothing to retry against.
  const auto start = Clock::now();
  EXPECT_EQ(store->set("after", "x").code(), StatusCode::kUnavailable);
  EXPECT_LT(elapsed_since(start), kPromptly);
}

TEST(TcpStoreTest, AFrozenServerTimesOutInsteadOfHanging) {
  ChildServer server;
  ASSERT_NE(server.port(), 0);
  std::unique_ptr<TcpStore> store =
      std::move(TcpStore::connect("127.0.0.1", server.port(), kShortTimeout)).value();
  server.freeze();
  // A plain call is bounded by the store's timeout, a get by its own plus the reply grace.
  auto start = Clock::now();
  Status set = store->set("k", "v");
  EXPECT_EQ(set.code(), StatusCode::kDeadlineExceeded) << set.to_string();
  EXPECT_LT(elapsed_since(start), kShortTimeout + kPromptly);
  start = Clock::now();
  StatusOr<std::string> value = store->get("k", milliseconds(100));
  EXPECT_EQ(value.status().code(), StatusCode::kDeadlineExceeded) << value.status().to_string();
  EXPECT_LT(elapsed_since(start), milliseconds(100) + kTcpStoreReplyGrace + kPromptly);
  server.thaw();
}

TEST(TcpStoreTest, StoppingTheServerFailsABlockedGet) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  std::unique_ptr<TcpStore> store =
      std::move(TcpStore::connect("127.0.0.1", server->port(), kLongTimeout)).value();
  auto blocked = std::async(std::launch::async, [&] { return store->get("never", kLongTimeout); });
  std::this_thread::sleep_for(milliseconds(100));
  server->stop();
  server->stop();  // idempotent
  ASSERT_EQ(blocked.wait_for(kPromptly), std::future_status::ready);
  EXPECT_EQ(blocked.get().status().code(), StatusCode::kUnavailable);
}

TEST(TcpStoreTest, CreateServesFromTheFirstStoreAndStopsWithIt) {
  std::unique_ptr<TcpStore> rank0 =
      std::move(TcpStore::create("127.0.0.1", 0, /*is_server=*/true, kLongTimeout)).value();
  ASSERT_GT(rank0->port(), 0);
  std::unique_ptr<TcpStore> rank1 =
      std::move(TcpStore::create("127.0.0.1", rank0->port(), /*is_server=*/false, kLongTimeout)).value();
  ASSERT_TRUE(rank0->set("from/0", "a").ok());
  ASSERT_TRUE(rank1->set("from/1", "b").ok());
  EXPECT_EQ(rank1->get("from/0", kShortTimeout).value(), "a");
  EXPECT_EQ(rank0->get("from/1", kShortTimeout).value(), "b");
  rank0.reset();  // the serving rank leaves: the server goes with it
  EXPECT_EQ(rank1->get("from/0", kShortTimeout).status().code(), StatusCode::kUnavailable);
}

TEST(TcpStoreTest, ServingOnATakenPortIsUnavailableNamingIt) {
  std::unique_ptr<TcpStoreServer> first = start_local_server();
  ASSERT_NE(first, nullptr);
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = first->port();
  StatusOr<std::unique_ptr<TcpStoreServer>> second = TcpStoreServer::start(options);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(fmt::format("127.0.0.1:{}", first->port())), std::string::npos)
      << second.status().message();
}

TEST(TcpStoreTest, ManyClientsWaitingOnOneKeyAreAllWoken) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  constexpr int kClients = 16;
  std::vector<std::future<Status>> waiters;
  for (int i = 0; i < kClients; ++i) {
    waiters.push_back(std::async(std::launch::async, [&] {
      COHORT_ASSIGN_OR_RETURN(auto store, TcpStore::connect("127.0.0.1", server->port(), kLongTimeout));
      return store->wait({"barrier"}, kLongTimeout);
    }));
  }
  std::unique_ptr<TcpStore> setter =
      std::move(TcpStore::connect("127.0.0.1", server->port(), kLongTimeout)).value();
  std::this_thread::sleep_for(milliseconds(100));
  ASSERT_TRUE(setter->set("barrier", "open").ok());
  for (auto& waiter : waiters) {
    ASSERT_EQ(waiter.wait_for(kPromptly), std::future_status::ready);
    EXPECT_TRUE(waiter.get().ok());
  }
}

// Raw protocol: one request frame, one reply body.
std::string round_trip(int fd, const std::string& body) {
  const Deadline deadline = Deadline::after(kLongTimeout);
  EXPECT_TRUE(send_all(fd, tcp_store_frame(body), deadline).ok());
  std::string header, reply;
  EXPECT_TRUE(recv_exact(fd, kTcpStoreFrameHeaderBytes, deadline, &header).ok());
  EXPECT_TRUE(recv_exact(fd, tcp_store_frame_length(header).value(), deadline, &reply).ok());
  return reply;
}

// Raw protocol: the handshake with a server that has no secret.
void say_hello(int fd) {
  const std::string reply = round_trip(
      fd, WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kHello)).u32(kTcpStoreMagic).u32(kTcpStoreProtocolVersion).take());
  ASSERT_FALSE(reply.empty());
  ASSERT_EQ(static_cast<StatusCode>(reply[0]), StatusCode::kOk);
}

TEST(TcpStoreServerTest, AMalformedRequestGetsAnErrorAndTheConnectionStaysUsable) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  ScopedFd fd = std::move(connect_tcp("127.0.0.1", server->port(), Deadline::after(kLongTimeout))).value();
  say_hello(fd.get());
  const std::string unknown_op = WireWriter().u8(99).take();
  std::string reply = round_trip(fd.get(), unknown_op);
  ASSERT_FALSE(reply.empty());
  EXPECT_EQ(static_cast<StatusCode>(reply[0]), StatusCode::kInvalidArgument);
  // A truncated set (key but no value).
  reply = round_trip(fd.get(), WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kSet)).str("k").take());
  EXPECT_EQ(static_cast<StatusCode>(reply[0]), StatusCode::kInvalidArgument);
  reply = round_trip(fd.get(), WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kNumKeys)).take());
  ASSERT_EQ(static_cast<StatusCode>(reply[0]), StatusCode::kOk);
  int64_t count = -1;
  EXPECT_TRUE(WireReader(std::string_view(reply).substr(1)).i64(&count));
  EXPECT_EQ(count, 0);
}

TEST(TcpStoreServerTest, AWrongHelloIsRefusedClearly) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  ScopedFd fd = std::move(connect_tcp("127.0.0.1", server->port(), Deadline::after(kLongTimeout))).value();
  const std::string hello = WireWriter()
                                .u8(static_cast<uint8_t>(TcpStoreOp::kHello))
                                .u32(kTcpStoreMagic)
                                .u32(kTcpStoreProtocolVersion + 1)
                                .take();
  const std::string reply = round_trip(fd.get(), hello);
  ASSERT_FALSE(reply.empty());
  EXPECT_EQ(static_cast<StatusCode>(reply[0]), StatusCode::kFailedPrecondition);
}

TEST(TcpStoreServerTest, AnOversizedFrameClosesTheConnection) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  ScopedFd fd = std::move(connect_tcp("127.0.0.1", server->port(), Deadline::after(kLongTimeout))).value();
  say_hello(fd.get());
  const std::string header = WireWriter().u32(kTcpStoreMaxFrameBytes + 1).take();
  ASSERT_TRUE(send_all(fd.get(), header, Deadline::after(kLongTimeout)).ok());
  std::string reply;
  EXPECT_EQ(recv_exact(fd.get(), 1, Deadline::after(kLongTimeout), &reply).code(), StatusCode::kUnavailable);
}

TEST(TcpStoreServerTest, AClientThatDisconnectsWhileWaitingIsForgotten) {
  std::unique_ptr<TcpStoreServer> server = start_local_server();
  ASSERT_NE(server, nullptr);
  {
    ScopedFd fd = std::move(connect_tcp("127.0.0.1", server->port(), Deadline::after(kLongTimeout))).value();
    say_hello(fd.get());
    const std::string get =
        WireWriter().u8(static_cast<uint8_t>(TcpStoreOp::kGet)).str("k").i64(60'000).take();
    ASSERT_TRUE(send_all(fd.get(), tcp_store_frame(get), Deadline::after(kLongTimeout)).ok());
  }  // closed while parked
  std::unique_ptr<TcpStore> store =
      std::move(TcpStore::connect("127.0.0.1", server->port(), kLongTimeout)).value();
  ASSERT_TRUE(store->set("k", "v").ok());  // answering the departed waiter must not hurt
  EXPECT_EQ(store->get("k", kShortTimeout).value(), "v");
}

}  // namespace
}  // namespace cohort::comm
