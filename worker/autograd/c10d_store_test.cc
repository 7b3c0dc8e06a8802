// C10dStore against a real c10d::TCPStore server in this process (libtorch's own, the one torchrun's
// agent runs), and env:// joining that server as torchrun's static rendezvous makes it.

#include "worker/autograd/c10d_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/init/init_options.h"

namespace cohort::autograd {
namespace {

using std::chrono::milliseconds;

// Short enough to keep the test fast, long enough to tell "waited" from "returned at once".
constexpr comm::Duration kShortTimeout = milliseconds(200);
// A wait that should succeed gets this much: never reached unless something is broken.
constexpr comm::Duration kLongTimeout = std::chrono::seconds(10);
// How late a timed-out wait may return on a loaded machine.
constexpr comm::Duration kTimeoutSlack = milliseconds(1500);

// A c10d server on 127.0.0.1 (an ephemeral port), as torchrun's agent serves one.
class C10dStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = kLongTimeout;
    server_ = std::make_unique<c10d::TCPStore>("127.0.0.1", options);
    port_ = server_->getPort();
    ASSERT_GT(port_, 0);
  }

  std::unique_ptr<C10dStore> connect() {
    C10dStoreOptions options;
    options.port = port_;
    options.timeout = kLongTimeout;
    StatusOr<std::unique_ptr<C10dStore>> store = C10dStore::connect(options);
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  std::unique_ptr<c10d::TCPStore> server_;  // also a client: reads what the adapter wrote
  int port_ = 0;
};

TEST_F(C10dStoreTest, SetAndGetBinaryValuesThatTheServerSees) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  const std::string value("a\0b\xff", 4);
  ASSERT_TRUE(store->set("k", value).ok());
  StatusOr<std::string> got = store->get("k", kShortTimeout);
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, value);
  const std::vector<uint8_t> raw = server_->get("k");
  EXPECT_EQ(std::string(raw.begin(), raw.end()), value);
  ASSERT_TRUE(store->set("k", "second").ok());
  EXPECT_EQ(store->get("k", kShortTimeout).value(), "second");
}

TEST_F(C10dStoreTest, GetWaitsForALaterSet) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  auto writer = std::async(std::launch::async, [this] {
    std::this_thread::sleep_for(kShortTimeout);  // the reader must really be waiting
    server_->set("late", std::vector<uint8_t>{'x'});
  });
  StatusOr<std::string> got = store->get("late", kLongTimeout);
  writer.get();
  ASSERT_TRUE(got.ok()) << got.status().to_string();
  EXPECT_EQ(*got, "x");
}

TEST_F(C10dStoreTest, TimedOutWaitNamesTheKeysAndTheStoreStillWorks) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  const auto start = std::chrono::steady_clock::now();
  Status waited = store->wait({"never", "also-never"}, kShortTimeout);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(waited.code(), StatusCode::kDeadlineExceeded) << waited.to_string();
  EXPECT_NE(waited.message().find("never, also-never"), std::string::npos) << waited.to_string();
  EXPECT_NE(waited.message().find(fmt::format("127.0.0.1:{}", port_)), std::string::npos)
      << waited.to_string();
  EXPECT_GE(elapsed, kShortTimeout - milliseconds(10));
  EXPECT_LT(elapsed, kShortTimeout + kTimeoutSlack);

  // The abandoned wait's late reply must not be read as the answer to a later operation.
  server_->set("never", std::vector<uint8_t>{'1'});
  server_->set("also-never", std::vector<uint8_t>{'2'});
  StatusOr<int64_t> added = store->add("counter", 5);
  ASSERT_TRUE(added.ok()) << added.status().to_string();
  EXPECT_EQ(*added, 5);
  EXPECT_EQ(store->get("never", kShortTimeout).value(), "1");

  StatusOr<std::string> missing = store->get("missing", kShortTimeout);
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("missing"), std::string::npos) << missing.status().to_string();
}

TEST_F(C10dStoreTest, ZeroTimeoutWaitLooksOnceInsteadOfForever) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->wait({"absent"}, comm::Duration::zero()).code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(store->set("present", "1").ok());
  EXPECT_TRUE(store->wait({"present"}, comm::Duration::zero()).ok());
}

TEST_F(C10dStoreTest, AddCountsFromZeroAndRefusesNonIntegers) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->add("n", 3).value(), 3);
  EXPECT_EQ(store->add("n", -5).value(), -2);
  EXPECT_EQ(store->get("n", kShortTimeout).value(), "-2");
  ASSERT_TRUE(store->set("text", "abc").ok());
  StatusOr<int64_t> bad = store->add("text", 1);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status().to_string();
  EXPECT_NE(bad.status().message().find("\"abc\""), std::string::npos) << bad.status().to_string();
  EXPECT_EQ(store->add("n", 2).value(), 0);  // the connection survived
}

