#include "daemon/coordinator/kv_store.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/coordinator/fake_rendezvous_journal.h"

namespace cohort::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// Long enough never to expire in a passing test: waits that succeed return as soon as they can.
constexpr Duration kGenerous = seconds(30);
// For the deliberate timeouts: short, so the test stays fast.
constexpr Duration kShort = milliseconds(20);

TEST(KvStoreTest, SetThenGetReturnsTheValueAndSetReplaces) {
  KvStore store("test store");
  ASSERT_TRUE(store.set("addr/0", "10.0.0.1:1234").ok());
  EXPECT_EQ(store.get("addr/0", kGenerous).value(), "10.0.0.1:1234");
  ASSERT_TRUE(store.set("addr/0", std::string("\0bin", 4)).ok());
  EXPECT_EQ(store.get("addr/0", kGenerous).value(), std::string("\0bin", 4));
}

TEST(KvStoreTest, GetWaitsForAnotherThreadToSetTheKey) {
  KvStore store("test store");
  std::thread setter([&] { ASSERT_TRUE(store.set("nccl_id", "abc").ok()); });
  EXPECT_EQ(store.get("nccl_id", kGenerous).value(), "abc");
  setter.join();
}

TEST(KvStoreTest, AWaitThatRunsOutNamesTheMissingKeys) {
  KvStore store("store of job mnist-1 attempt 1");
  ASSERT_TRUE(store.set("present", "1").ok());
  Status status = store.wait({"present", "absent/1", "absent/2"}, kShort);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("'absent/1', 'absent/2'"), std::string::npos) << status.message();
  EXPECT_EQ(status.message().find("'present'"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("store of job mnist-1 attempt 1"), std::string::npos);
  EXPECT_EQ(store.get("absent/1", kShort).status().code(), StatusCode::kDeadlineExceeded);
}

TEST(KvStoreTest, WaitReturnsOnceEveryKeyIsSetByConcurrentWriters) {
  KvStore store("test store");
  std::vector<std::thread> writers;
  for (int rank = 0; rank < 5; ++rank) {
    writers.emplace_back(
        [&store, rank] { ASSERT_TRUE(store.set("rank/" + std::to_string(rank), "up").ok()); });
  }
  EXPECT_TRUE(store.wait({"rank/0", "rank/1", "rank/2", "rank/3", "rank/4"}, kGenerous).ok());
  for (std::thread& writer : writers) writer.join();
  EXPECT_EQ(store.num_keys().value(), 5);
  EXPECT_TRUE(store.check({"rank/0", "rank/4"}).value());
  EXPECT_FALSE(store.check({"rank/5"}).value());
}

TEST(KvStoreTest, AddCountsAtomicallyAcrossThreads) {
  KvStore store("test store");
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 100;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAddsPerThread; ++i) ASSERT_TRUE(store.add("counter", 1).ok());
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(store.get("counter", kGenerous).value(), std::to_string(kThreads * kAddsPerThread));
  EXPECT_EQ(store.add("counter", -800).value(), 0);
}

TEST(KvStoreTest, AddRejectsNonIntegersAndOverflow) {
  KvStore store("test store");
  ASSERT_TRUE(store.set("text", "12abc").ok());
  Status status = store.add("text", 1).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("holds '12abc'"), std::string::npos) << status.message();
  ASSERT_TRUE(store.set("big", std::to_string(INT64_MAX)).ok());
  EXPECT_EQ(store.add("big", 1).status().code(), StatusCode::kOutOfRange);
}

TEST(KvStoreTest, CompareSetSwapsOnlyOnAMatch) {
  KvStore store("test store");
  // A missing key matches only an empty expected value.
  EXPECT_EQ(store.compare_set("leader", "someone", "rank-1").value(), "");
  EXPECT_FALSE(store.check({"leader"}).value());
  EXPECT_EQ(store.compare_set("leader", "", "rank-0").value(), "rank-0");
  EXPECT_EQ(store.compare_set("leader", "", "rank-1").value(), "rank-0");
  EXPECT_EQ(store.compare_set("leader", "rank-0", "rank-2").value(), "rank-2");
}

