#include "daemon/coordinator/rendezvous.h"

#include <chrono>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/coordinator/fake_rendezvous_journal.h"

namespace cohort::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr Duration kGenerous = seconds(30);    // never reached when the test passes
constexpr Duration kShort = milliseconds(20);  // for the deliberate timeouts

// `nodes` nodes named node-0.. at 10.0.0.<n>:7071, `per_node` ranks each, node-major ranks.
Placement placement(int nodes, int per_node) {
  Placement p;
  for (int n = 0; n < nodes; ++n) {
    p.nodes.push_back(NodeAssignment{"node-" + std::to_string(n),
                                     "10.0.0." + std::to_string(n + 1) + ":7071",
                                     n,
                                     n * per_node,
                                     per_node,
                                     {}});
  }
  return p;
}

// Every slot of the placement joins from its own thread; returns the answers by (node, slot).
std::vector<StatusOr<RankAssignment>> join_all(Rendezvous& rendezvous, int nodes, int per_node) {
  std::vector<StatusOr<RankAssignment>> answers(static_cast<size_t>(nodes * per_node),
                                                StatusOr<RankAssignment>(internal_error("not joined")));
  std::vector<std::thread> threads;
  for (int n = 0; n < nodes; ++n) {
    for (int slot = 0; slot < per_node; ++slot) {
      threads.emplace_back([&, n, slot] {
        answers[static_cast<size_t>(n * per_node + slot)] =
            rendezvous.join("node-" + std::to_string(n), slot, kGenerous);
      });
    }
  }
  for (std::thread& thread : threads) thread.join();
  return answers;
}

class RendezvousSizesTest : public ::testing::TestWithParam<std::pair<int, int>> {};

TEST_P(RendezvousSizesTest, EveryJoinerGetsTheRankThePlacementGaveItsSlot) {
  const auto [nodes, per_node] = GetParam();
  Rendezvous rendezvous("job-1", 1, placement(nodes, per_node));
  std::vector<StatusOr<RankAssignment>> answers = join_all(rendezvous, nodes, per_node);
  std::set<int> ranks;
  for (int n = 0; n < nodes; ++n) {
    for (int slot = 0; slot < per_node; ++slot) {
      const auto& answer = answers[static_cast<size_t>(n * per_node + slot)];
      ASSERT_TRUE(answer.ok()) << answer.status().to_string();
      EXPECT_EQ(answer->rank, n * per_node + slot);
      EXPECT_EQ(answer->world_size, nodes * per_node);
      EXPECT_EQ(answer->local_rank, slot);
      EXPECT_EQ(answer->local_world_size, per_node);
      EXPECT_EQ(answer->node_rank, n);
      EXPECT_EQ(answer->num_nodes, nodes);
      EXPECT_EQ(answer->master_address, "10.0.0.1");
      ranks.insert(answer->rank);
    }
  }
  EXPECT_EQ(static_cast<int>(ranks.size()), nodes * per_node);
}

// World sizes 1, 2, 3, 4, 5 and 8, powers of two and not, one node and several.
INSTANTIATE_TEST_SUITE_P(Sizes, RendezvousSizesTest,
                         ::testing::Values(std::make_pair(1, 1), std::make_pair(1, 2), std::make_pair(3, 1),
                                           std::make_pair(2, 2), std::make_pair(5, 1), std::make_pair(2, 4)));

TEST(RendezvousTest, AJoinThatRunsOutNamesTheRanksThatNeverCame) {
  Rendezvous rendezvous("mnist-4", 2, placement(2, 2));
  auto answer = rendezvous.join("node-0", 1, kShort);
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), StatusCode::kDeadlineExceeded);
  const std::string message = answer.status().message();
  EXPECT_NE(message.find("job mnist-4 attempt 2"), std::string::npos) << message;
  EXPECT_NE(message.find("1 of 4 rank(s) joined"), std::string::npos) << message;
  EXPECT_NE(message.find("missing rank(s) 0 (node node-0); 2, 3 (node node-1)"), std::string::npos)
      << message;
}

TEST(RendezvousTest, ARetriedJoinIsCountedOnceAndGetsTheSameAnswer) {
  Rendezvous rendezvous("job", 1, placement(1, 2));
  ASSERT_FALSE(rendezvous.join("node-0", 0, kShort).ok());  // alone: times out, stays recorded
  std::thread other([&] { ASSERT_TRUE(rendezvous.join("node-0", 1, kGenerous).ok()); });
  auto again = rendezvous.join("node-0", 0, kGenerous);
  other.join();
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->rank, 0);
}

