#include "daemon/coordinator/scheduler.h"

#include <algorithm>
#include <map>

#include <gtest/gtest.h>

namespace cohort::coordinator {
namespace {

NodeCapacity capacity(const std::string& id, int free_slots, std::vector<int> free_gpus = {}) {
  return NodeCapacity{id, id + ":7071", free_slots, std::move(free_gpus)};
}

std::vector<std::string> placed_ids(const ScheduleResult& result) {
  std::vector<std::string> ids;
  for (const ScheduledJob& job : result.placed) ids.push_back(job.job_id);
  return ids;
}

TEST(SchedulerTest, RanksAreAssignedNodeMajor) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("job", 1, SlotRequest{2, 3, 0}).ok());
  ScheduleResult result = scheduler.schedule({capacity("node-a", 3), capacity("node-b", 3)});
  ASSERT_EQ(result.placed.size(), 1u);
  const Placement& placement = result.placed[0].placement;
  ASSERT_EQ(placement.nodes.size(), 2u);
  EXPECT_EQ(placement.world_size(), 6);
  for (int node_rank = 0; node_rank < 2; ++node_rank) {
    const NodeAssignment& node = placement.nodes[static_cast<size_t>(node_rank)];
    EXPECT_EQ(node.node_rank, node_rank);
    EXPECT_EQ(node.first_rank, node_rank * 3);
    EXPECT_EQ(node.num_ranks, 3);
  }
  EXPECT_EQ(placement.nodes[0].node_id, "node-a");
  EXPECT_EQ(placement.nodes[1].address, "node-b:7071");
  EXPECT_EQ(placement.node_of_rank(4)->node_id, "node-b");
  EXPECT_EQ(scheduler.size(), 0u);
}

TEST(SchedulerTest, AGangIsPlacedWholeOrNotAtAll) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("gang", 1, SlotRequest{2, 2, 0}).ok());
  // One node fits, the other has a single free slot: nothing may be placed.
  ScheduleResult result = scheduler.schedule({capacity("node-a", 2), capacity("node-b", 1)});
  EXPECT_TRUE(result.placed.empty());
  EXPECT_EQ(result.blocked_job_id, "gang");
  EXPECT_NE(result.blocked_reason.find("needs 2 node(s) with 2 free slot(s) each; 1 of 2"), std::string::npos)
      << result.blocked_reason;
  EXPECT_TRUE(scheduler.contains("gang"));

  result = scheduler.schedule({capacity("node-a", 2), capacity("node-b", 2)});
  EXPECT_EQ(placed_ids(result), (std::vector<std::string>{"gang"}));
}

TEST(SchedulerTest, TheHeadOfTheQueueBlocksLaterJobsThatWouldFit) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("big", 1, SlotRequest{3, 1, 0}).ok());
  ASSERT_TRUE(scheduler.enqueue("small", 2, SlotRequest{1, 1, 0}).ok());
  ScheduleResult result = scheduler.schedule({capacity("node-a", 1), capacity("node-b", 1)});
  EXPECT_TRUE(result.placed.empty()) << "strict FIFO: 'small' must wait behind 'big'";
  EXPECT_EQ(result.blocked_job_id, "big");
  EXPECT_EQ(scheduler.queued(), (std::vector<std::string>{"big", "small"}));

  // Once the head fits, it goes first and takes the capacity; the next waits for more.
  result = scheduler.schedule({capacity("node-a", 1), capacity("node-b", 1), capacity("node-c", 1)});
  EXPECT_EQ(placed_ids(result), (std::vector<std::string>{"big"}));
  EXPECT_EQ(result.blocked_job_id, "small");
}

TEST(SchedulerTest, CapacityTakenByOneJobIsNotOfferedToTheNext) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("first", 1, SlotRequest{1, 2, 0}).ok());
  ASSERT_TRUE(scheduler.enqueue("second", 2, SlotRequest{1, 2, 0}).ok());
  ASSERT_TRUE(scheduler.enqueue("third", 3, SlotRequest{1, 2, 0}).ok());
  ScheduleResult result = scheduler.schedule({capacity("node-a", 4)});
  EXPECT_EQ(placed_ids(result), (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(result.blocked_job_id, "third");
}

TEST(SchedulerTest, QueueOrderFollowsSequenceSoARestartedJobKeepsItsPlace) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("later", 5, SlotRequest{1, 1, 0}).ok());
  ASSERT_TRUE(scheduler.enqueue("restarted", 2, SlotRequest{1, 1, 0}).ok());
  EXPECT_EQ(scheduler.queued(), (std::vector<std::string>{"restarted", "later"}));
  ScheduleResult result = scheduler.schedule({capacity("node-a", 1)});
  EXPECT_EQ(placed_ids(result), (std::vector<std::string>{"restarted"}));
}

