// The tcp store's authentication and limits over real sockets: TcpStore with the right secret,
// a wrong one, none; the server binding only the given address; the connection cap; a flood of
// idle connections while a client connects.

#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/store/store_test_util.h"
#include "worker/comm/store/tcp_socket.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_auth.h"
#include "worker/comm/store/tcp_store_server.h"

namespace cohort::comm {
namespace {

constexpr Duration kTimeout = std::chrono::seconds(20);
constexpr Duration kShortTimeout = std::chrono::milliseconds(500);
constexpr const char* kSecret = "0123456789abcdef0123456789abcdef";

std::unique_ptr<TcpStoreServer> start_server(TcpStoreServerOptions options) {
  options.host = "127.0.0.1";
  StatusOr<std::unique_ptr<TcpStoreServer>> server = TcpStoreServer::start(options);
  EXPECT_TRUE(server.ok()) << server.status().to_string();
  return server.ok() ? std::move(server).value() : nullptr;
}

std::unique_ptr<TcpStoreServer> start_server_with_secret() {
  TcpStoreServerOptions options;
  options.service.secret = kSecret;
  return start_server(options);
}

TEST(TcpStoreAuthTest, TheRightSecretWorksOnEveryPooledConnection) {
  std::unique_ptr<TcpStoreServer> server = start_server_with_secret();
  ASSERT_NE(server, nullptr);
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", server->port(), kTimeout, kSecret);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  ASSERT_TRUE((*store)->set("k", "v").ok());
  // A blocked get holds one connection; a concurrent set opens (and authenticates) another.
  std::thread setter([&] { EXPECT_TRUE((*store)->set("later", "x").ok()); });
  StatusOr<std::string> later = (*store)->get("later", kTimeout);
  setter.join();
  ASSERT_TRUE(later.ok()) << later.status().to_string();
  EXPECT_EQ(*later, "x");
}

TEST(TcpStoreAuthTest, AWrongSecretIsRefusedPromptly) {
  std::unique_ptr<TcpStoreServer> server = start_server_with_secret();
  ASSERT_NE(server, nullptr);
  const auto start = Clock::now();
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", server->port(), kTimeout, "wrong");
  EXPECT_EQ(store.status().code(), StatusCode::kUnauthenticated) << store.status().to_string();
  EXPECT_NE(store.status().message().find(kJobSecretEnvironmentVariable), std::string::npos);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));  // not retried until the timeout
}

TEST(TcpStoreAuthTest, AClientWithoutTheSecretIsRefused) {
  std::unique_ptr<TcpStoreServer> server = start_server_with_secret();
  ASSERT_NE(server, nullptr);
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", server->port(), kTimeout);
  EXPECT_EQ(store.status().code(), StatusCode::kUnauthenticated) << store.status().to_string();
  EXPECT_NE(store.status().message().find("requires the job's secret"), std::string::npos);
}

TEST(TcpStoreAuthTest, CreateServesWithTheSecretOnTheGivenAddressOnly) {
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::create("127.0.0.1", 0, true, kTimeout, kSecret);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  const int port = (*store)->port();
  EXPECT_EQ(TcpStore::connect("127.0.0.1", port, kTimeout, "wrong").status().code(), StatusCode::kUnauthenticated);
  // 127.0.0.2 is this machine too, but the server listens on 127.0.0.1 alone.
  StatusOr<ScopedFd> other = connect_tcp("127.0.0.2", port, Deadline::after(kShortTimeout));
  EXPECT_FALSE(other.ok());
  EXPECT_TRUE(TcpStore::connect("127.0.0.1", port, kTimeout, kSecret).ok());
}

TEST(TcpStoreAuthTest, ConnectionsBeyondTheCapAreClosed) {
  TcpStoreServerOptions options;
  options.service.secret = kSecret;
  options.max_connections = 4;
  std::unique_ptr<TcpStoreServer> server = start_server(options);
  ASSERT_NE(server, nullptr);
  std::vector<std::unique_ptr<TcpStore>> stores;
  for (int i = 0; i < 4; ++i) {
    StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", server->port(), kTimeout, kSecret);
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    stores.push_back(std::move(store).value());
  }
  StatusOr<std::unique_ptr<TcpStore>> fifth = TcpStore::connect("127.0.0.1", server->port(), kShortTimeout, kSecret);
  EXPECT_FALSE(fifth.ok());
  EXPECT_TRUE(stores[0]->set("still", "served").ok());
  stores.pop_back();  // a slot frees up
  EXPECT_TRUE(TcpStore::connect("127.0.0.1", server->port(), kTimeout, kSecret).ok());
}

TEST(TcpStoreAuthTest, IdleConnectionsDoNotLockOutTheJob) {
  std::unique_ptr<TcpStoreServer> server = start_server_with_secret();
  ASSERT_NE(server, nullptr);
  // More idle connections than kTcpStoreMaxPendingHandshakes: the oldest are shed.
  std::vector<ScopedFd> idle;
  for (size_t i = 0; i < kTcpStoreMaxPendingHandshakes + 200; ++i) {
    StatusOr<ScopedFd> fd = connect_tcp("127.0.0.1", server->port(), Deadline::after(kTimeout));
    ASSERT_TRUE(fd.ok()) << fd.status().to_string();
    idle.push_back(std::move(fd).value());
  }
  StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", server->port(), kTimeout, kSecret);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_TRUE((*store)->set("k", "v").ok());
  // The first idle connections were closed by the server.
  char byte = 0;
  EXPECT_EQ(::recv(idle.front().get(), &byte, 1, 0), 0);
}

}  // namespace
}  // namespace cohort::comm