TEST(RendezvousTest, JoinsFromOutsideThePlacementAreRejected) {
  Rendezvous rendezvous("job", 1, placement(2, 2));
  Status status = rendezvous.join("node-9", 0, kShort).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("node 'node-9' is not in its placement (nodes: node-0, node-1)"),
            std::string::npos)
      << status.message();
  status = rendezvous.join("node-1", 2, kShort).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("local slot 2 is outside node 'node-1''s 2 slot(s)"), std::string::npos)
      << status.message();
}

TEST(RendezvousTest, CloseWakesABlockedJoinWithTheReason) {
  Rendezvous rendezvous("job", 1, placement(2, 1));
  Status joined;
  std::thread joiner([&] { joined = rendezvous.join("node-0", 0, kGenerous).status(); });
  rendezvous.close(aborted_error("job job attempt 1 failed: node node-1 lost"));
  joiner.join();
  EXPECT_EQ(joined.code(), StatusCode::kAborted);
  EXPECT_NE(joined.message().find("node node-1 lost"), std::string::npos);
  // The store closes with it.
  EXPECT_EQ(rendezvous.store().set("k", "v").code(), StatusCode::kAborted);
}

TEST(RendezvousTest, ABarrierOpensOnlyWhenEveryRankArrivesAndIsReusable) {
  constexpr int kWorld = 5;
  constexpr int kRounds = 3;
  Rendezvous rendezvous("job", 1, placement(kWorld, 1));
  std::vector<std::thread> ranks;
  std::vector<Status> results(kWorld * kRounds);
  for (int rank = 0; rank < kWorld; ++rank) {
    ranks.emplace_back([&, rank] {
      for (int round = 0; round < kRounds; ++round) {
        // Each rank publishes a key before the barrier; after it, every rank's key must be there.
        ASSERT_TRUE(rendezvous.store().set(fmt::format("r{}/{}", round, rank), "x").ok());
        results[static_cast<size_t>(round * kWorld + rank)] = rendezvous.barrier(rank, kGenerous);
        for (int peer = 0; peer < kWorld; ++peer) {
          EXPECT_TRUE(rendezvous.store().check({fmt::format("r{}/{}", round, peer)}).value());
        }
      }
    });
  }
  for (std::thread& rank : ranks) rank.join();
  for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.to_string();
}

TEST(RendezvousTest, ABarrierThatRunsOutNamesTheMissingRanksAndWithdrawsTheCaller) {
  Rendezvous rendezvous("job", 1, placement(1, 3));
  Status status = rendezvous.barrier(1, kShort);
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("rank(s) 0, 2 (node node-0) never arrived"), std::string::npos)
      << status.message();
  // Withdrawn: rank 1 may wait again, and a full barrier still opens.
  std::thread r0([&] { EXPECT_TRUE(rendezvous.barrier(0, kGenerous).ok()); });
  std::thread r2([&] { EXPECT_TRUE(rendezvous.barrier(2, kGenerous).ok()); });
  EXPECT_TRUE(rendezvous.barrier(1, kGenerous).ok());
  r0.join();
  r2.join();
}

