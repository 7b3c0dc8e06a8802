// The Store contract, run against every implementation: each must behave the same on every edge
// case ranks rely on (waits, timeouts, atomic counters, compare_set).

#include <algorithm>
#include <atomic>
#include <future>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "worker/comm/store/file_store.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/store/prefix_store.h"
#include "worker/comm/store/store_test_util.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"

namespace cohort::comm {
namespace {

using std::chrono::milliseconds;

// Short enough to keep the suite fast, long enough to tell "waited" from "returned at once".
constexpr Duration kShortTimeout = milliseconds(200);
// A wait that should succeed gets this much: never reached unless the store is broken.
constexpr Duration kLongTimeout = std::chrono::seconds(10);
// How late a timed-out wait may return on a loaded machine.
constexpr Duration kTimeoutSlack = milliseconds(1500);

// One environment per implementation: owns the store and whatever it needs (a directory, a server).
struct HashStoreEnv {
  static constexpr const char* kName = "hash store";
  std::shared_ptr<Store> store = std::make_shared<HashStore>();
};

struct FileStoreEnv {
  static constexpr const char* kName = "file store ";
  testing::TempDir dir;
  std::shared_ptr<Store> store = std::make_shared<FileStore>(dir.file("store"));
};

struct TcpStoreEnv {
  static constexpr const char* kName = "tcp store 127.0.0.1:";
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Store> store;
  TcpStoreEnv() {
    TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    server = std::move(TcpStoreServer::start(options)).value();
    store = std::move(TcpStore::connect("127.0.0.1", server->port(), kLongTimeout)).value();
  }
};

// "Rank 0 serves": the server lives inside the store object.
struct ServingTcpStoreEnv {
  static constexpr const char* kName = "tcp store 127.0.0.1:";
  std::shared_ptr<Store> store = std::move(TcpStore::create("127.0.0.1", 0, true, kLongTimeout)).value();
};

struct PrefixStoreEnv {
  static constexpr const char* kName = "hash store";
  std::shared_ptr<Store> store = std::make_shared<PrefixStore>("group0", std::make_shared<HashStore>());
};

template <typename Env>
class StoreContractTest : public ::testing::Test {
 protected:
  Store& store() { return *env_.store; }
  Env env_;
};

using StoreEnvs =
    ::testing::Types<HashStoreEnv, FileStoreEnv, TcpStoreEnv, ServingTcpStoreEnv, PrefixStoreEnv>;
TYPED_TEST_SUITE(StoreContractTest, StoreEnvs);

Duration elapsed_since(Clock::time_point start) {
  return std::chrono::duration_cast<Duration>(Clock::now() - start);
}

TYPED_TEST(StoreContractTest, SetThenGetReturnsLatestValue) {
  ASSERT_TRUE(this->store().set("a", "1").ok());
  EXPECT_EQ(this->store().get("a", kShortTimeout).value(), "1");
  ASSERT_TRUE(this->store().set("a", "two").ok());
  EXPECT_EQ(this->store().get("a", kShortTimeout).value(), "two");
}

TYPED_TEST(StoreContractTest, ValuesAreBinarySafe) {
  const std::string value("\0\x01\xff\n/key", 8);
  ASSERT_TRUE(this->store().set("bin", value).ok());
  EXPECT_EQ(this->store().get("bin", kShortTimeout).value(), value);
  ASSERT_TRUE(this->store().set("empty", "").ok());
  EXPECT_EQ(this->store().get("empty", kShortTimeout).value(), "");
  EXPECT_TRUE(this->store().check({"empty"}).value());
}

TYPED_TEST(StoreContractTest, GetWaitsForASetFromAnotherThread) {
  const auto start = Clock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(150));
    EXPECT_TRUE(this->store().set("late", "here").ok());
  });
  StatusOr<std::string> value = this->store().get("late", kLongTimeout);
  setter.join();
  ASSERT_TRUE(value.ok()) << value.status().to_string();
  EXPECT_EQ(*value, "here");
  EXPECT_GE(elapsed_since(start), milliseconds(100));
}

TYPED_TEST(StoreContractTest, GetTimesOutNamingTheKeyAndTheStore) {
  const auto start = Clock::now();
  StatusOr<std::string> value = this->store().get("never/set", kShortTimeout);
  const Duration took = elapsed_since(start);
  ASSERT_EQ(value.status().code(), StatusCode::kDeadlineExceeded) << value.status().to_string();
  EXPECT_NE(value.status().message().find("never/set\""), std::string::npos) << value.status().message();
  EXPECT_NE(value.status().message().find(TypeParam::kName), std::string::npos) << value.status().message();
  EXPECT_NE(value.status().message().find("200 ms"), std::string::npos) << value.status().message();
  EXPECT_GE(took, kShortTimeout - milliseconds(5));
  EXPECT_LE(took, kShortTimeout + kTimeoutSlack);
}