TEST(KvStoreTest, DeleteReportsWhetherTheKeyExisted) {
  KvStore store("test store");
  ASSERT_TRUE(store.set("k", "v").ok());
  EXPECT_TRUE(store.delete_key("k").value());
  EXPECT_FALSE(store.delete_key("k").value());
  EXPECT_EQ(store.num_keys().value(), 0);
}

TEST(KvStoreTest, CloseWakesWaitersAtOnceAndFailsLaterCalls) {
  KvStore store("test store");
  Status waited;
  std::thread waiter([&] { waited = store.get("never", kGenerous).status(); });
  store.close(aborted_error("job x attempt 1 failed: rank 1 exited with code 1"));
  waiter.join();
  EXPECT_EQ(waited.code(), StatusCode::kAborted);
  EXPECT_NE(waited.message().find("rank 1 exited"), std::string::npos);
  EXPECT_EQ(store.set("k", "v").code(), StatusCode::kAborted);
  EXPECT_EQ(store.num_keys().status().code(), StatusCode::kAborted);
  store.close(cancelled_error("second reason"));  // the first reason wins
  EXPECT_EQ(store.set("k", "v").code(), StatusCode::kAborted);
}

// Each limit refuses the call with RESOURCE_EXHAUSTED naming the limit, and leaves the store as it was.
TEST(KvStoreTest, LimitsRefuseOversizedKeysValuesAndTooManyKeys) {
  KvStoreLimits limits;
  limits.max_key_bytes = 8;
  limits.max_value_bytes = 16;
  limits.max_keys = 3;
  limits.max_total_bytes = 40;
  KvStore store("limited store", limits);

  Status long_key = store.set("a-very-long-key", "v");
  EXPECT_EQ(long_key.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(long_key.message().find("kMaxStoreKeyBytes"), std::string::npos) << long_key.message();
  Status big_value = store.set("k", std::string(17, 'x'));
  EXPECT_EQ(big_value.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big_value.message().find("kMaxStoreValueBytes"), std::string::npos) << big_value.message();
  EXPECT_EQ(*store.num_keys(), 0);

  ASSERT_TRUE(store.set("a", std::string(16, 'x')).ok());  // 17 bytes
  ASSERT_TRUE(store.set("b", std::string(16, 'x')).ok());  // 34 bytes
  Status total = store.set("c", std::string(10, 'x'));     // would be 45 > 40
  EXPECT_EQ(total.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(total.message().find("kMaxStoreTotalBytes"), std::string::npos) << total.message();
  EXPECT_EQ(store.compare_set("c", "", std::string(10, 'x')).status().code(), StatusCode::kResourceExhausted);
  // Replacing a value counts only the difference; deleting frees its bytes.
  ASSERT_TRUE(store.set("a", "x").ok());  // 2 + 17 = 19 bytes
  ASSERT_TRUE(store.set("c", "1").ok());  // 21 bytes, 3 keys
  Status keys = store.set("d", "1");
  EXPECT_EQ(keys.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(keys.message().find("kMaxStoreKeys"), std::string::npos) << keys.message();
  EXPECT_EQ(store.add("d", 1).status().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(*store.add("c", 1), 2);  // an existing key may still change
  ASSERT_TRUE(*store.delete_key("b"));
  EXPECT_TRUE(store.set("d", std::string(16, 'y')).ok());
  EXPECT_EQ(*store.num_keys(), 3);
}

// Issue 16: with a journal, every write is journaled before it is visible, and what the journal
// holds rebuilds the store (a coordinator taking over).
TEST(KvStoreTest, WritesAreJournaledFirstAndAFailedJournalWriteChangesNothing) {
  testing::FakeRendezvousJournal journal;
  KvStore store("test store", KvStoreLimits{}, &journal);
  ASSERT_TRUE(store.set("a", "1").ok());
  ASSERT_EQ(store.add("n", 5).value_or(-1), 5);
  ASSERT_EQ(store.compare_set("c", "", "x").value_or(""), "x");
  ASSERT_EQ(store.compare_set("c", "nope", "y").value_or(""), "x");  // no swap: nothing to journal
  ASSERT_TRUE(store.set("gone", "soon").ok());
  ASSERT_TRUE(store.delete_key("gone").value_or(false));
  ASSERT_FALSE(store.delete_key("never").value_or(true));  // nothing to journal
  ASSERT_TRUE(store.get("a", kShort).ok());                // reads journal nothing
  EXPECT_EQ(journal.writes(), 5);
  EXPECT_EQ(journal.state().data, (std::map<std::string, std::string>{{"a", "1"}, {"c", "x"}, {"n", "5"}}));

  journal.set_fail(true);
  Status refused = store.set("a", "2");
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
  EXPECT_NE(refused.message().find("could not journal it, so nothing changed"), std::string::npos)
      << refused.message();
  EXPECT_EQ(store.add("n", 1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store.compare_set("c", "x", "z").status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(store.delete_key("a").status().code(), StatusCode::kUnavailable);
  journal.set_fail(false);
  EXPECT_EQ(store.get("a", kShort).value_or(""), "1");
  EXPECT_EQ(store.get("n", kShort).value_or(""), "5");
  EXPECT_EQ(store.get("c", kShort).value_or(""), "x");

  KvStore successor("test store", KvStoreLimits{}, &journal);
  successor.restore(journal.state());
  EXPECT_EQ(successor.get("a", kShort).value_or(""), "1");
  EXPECT_EQ(successor.add("n", 1).value_or(-1), 6);
  EXPECT_EQ(successor.num_keys().value_or(-1), 3);
}

// A request sent again (its answer was lost in a failover) is answered as the first time and not
// applied twice, also by a store restored from the journal.
TEST(KvStoreTest, AnAddOrDeleteSentAgainWithItsRequestIdIsAppliedOnce) {
  testing::FakeRendezvousJournal journal;
  KvStore store("test store", KvStoreLimits{}, &journal);
  ASSERT_EQ(store.add("n", 3, "client-1").value_or(-1), 3);
  ASSERT_EQ(store.add("n", 3, "client-1").value_or(-1), 3) << "the same request again";
  ASSERT_EQ(store.add("n", 3, "client-2").value_or(-1), 6) << "another request";
  ASSERT_TRUE(store.set("k", "v").ok());
  ASSERT_TRUE(store.delete_key("k", "client-3").value_or(false));
  EXPECT_TRUE(store.delete_key("k", "client-3").value_or(false)) << "answered as the first time";
  EXPECT_FALSE(store.delete_key("k", "client-4").value_or(true));

  KvStore successor("test store", KvStoreLimits{}, &journal);
  successor.restore(journal.state());
  EXPECT_EQ(successor.add("n", 3, "client-2").value_or(-1), 6) << "retried on the new leader";
  EXPECT_TRUE(successor.delete_key("k", "client-3").value_or(false));
  EXPECT_EQ(successor.add("n", 0).value_or(-1), 6);

  const std::string too_long(kMaxRequestIdBytes + 1, 'r');
  EXPECT_EQ(store.add("n", 1, too_long).status().code(), StatusCode::kInvalidArgument);
}

TEST(KvStoreTest, OnlyTheNewestAnsweredRequestsAreRemembered) {
  testing::FakeRendezvousJournal journal;
  KvStore store("test store", KvStoreLimits{}, &journal);
  for (size_t i = 0; i < kMaxAnsweredRequests + 2; ++i) {
    ASSERT_TRUE(store.add("n", 1, "r" + std::to_string(i)).ok());
  }
  const RendezvousState state = journal.state();
  ASSERT_EQ(state.answered.size(), kMaxAnsweredRequests) << "the journal forgets the oldest too";
  EXPECT_EQ(state.answered.front().id, "r2");
  EXPECT_EQ(state.answered.back().id, "r" + std::to_string(kMaxAnsweredRequests + 1));
  // The newest is still answered from memory; the forgotten one would be applied again.
  const int64_t total = static_cast<int64_t>(kMaxAnsweredRequests + 2);
  EXPECT_EQ(store.add("n", 1, "r" + std::to_string(kMaxAnsweredRequests + 1)).value_or(-1), total);
  EXPECT_EQ(store.add("n", 1, "r0").value_or(-1), total + 1);
}

}  // namespace
}  // namespace cohort::coordinator