TEST_F(C10dStoreTest, CompareSetFollowsTheStoreContract) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  // Missing key, non-empty expected: nothing set, "" back (c10d itself answers `expected`).
  EXPECT_EQ(store->compare_set("c", "old", "new").value(), "");
  EXPECT_FALSE(store->check({"c"}).value());
  EXPECT_EQ(store->compare_set("c", "same", "same").value(), "");
  EXPECT_FALSE(store->check({"c"}).value());
  // Missing key, empty expected: created.
  EXPECT_EQ(store->compare_set("c", "", "first").value(), "first");
  // Mismatch: the current value back, unchanged.
  EXPECT_EQ(store->compare_set("c", "wrong", "second").value(), "first");
  EXPECT_EQ(store->get("c", kShortTimeout).value(), "first");
  // Match: swapped.
  EXPECT_EQ(store->compare_set("c", "first", "second").value(), "second");
  EXPECT_EQ(store->compare_set("c", "second", "second").value(), "second");
  EXPECT_EQ(store->get("c", kShortTimeout).value(), "second");
}

TEST_F(C10dStoreTest, CheckDeleteAndNumKeys) {
  auto store = connect();
  ASSERT_NE(store, nullptr);
  const int64_t before = store->num_keys().value();
  ASSERT_TRUE(store->set("a", "1").ok());
  ASSERT_TRUE(store->set("b", "2").ok());
  EXPECT_EQ(store->num_keys().value(), before + 2);
  EXPECT_TRUE(store->check({"a", "b"}).value());
  EXPECT_FALSE(store->check({"a", "c"}).value());
  EXPECT_TRUE(store->delete_key("a").value());
  EXPECT_FALSE(store->delete_key("a").value());
  EXPECT_FALSE(store->check({"a"}).value());
  EXPECT_EQ(store->num_keys().value(), before + 1);
}

TEST(C10dStoreConnectTest, NoServerIsUnavailableNamingTheAddress) {
  // A port that was just free: nothing listens there.
  int port = 0;
  {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    c10d::TCPStore server("127.0.0.1", options);
    port = server.getPort();
  }
  C10dStoreOptions options;
  options.port = port;
  options.timeout = kShortTimeout;
  StatusOr<std::unique_ptr<C10dStore>> store = C10dStore::connect(options);
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kUnavailable) << store.status().to_string();
  EXPECT_NE(store.status().message().find(fmt::format("127.0.0.1:{}", port)), std::string::npos)
      << store.status().to_string();
  EXPECT_NE(store.status().message().find("MASTER_PORT"), std::string::npos) << store.status().to_string();

  options.port = 70000;
  EXPECT_EQ(C10dStore::connect(options).status().code(), StatusCode::kInvalidArgument);
}

// env:// with TORCHELASTIC_USE_AGENT_STORE=True, as torchrun's static rendezvous starts workers:
// both ranks join the server as clients (rank 0 does not try to serve on its port), under the
// attempt's key prefix. Linking this library registered the connector.
TEST_F(C10dStoreTest, EnvInitJoinsTheAgentStoreUnderTheAttemptPrefix) {
  auto resolve = [this](int rank) {
    comm::InitOptions options = comm::InitOptions::from_url("env://");
    options.timeout = kLongTimeout;
    options.env = comm::environment_from({{"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                          {"TORCHELASTIC_RESTART_COUNT", "2"},
                                          {"MASTER_ADDR", "127.0.0.1"},
                                          {"MASTER_PORT", std::to_string(port_)},
                                          {"RANK", std::to_string(rank)},
                                          {"WORLD_SIZE", "2"},
                                          {"COHORT_NODE_ID", "node-a"}});
    return comm::resolve_init(options);
  };
  auto rank1 = std::async(std::launch::async, resolve, 1);
  StatusOr<comm::Bootstrap> boot0 = resolve(0);
  StatusOr<comm::Bootstrap> boot1 = rank1.get();
  ASSERT_TRUE(boot0.ok()) << boot0.status().to_string();
  ASSERT_TRUE(boot1.ok()) << boot1.status().to_string();
  EXPECT_EQ(boot0->rank, 0);
  EXPECT_EQ(boot1->rank, 1);
  EXPECT_EQ(boot0->local_world_size, 2);  // derived through the agent's store
  EXPECT_EQ(boot1->local_rank, 1);

  ASSERT_TRUE(boot0->store->set("hello", "from rank 0").ok());
  EXPECT_EQ(boot1->store->get("hello", kShortTimeout).value(), "from rank 0");
  EXPECT_TRUE(server_->check({"cohort/attempt_2/hello"}));
  EXPECT_FALSE(server_->check({"hello"}));
}

}  // namespace
}  // namespace cohort::autograd
