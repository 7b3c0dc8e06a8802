// Stores shared by separate processes, as ranks use them: N forked children hammer one counter,
// publish their own keys and wait for each other's, and the parent checks the totals.

#include <cstdio>
#include <functional>
#include <memory>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/store/file_store.h"
#include "worker/comm/store/store_test_util.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"

namespace cohort::comm {
namespace {

constexpr int kChildren = 4;
constexpr int kAddsPerChild = 1000;
// Every child publishes its progress under its own key this often.
constexpr int kProgressEvery = 100;
// Children wait this long for each other: they start within milliseconds of one another.
constexpr Duration kPeerTimeout = std::chrono::seconds(30);

std::string done_key(int child) { return fmt::format("child/{}/done", child); }

std::vector<std::string> all_done_keys() {
  std::vector<std::string> keys;
  for (int c = 0; c < kChildren; ++c) keys.push_back(done_key(c));
  return keys;
}

// The body of one child: returns 0 on success, prints the first error and returns 1 otherwise.
int hammer(Store& store, int child) {
  auto fail = [child](const Status& status) {
    std::fprintf(stderr, "child %d: %s\n", child, status.to_string().c_str());
    return 1;
  };
  for (int i = 1; i <= kAddsPerChild; ++i) {
    StatusOr<int64_t> sum = store.add("counter", 1);
    if (!sum.ok()) return fail(sum.status());
    if (i % kProgressEvery == 0) {
      Status set = store.set(fmt::format("child/{}/progress", child), std::to_string(i));
      if (!set.ok()) return fail(set);
    }
  }
  if (Status set = store.set(done_key(child), std::to_string(child)); !set.ok()) return fail(set);
  // Every child sees every other child's keys: cross-process waits work.
  if (Status waited = store.wait(all_done_keys(), kPeerTimeout); !waited.ok()) return fail(waited);
  StatusOr<std::string> total = store.get("counter", kPeerTimeout);
  if (!total.ok()) return fail(total.status());
  if (*total != std::to_string(kChildren * kAddsPerChild)) {
    return fail(internal_error("counter is {} after every child finished", *total));
  }
  return 0;
}

void expect_totals(Store& store) {
  EXPECT_EQ(store.get("counter", kPeerTimeout).value(), std::to_string(kChildren * kAddsPerChild));
  for (int c = 0; c < kChildren; ++c) {
    EXPECT_EQ(store.get(done_key(c), kPeerTimeout).value(), std::to_string(c));
    EXPECT_EQ(store.get(fmt::format("child/{}/progress", c), kPeerTimeout).value(),
              std::to_string(kAddsPerChild));
  }
  // counter + per child (progress, done).
  EXPECT_EQ(store.num_keys().value(), 1 + 2 * kChildren);
}

TEST(StoreMultiProcessTest, FileStoreSharedByForkedProcesses) {
  testing::TempDir dir;
  const std::string path = dir.file("store");
  std::vector<std::string> failures = testing::run_children(kChildren, [&](int child) {
    FileStore store(path);
    return hammer(store, child);
  });
  EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "\n"));
  FileStore parent(path);
  expect_totals(parent);
}

TEST(StoreMultiProcessTest, TcpStoreSharedByForkedProcesses) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  std::unique_ptr<TcpStoreServer> server = std::move(TcpStoreServer::start(options)).value();
  const int port = server->port();
  std::vector<std::string> failures = testing::run_children(kChildren, [&](int child) {
    StatusOr<std::unique_ptr<TcpStore>> store = TcpStore::connect("127.0.0.1", port, kPeerTimeout);
    if (!store.ok()) {
      std::fprintf(stderr, "child %d: %s\n", child, store.status().to_string().c_str());
      return 1;
    }
    return hammer(**store, child);
  });
  EXPECT_TRUE(failures.empty()) << fmt::format("{}", fmt::join(failures, "\n"));
  std::unique_ptr<TcpStore> parent = std::move(TcpStore::connect("127.0.0.1", port, kPeerTimeout)).value();
  expect_totals(*parent);
}

}  // namespace
}  // namespace cohort::comm