TYPED_TEST(StoreContractTest, WaitTimesOutNamingOnlyTheMissingKeys) {
  ASSERT_TRUE(this->store().set("present", "x").ok());
  const auto start = Clock::now();
  Status waited = this->store().wait({"present", "absent"}, kShortTimeout);
  ASSERT_EQ(waited.code(), StatusCode::kDeadlineExceeded) << waited.to_string();
  EXPECT_NE(waited.message().find("absent\""), std::string::npos) << waited.message();
  EXPECT_EQ(waited.message().find("present\""), std::string::npos) << waited.message();
  EXPECT_NE(waited.message().find("1 of 2 keys missing"), std::string::npos) << waited.message();
  EXPECT_LE(elapsed_since(start), kShortTimeout + kTimeoutSlack);
}

TYPED_TEST(StoreContractTest, WaitReturnsOnceEveryKeyIsSet) {
  std::thread setter([&] {
    EXPECT_TRUE(this->store().set("k1", "1").ok());
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_TRUE(this->store().set("k2", "2").ok());
  });
  Status waited = this->store().wait({"k1", "k2"}, kLongTimeout);
  setter.join();
  EXPECT_TRUE(waited.ok()) << waited.to_string();
  EXPECT_TRUE(this->store().wait({}, kShortTimeout).ok());
}

TYPED_TEST(StoreContractTest, ZeroTimeoutChecksOnce) {
  ASSERT_TRUE(this->store().set("here", "1").ok());
  EXPECT_EQ(this->store().get("here", Duration(0)).value(), "1");
  EXPECT_EQ(this->store().get("not-here", Duration(0)).status().code(), StatusCode::kDeadlineExceeded);
}

TYPED_TEST(StoreContractTest, ABlockedGetDoesNotBlockOtherCalls) {
  auto blocked = std::async(std::launch::async, [&] { return this->store().get("released", kLongTimeout); });
  std::this_thread::sleep_for(milliseconds(50));  // let the get park
  const auto start = Clock::now();
  ASSERT_TRUE(this->store().set("other", "v").ok());
  EXPECT_EQ(this->store().get("other", kShortTimeout).value(), "v");
  EXPECT_EQ(this->store().add("n", 1).value(), 1);
  EXPECT_LT(elapsed_since(start), milliseconds(1000));
  ASSERT_TRUE(this->store().set("released", "ok").ok());
  EXPECT_EQ(blocked.get().value(), "ok");
}

TYPED_TEST(StoreContractTest, OneSetWakesEveryWaiter) {
  constexpr int kWaiters = 6;
  std::vector<std::future<StatusOr<std::string>>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::async(std::launch::async, [&] { return this->store().get("go", kLongTimeout); }));
  }
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(this->store().set("go", "now").ok());
  for (auto& waiter : waiters) EXPECT_EQ(waiter.get().value(), "now");
}