TEST(SchedulerTest, BestFitPrefersTheFullestNodeThatFits) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("job", 1, SlotRequest{1, 2, 0}).ok());
  ScheduleResult result =
      scheduler.schedule({capacity("roomy", 8), capacity("snug", 2), capacity("tiny", 1)});
  ASSERT_EQ(result.placed.size(), 1u);
  EXPECT_EQ(result.placed[0].placement.nodes[0].node_id, "snug");
}

TEST(SchedulerTest, GpusAreReservedPerProcessAndHandedOutInLocalRankOrder) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("gpu-job", 1, SlotRequest{1, 2, 2}).ok());
  // Plenty of slots but only three free GPUs: does not qualify.
  ScheduleResult result = scheduler.schedule({capacity("node-a", 8, {0, 1, 3})});
  EXPECT_TRUE(result.placed.empty());
  EXPECT_NE(result.blocked_reason.find("4 free GPU(s)"), std::string::npos) << result.blocked_reason;

  result = scheduler.schedule({capacity("node-a", 8, {1, 2, 4, 5, 7})});
  ASSERT_EQ(result.placed.size(), 1u);
  const NodeAssignment& node = result.placed[0].placement.nodes[0];
  EXPECT_EQ(node.gpus, (std::vector<int>{1, 2, 4, 5}));
  EXPECT_EQ(node.gpus_of(0), (std::vector<int>{1, 2}));
  EXPECT_EQ(node.gpus_of(1), (std::vector<int>{4, 5}));
}

TEST(SchedulerTest, GpusReservedByOneJobAreNotOfferedToTheNextAndCpuJobsIgnoreGpus) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("first", 1, SlotRequest{2, 1, 2}).ok());
  ASSERT_TRUE(scheduler.enqueue("second", 2, SlotRequest{1, 2, 1}).ok());
  ASSERT_TRUE(scheduler.enqueue("third", 3, SlotRequest{1, 1, 1}).ok());
  ASSERT_TRUE(scheduler.enqueue("cpu", 4, SlotRequest{1, 1, 0}).ok());
  // Slots everywhere, but only 4 + 2 GPUs: "first" takes two on each node, "second" the last two
  // of node-a; "third" finds slots but no GPU left and blocks the queue.
  ScheduleResult result = scheduler.schedule({capacity("node-a", 8, {0, 1, 2, 3}), capacity("node-b", 8, {0, 1})});
  ASSERT_EQ(result.placed.size(), 2u);
  std::map<std::string, std::vector<int>> first;
  for (const NodeAssignment& node : result.placed[0].placement.nodes) first[node.node_id] = node.gpus;
  EXPECT_EQ(first["node-a"].size(), 2u);
  EXPECT_EQ(first["node-b"], (std::vector<int>{0, 1}));
  ASSERT_EQ(result.placed[1].placement.nodes.size(), 1u);
  const NodeAssignment& second = result.placed[1].placement.nodes[0];
  EXPECT_EQ(second.node_id, "node-a");
  EXPECT_EQ(second.gpus.size(), 2u);
  for (int gpu : second.gpus) {
    EXPECT_EQ(std::count(first["node-a"].begin(), first["node-a"].end(), gpu), 0) << "GPU " << gpu << " given twice";
  }
  EXPECT_EQ(result.blocked_job_id, "third");
  EXPECT_NE(result.blocked_reason.find("1 free GPU(s)"), std::string::npos) << result.blocked_reason;

  // The CPU job behind it places once "third" is gone, on a node with no free GPU at all.
  EXPECT_TRUE(scheduler.remove("third"));
  result = scheduler.schedule({capacity("node-c", 1, {})});
  ASSERT_EQ(result.placed.size(), 1u);
  EXPECT_EQ(result.placed[0].job_id, "cpu");
  EXPECT_TRUE(result.placed[0].placement.nodes[0].gpus.empty());
}

TEST(SchedulerTest, RemoveTakesAQueuedJobOut) {
  Scheduler scheduler;
  ASSERT_TRUE(scheduler.enqueue("a", 1, SlotRequest{}).ok());
  ASSERT_TRUE(scheduler.enqueue("b", 2, SlotRequest{}).ok());
  EXPECT_TRUE(scheduler.remove("a"));
  EXPECT_FALSE(scheduler.remove("a"));
  EXPECT_EQ(scheduler.queued(), (std::vector<std::string>{"b"}));
}

TEST(SchedulerTest, MalformedOrDuplicateRequestsAreRejected) {
  Scheduler scheduler;
  EXPECT_EQ(scheduler.enqueue("zero", 1, SlotRequest{0, 1, 0}).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(scheduler.enqueue("a", 1, SlotRequest{}).ok());
  EXPECT_EQ(scheduler.enqueue("a", 2, SlotRequest{}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(scheduler.enqueue("b", 1, SlotRequest{}).code(), StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, AnEmptyQueueSchedulesNothing) {
  Scheduler scheduler;
  ScheduleResult result = scheduler.schedule({capacity("node-a", 4)});
  EXPECT_TRUE(result.placed.empty());
  EXPECT_TRUE(result.blocked_job_id.empty());
}

}  // namespace
}  // namespace cohort::coordinator