TEST(RendezvousTest, ALeavingRankAbortsTheBarrierForTheOthers) {
  Rendezvous rendezvous("job", 1, placement(1, 3));
  Status waited;
  std::thread r0([&] { waited = rendezvous.barrier(0, kGenerous); });
  ASSERT_TRUE(rendezvous.leave(2).ok());
  r0.join();
  EXPECT_EQ(waited.code(), StatusCode::kAborted);
  EXPECT_NE(waited.message().find("rank(s) 2 left"), std::string::npos) << waited.message();
  EXPECT_EQ(rendezvous.barrier(1, kGenerous).code(), StatusCode::kAborted);
  EXPECT_FALSE(rendezvous.all_left());
  ASSERT_TRUE(rendezvous.leave(0).ok());
  ASSERT_TRUE(rendezvous.leave(1).ok());
  ASSERT_TRUE(rendezvous.leave(1).ok());  // idempotent
  EXPECT_TRUE(rendezvous.all_left());
  EXPECT_EQ(rendezvous.leave(3).code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, BarrierRejectsRanksOutsideTheWorld) {
  Rendezvous rendezvous("job", 1, placement(1, 2));
  EXPECT_EQ(rendezvous.barrier(2, kShort).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(rendezvous.barrier(-1, kShort).code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, MasterAddressIsTheHostOfNodeRankZero) {
  EXPECT_EQ(host_of_address("10.0.0.1:7071"), "10.0.0.1");
  EXPECT_EQ(host_of_address("node-a.cluster:7071"), "node-a.cluster");
  EXPECT_EQ(host_of_address("[fe80::1]:7071"), "fe80::1");
  EXPECT_EQ(host_of_address("fe80::1"), "fe80::1");
  EXPECT_EQ(host_of_address("node-a"), "node-a");
  Rendezvous rendezvous("job", 1, placement(3, 1));
  EXPECT_EQ(rendezvous.master_address(), "10.0.0.1");
}

// Issue 16: the join is journaled once, when it completes, before anyone is answered; a new
// Rendezvous restored from the journal (a coordinator taking over) answers a rank that joins again
// at once, with the same rank, though the other ranks never join it again.
TEST(RendezvousTest, TheCompletedJoinIsJournaledOnceAndARestoredRendezvousAnswersARejoinAtOnce) {
  auto journal = std::make_shared<testing::FakeRendezvousJournal>();
  Rendezvous rendezvous("job", 1, placement(2, 2), journal);
  std::vector<StatusOr<RankAssignment>> answers = join_all(rendezvous, 2, 2);
  for (const auto& answer : answers) ASSERT_TRUE(answer.ok()) << answer.status().to_string();
  EXPECT_EQ(journal->writes(), 1) << "one write per completed join, none per rank";
  EXPECT_EQ(journal->state().progress.joined, (std::set<int>{0, 1, 2, 3}));
  ASSERT_TRUE(rendezvous.join("node-1", 0, kShort).ok()) << "a retried join";
  EXPECT_EQ(journal->writes(), 1) << "a retried join writes nothing";
  ASSERT_TRUE(rendezvous.store().set("addr/0", "a0").ok());

  Rendezvous successor("job", 1, placement(2, 2), journal);
  ASSERT_TRUE(successor.restore(journal->state()).ok());
  auto again = successor.join("node-1", 1, kShort);  // nobody else joins: must not wait
  ASSERT_TRUE(again.ok()) << again.status().to_string();
  EXPECT_EQ(again->rank, answers[3]->rank);
  EXPECT_EQ(again->master_address, answers[3]->master_address);
  EXPECT_EQ(successor.store().get("addr/0", kShort).value_or(""), "a0");

  RendezvousState bad;
  bad.progress.joined = {0, 7};
  EXPECT_EQ(Rendezvous("job", 1, placement(2, 2)).restore(bad).code(), StatusCode::kInvalidArgument);
}

TEST(RendezvousTest, AJoinThatCannotBeJournaledIsNotCountedAndAnsweredUnavailable) {
  auto journal = std::make_shared<testing::FakeRendezvousJournal>();
  Rendezvous rendezvous("job", 1, placement(2, 1), journal);
  // Rank 0 joins alone and times out; its join stays recorded (a retry is still counted).
  ASSERT_EQ(rendezvous.join("node-0", 0, kShort).status().code(), StatusCode::kDeadlineExceeded);
  journal->set_fail(true);
  Status refused = rendezvous.join("node-1", 0, kShort).status();
  EXPECT_EQ(refused.code(), StatusCode::kUnavailable) << refused.to_string();
  EXPECT_NE(refused.message().find("could not journal it, so nothing changed"), std::string::npos)
      << refused.message();
  EXPECT_TRUE(rendezvous.progress().joined.empty()) << "not complete: rank 1's join was not counted";
  EXPECT_EQ(rendezvous.join("node-0", 0, kShort).status().code(), StatusCode::kDeadlineExceeded)
      << "rank 0 still waits for rank 1";
  journal->set_fail(false);
  ASSERT_TRUE(rendezvous.join("node-1", 0, kShort).ok()) << "rank 1's client sends it again";
  ASSERT_TRUE(rendezvous.join("node-0", 0, kShort).ok());
  EXPECT_EQ(journal->state().progress.joined, (std::set<int>{0, 1}));
}

TEST(RendezvousTest, BarrierOpeningsAndLeavesAreJournaledAndRestored) {
  auto journal = std::make_shared<testing::FakeRendezvousJournal>();
  Rendezvous rendezvous("job", 1, placement(2, 1), journal);
  for (int round = 0; round < 2; ++round) {
    std::thread other([&] { EXPECT_TRUE(rendezvous.barrier(1, kGenerous).ok()); });
    EXPECT_TRUE(rendezvous.barrier(0, kGenerous).ok());
    other.join();
  }
  EXPECT_EQ(journal->writes(), 2) << "one write per opening";
  EXPECT_EQ(journal->state().progress.barrier_generation, 2);
  ASSERT_TRUE(rendezvous.leave(1).ok());
  ASSERT_TRUE(rendezvous.leave(1).ok());
  EXPECT_EQ(journal->writes(), 3) << "a repeated leave writes nothing";
  EXPECT_EQ(journal->state().progress.left, (std::set<int>{1}));

  Rendezvous successor("job", 1, placement(2, 1), journal);
  ASSERT_TRUE(successor.restore(journal->state()).ok());
  EXPECT_EQ(successor.progress().barrier_generation, 2);
  EXPECT_EQ(successor.barrier(0, kGenerous).code(), StatusCode::kAborted) << "rank 1 left";
}

// A barrier call sent again after a failover (the old leader opened the barrier and journaled it,
// the answer was lost): with its generation, answered at once and counted in no later barrier.
TEST(RendezvousTest, ABarrierSentAgainWithItsGenerationAfterAFailoverIsAnsweredOnceAndCountedOnce) {
  auto journal = std::make_shared<testing::FakeRendezvousJournal>();
  Rendezvous leader("job", 1, placement(3, 1), journal);
  {
    std::vector<std::thread> ranks;
    for (int rank = 1; rank < 3; ++rank)
      ranks.emplace_back([&, rank] { EXPECT_TRUE(leader.barrier(rank, kGenerous, 0).ok()); });
    EXPECT_TRUE(leader.barrier(0, kGenerous, 0).ok());
    for (std::thread& thread : ranks) thread.join();
  }
  ASSERT_EQ(journal->state().progress.barrier_generation, 1);

  // The leader dies before rank 0's answer reaches it; the successor restores the opening.
  Rendezvous successor("job", 1, placement(3, 1), journal);
  ASSERT_TRUE(successor.restore(journal->state()).ok());
  EXPECT_TRUE(successor.barrier(0, kShort, 0).ok()) << "barrier 0 opened before the failover";
  // Rank 0's call sent again (twice, even) was not counted in barrier 1: ranks 1 and 2 alone do
  // not open it, and its timeout names rank 0 as missing.
  EXPECT_TRUE(successor.barrier(0, kShort, 0).ok());
  std::thread one([&] {
    Status alone = successor.barrier(1, milliseconds(200), 1);
    EXPECT_EQ(alone.code(), StatusCode::kDeadlineExceeded) << alone.to_string();
    EXPECT_NE(alone.message().find("rank(s) 0 (node node-0)"), std::string::npos) << alone.message();
  });
  Status two = successor.barrier(2, milliseconds(200), 1);
  one.join();
  EXPECT_EQ(two.code(), StatusCode::kDeadlineExceeded)
      << "barrier 1 opened without rank 0: " << two.to_string();
  EXPECT_EQ(successor.progress().barrier_generation, 1);

  // Barrier 1 then opens once every rank calls it, each counted once.
  {
    std::vector<std::thread> ranks;
    for (int rank = 1; rank < 3; ++rank)
      ranks.emplace_back([&, rank] { EXPECT_TRUE(successor.barrier(rank, kGenerous, 1).ok()); });
    EXPECT_TRUE(successor.barrier(0, kGenerous, 1).ok());
    for (std::thread& thread : ranks) thread.join();
  }
  EXPECT_EQ(successor.progress().barrier_generation, 2);
  EXPECT_EQ(journal->state().progress.barrier_generation, 2);
  EXPECT_EQ(successor.barrier(0, kShort, 3).code(), StatusCode::kInvalidArgument)
      << "a generation beyond the barriers opened";
  EXPECT_EQ(successor.barrier(0, kShort, -1).code(), StatusCode::kInvalidArgument) << "a negative generation";
}

TEST(RendezvousTest, ABarrierCallSentAgainWhileTheFirstWaitsWaitsWithItCountedOnce) {
  Rendezvous rendezvous("job", 1, placement(2, 1));
  Status first, again;
  std::thread a([&] { first = rendezvous.barrier(0, kGenerous, 0); });
  std::thread b([&] { again = rendezvous.barrier(0, kGenerous, 0); });
  // Both calls usually wait by now (if not, a late one finds the barrier open: OK too).
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(rendezvous.progress().barrier_generation, 0) << "rank 0 counted twice opened the barrier";
  ASSERT_TRUE(rendezvous.barrier(1, kGenerous, 0).ok());
  a.join();
  b.join();
  EXPECT_TRUE(first.ok()) << first.to_string();
  EXPECT_TRUE(again.ok()) << again.to_string();
  EXPECT_EQ(rendezvous.progress().barrier_generation, 1);
}

}  // namespace
}  // namespace cohort::coordinator