TYPED_TEST(StoreContractTest, ConcurrentAddsSumExactlyAndReturnDistinctValues) {
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 100;
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        StatusOr<int64_t> sum = this->store().add("counter", 1);
        if (!sum.ok()) {
          ADD_FAILURE() << sum.status().to_string();
          return;
        }
        seen[t].push_back(*sum);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  // Atomic adds hand out every intermediate sum exactly once.
  std::vector<int64_t> all;
  for (const auto& values : seen) all.insert(all.end(), values.begin(), values.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(kThreads * kAddsPerThread);
  std::iota(expected.begin(), expected.end(), 1);
  EXPECT_EQ(all, expected);
  EXPECT_EQ(this->store().get("counter", kShortTimeout).value(), std::to_string(kThreads * kAddsPerThread));
}

TYPED_TEST(StoreContractTest, AddStartsMissingKeysAtZeroAndTakesNegativeDeltas) {
  EXPECT_EQ(this->store().add("c", 5).value(), 5);
  EXPECT_EQ(this->store().add("c", -7).value(), -2);
  EXPECT_EQ(this->store().add("c", 0).value(), -2);
  EXPECT_EQ(this->store().get("c", kShortTimeout).value(), "-2");
}

TYPED_TEST(StoreContractTest, AddOnANonIntegerIsInvalidArgumentAndChangesNothing) {
  ASSERT_TRUE(this->store().set("word", "abc").ok());
  StatusOr<int64_t> sum = this->store().add("word", 1);
  EXPECT_EQ(sum.status().code(), StatusCode::kInvalidArgument) << sum.status().to_string();
  EXPECT_NE(sum.status().message().find("abc"), std::string::npos) << sum.status().message();
  EXPECT_EQ(this->store().get("word", kShortTimeout).value(), "abc");
}

TYPED_TEST(StoreContractTest, AddWakesAWaiter) {
  auto waiter = std::async(std::launch::async, [&] { return this->store().wait({"count"}, kLongTimeout); });
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_TRUE(this->store().add("count", 3).ok());
  EXPECT_TRUE(waiter.get().ok());
}

TYPED_TEST(StoreContractTest, CompareSetOnAMissingKey) {
  // Missing and expected "" : set.
  EXPECT_EQ(this->store().compare_set("m1", "", "first").value(), "first");
  EXPECT_EQ(this->store().get("m1", kShortTimeout).value(), "first");
  // Missing and expected something: not set, "" returned.
  EXPECT_EQ(this->store().compare_set("m2", "x", "y").value(), "");
  EXPECT_FALSE(this->store().check({"m2"}).value());
}

TYPED_TEST(StoreContractTest, CompareSetSwapsOnlyOnAMatch) {
  ASSERT_TRUE(this->store().set("cas", "old").ok());
  // Mismatch: returns the current value, changes nothing.
  EXPECT_EQ(this->store().compare_set("cas", "wrong", "new").value(), "old");
  EXPECT_EQ(this->store().get("cas", kShortTimeout).value(), "old");
  // An existing key never equals "expected empty".
  EXPECT_EQ(this->store().compare_set("cas", "", "new").value(), "old");
  // Match: swaps.
  EXPECT_EQ(this->store().compare_set("cas", "old", "new").value(), "new");
  EXPECT_EQ(this->store().get("cas", kShortTimeout).value(), "new");
}

TYPED_TEST(StoreContractTest, CompareSetElectsExactlyOneWinner) {
  constexpr int kThreads = 8;
  std::atomic<int> winners{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string me = "rank" + std::to_string(t);
      StatusOr<std::string> after = this->store().compare_set("leader", "", me);
      ASSERT_TRUE(after.ok()) << after.status().to_string();
      if (*after == me) ++winners;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(winners.load(), 1);
}

TYPED_TEST(StoreContractTest, DeleteKey) {
  EXPECT_FALSE(this->store().delete_key("d").value());
  ASSERT_TRUE(this->store().set("d", "v").ok());
  EXPECT_TRUE(this->store().delete_key("d").value());
  EXPECT_FALSE(this->store().check({"d"}).value());
  EXPECT_EQ(this->store().get("d", Duration(0)).status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(this->store().delete_key("d").value());
  // A deleted counter starts again from zero.
  ASSERT_TRUE(this->store().add("d", 4).ok());
  EXPECT_EQ(this->store().add("d", 1).value(), 5);
}

TYPED_TEST(StoreContractTest, NumKeysCountsSetsAndDeletes) {
  EXPECT_EQ(this->store().num_keys().value(), 0);
  ASSERT_TRUE(this->store().set("a", "1").ok());
  ASSERT_TRUE(this->store().set("b", "2").ok());
  ASSERT_TRUE(this->store().set("a", "3").ok());
  ASSERT_TRUE(this->store().add("c", 1).ok());
  EXPECT_EQ(this->store().num_keys().value(), 3);
  ASSERT_TRUE(this->store().delete_key("a").ok());
  EXPECT_EQ(this->store().num_keys().value(), 2);
}

TYPED_TEST(StoreContractTest, CheckIsTrueOnlyWhenEveryKeyExists) {
  EXPECT_TRUE(this->store().check({}).value());
  EXPECT_FALSE(this->store().check({"x"}).value());
  ASSERT_TRUE(this->store().set("x", "1").ok());
  EXPECT_TRUE(this->store().check({"x"}).value());
  EXPECT_FALSE(this->store().check({"x", "y"}).value());
}

// PrefixStore-specific: the namespace is real, in both directions.
TEST(PrefixStoreTest, KeysLiveUnderThePrefixInTheUnderlyingStore) {
  auto base = std::make_shared<HashStore>();
  PrefixStore group_a("a", base);
  PrefixStore group_b("b", base);
  ASSERT_TRUE(group_a.set("k", "from a").ok());
  ASSERT_TRUE(group_b.set("k", "from b").ok());
  EXPECT_EQ(base->get("a/k", kShortTimeout).value(), "from a");
  EXPECT_EQ(group_b.get("k", kShortTimeout).value(), "from b");
  EXPECT_FALSE(group_a.check({"b/k"}).value());
  Status waited = group_a.wait({"missing"}, milliseconds(20));
  EXPECT_NE(waited.message().find("\"a/missing\""), std::string::npos) << waited.message();
}

}  // namespace
}  // namespace cohort::comm
