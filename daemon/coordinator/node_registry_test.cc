#include "daemon/coordinator/node_registry.h"

#include <chrono>

#include <gtest/gtest.h>

namespace cohort::coordinator {
namespace {

using std::chrono::seconds;

NodeInfo node(const std::string& id, int slots, int gpus = 0) {
  NodeInfo info;
  info.node_id = id;
  info.address = id + ":7071";
  info.hostname = id;
  info.cores = 8;
  info.slots = slots;
  for (int i = 0; i < gpus; ++i) info.gpus.push_back(GpuInfo{i, "test-gpu", 1 << 30});
  return info;
}

TEST(NodeRegistryTest, RegisteredNodesAreListedByIdWithTheirFreeCapacity) {
  NodeRegistry registry;
  const TimePoint t0;
  ASSERT_TRUE(registry.register_node(node("node-b", 4, 2), t0).ok());
  ASSERT_TRUE(registry.register_node(node("node-a", 2), t0).ok());
  std::vector<NodeStatus> nodes = registry.list();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_EQ(nodes[0].info.node_id, "node-a");
  EXPECT_EQ(nodes[0].free_slots, 2);
  EXPECT_EQ(nodes[1].info.node_id, "node-b");
  EXPECT_EQ(nodes[1].free_slots, 4);
  EXPECT_EQ(nodes[1].free_gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(nodes[1].lease_expiry, t0 + kDefaultNodeLease);
}

TEST(NodeRegistryTest, ADrainingNodeShowsNoFreeCapacityUntilItHeartbeatsAgain) {
  NodeRegistry registry;
  const TimePoint t0;
  ASSERT_TRUE(registry.register_node(node("node-a", 4, 2), t0).ok());
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(1), /*unschedulable=*/true).ok());
  std::vector<NodeStatus> nodes = registry.list();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_TRUE(nodes[0].unschedulable);
  EXPECT_EQ(nodes[0].free_slots, 0);
  EXPECT_TRUE(nodes[0].free_gpus.empty());
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(2)).ok());
  EXPECT_EQ(registry.list()[0].free_slots, 4);
}

TEST(NodeRegistryTest, ASuspectNodeShowsNoFreeCapacityUntilItsAgentHeartbeatsOrRegisters) {
  NodeRegistry registry(seconds(15));
  const TimePoint t0;
  ASSERT_TRUE(registry.register_node(node("node-a", 4, 2), t0).ok());
  ASSERT_TRUE(registry.register_node(node("node-b", 2), t0).ok());
  ASSERT_TRUE(registry.mark_suspect("node-a", "its agent did not answer a launch", t0).ok());
  std::vector<NodeStatus> nodes = registry.list();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_FALSE(nodes[0].schedulable());
  EXPECT_FALSE(nodes[0].unschedulable) << "suspect is not draining";
  EXPECT_EQ(nodes[0].suspect_reason, "its agent did not answer a launch");
  EXPECT_EQ(nodes[0].free_slots, 0);
  EXPECT_TRUE(nodes[0].free_gpus.empty());
  EXPECT_EQ(nodes[0].lease_expiry, t0 + seconds(15)) << "suspicion does not shorten the lease";
  EXPECT_TRUE(nodes[1].schedulable());
  EXPECT_EQ(nodes[1].free_slots, 2);

  // A heartbeat proves the agent alive: schedulable again with its capacity.
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(5)).ok());
  nodes = registry.list();
  EXPECT_TRUE(nodes[0].schedulable());
  EXPECT_TRUE(nodes[0].suspect_reason.empty());
  EXPECT_EQ(nodes[0].free_slots, 4);
  EXPECT_EQ(nodes[0].free_gpus, (std::vector<int>{0, 1}));

  // So does a registration (the agent restarted).
  ASSERT_TRUE(registry.mark_suspect("node-b", "launch timed out", t0 + seconds(5)).ok());
  EXPECT_EQ(registry.list()[1].free_slots, 0);
  ASSERT_TRUE(registry.register_node(node("node-b", 2), t0 + seconds(6)).ok());
  EXPECT_TRUE(registry.list()[1].schedulable());
  EXPECT_EQ(registry.list()[1].free_slots, 2);

  // A suspect node that never heartbeats again is lost when its lease ends, as any node.
  ASSERT_TRUE(registry.mark_suspect("node-a", "launch timed out", t0 + seconds(6)).ok());
  EXPECT_EQ(registry.expire(t0 + seconds(21)), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(registry.mark_suspect("node-a", "again", t0 + seconds(21)).status().code(), StatusCode::kNotFound);
}

TEST(NodeRegistryTest, AnAgentUnreachableForLaunchesAgainAndAgainStaysSuspectThroughItsHeartbeats) {
  // A one-way partition: the agent's heartbeats reach the coordinator, its launches never reach
  // the agent. Without a hold the node would be schedulable at every heartbeat and cost a job a
  // restart each time.
  NodeRegistry registry(seconds(15));
  const TimePoint t0;
  ASSERT_TRUE(registry.register_node(node("node-a", 2), t0).ok());
  auto schedulable = [&] { return registry.list()[0].schedulable(); };

  // The first unreachable launch: the next heartbeat clears it, as before.
  StatusOr<Duration> hold = registry.mark_suspect("node-a", "launch 1 timed out", t0);
  ASSERT_TRUE(hold.ok());
  EXPECT_EQ(*hold, Duration(0));
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(1)).ok());
  EXPECT_TRUE(schedulable());

  // The second in a row: heartbeats within kSuspectHoldBase do not clear it, the first after does.
  hold = registry.mark_suspect("node-a", "launch 2 timed out", t0 + seconds(2));
  ASSERT_TRUE(hold.ok());
  EXPECT_EQ(*hold, kSuspectHoldBase);
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(7)).ok());
  EXPECT_FALSE(schedulable()) << "cleared within the hold";
  EXPECT_EQ(registry.list()[0].suspect_reason, "launch 2 timed out");
  ASSERT_TRUE(registry.heartbeat("node-a", t0 + seconds(2) + kSuspectHoldBase).ok());
  EXPECT_TRUE(schedulable());
  EXPECT_EQ(registry.list()[0].lease_expiry, t0 + seconds(2) + kSuspectHoldBase + seconds(15))
      << "heartbeats within the hold still renewed the lease";

  // Each further one doubles the hold, up to the max.
  TimePoint now = t0 + seconds(30);
  Duration expected = kSuspectHoldBase;
  for (int streak = 3; streak <= 12; ++streak) {
    expected = std::min<Duration>(expected * 2, kSuspectHoldMax);
    hold = registry.mark_suspect("node-a", "timed out again", now);
    ASSERT_TRUE(hold.ok());
    EXPECT_EQ(*hold, expected) << "streak " << streak;
    now += *hold;
    ASSERT_TRUE(registry.heartbeat("node-a", now).ok());
  }
  EXPECT_EQ(expected, kSuspectHoldMax);

  // A launch that gets through ends the streak: the next unreachable one is cleared at once again.
  registry.launch_succeeded("node-a");
  hold = registry.mark_suspect("node-a", "a one-off timeout", now);
  ASSERT_TRUE(hold.ok());
  EXPECT_EQ(*hold, Duration(0));
  ASSERT_TRUE(registry.heartbeat("node-a", now + seconds(1)).ok());
  EXPECT_TRUE(schedulable());
}

TEST(NodeRegistryTest, ARestoredNodeIsListedButTakesNoWorkOrHeartbeatsUntilItRegisters) {
  NodeRegistry registry(seconds(15));
  const TimePoint takeover = TimePoint() + seconds(100);
  ASSERT_TRUE(registry.restore_node(node("node-a", 2), takeover).ok());
  ASSERT_TRUE(registry.contains("node-a"));
  EXPECT_FALSE(registry.registered("node-a"));
  NodeStatus status = registry.list().front();
  EXPECT_TRUE(status.awaiting_registration);
  EXPECT_FALSE(status.schedulable());
  EXPECT_EQ(status.free_slots, 0);
  EXPECT_EQ(status.lease_expiry, takeover + seconds(15));
  // Reservations of recovered attempts are taken on it (they show once it is schedulable).
  ASSERT_TRUE(registry.reserve("node-a", 1, {}).ok());

  // A heartbeat does not make it ours: its agent must register (reporting what it runs).
  Status beat = registry.heartbeat("node-a", takeover + seconds(1));
  EXPECT_EQ(beat.code(), StatusCode::kNotFound);
  EXPECT_NE(beat.message().find("register again"), std::string::npos) << beat.message();
  EXPECT_EQ(registry.list().front().lease_expiry, takeover + seconds(15)) << "not renewed";

  ASSERT_TRUE(registry.register_node(node("node-a", 2), takeover + seconds(2)).ok());
  EXPECT_TRUE(registry.registered("node-a"));
  status = registry.list().front();
  EXPECT_TRUE(status.schedulable());
  EXPECT_EQ(status.free_slots, 2) << "registration starts from a clean record";
  EXPECT_TRUE(registry.heartbeat("node-a", takeover + seconds(3)).ok());

  // Restoring never replaces a registered node; a restored node that never registers expires.
  ASSERT_TRUE(registry.restore_node(node("node-a", 9), takeover + seconds(4)).ok());
  EXPECT_EQ(registry.list().front().info.slots, 2);
  EXPECT_TRUE(registry.registered("node-a"));
  ASSERT_TRUE(registry.restore_node(node("node-z", 1), takeover).ok());
  EXPECT_EQ(registry.expire(takeover + seconds(16)), (std::vector<std::string>{"node-z"}));
  EXPECT_EQ(registry.restore_node(node("node-y", 0), takeover).code(), StatusCode::kInvalidArgument);
}

TEST(NodeRegistryTest, MalformedRegistrationsAreRejectedWithTheProblemNamed) {
  NodeRegistry registry;
  NodeInfo no_slots = node("node-a", 0);
  Status status = registry.register_node(no_slots, TimePoint());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("slots is 0"), std::string::npos) << status.message();

  NodeInfo twice = node("node-a", 1, 1);
  twice.gpus.push_back(GpuInfo{0, "dup", 0});
  status = registry.register_node(twice, TimePoint());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("GPU index 0"), std::string::npos) << status.message();

  EXPECT_EQ(registry.register_node(node("", 1), TimePoint()).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry.list().empty());
}

TEST(NodeRegistryTest, ANodeThatMissesItsLeaseExpiresAndOneThatHeartbeatsDoesNot) {
  NodeRegistry registry(seconds(15));
  const TimePoint t0;
  ASSERT_TRUE(registry.register_node(node("quiet", 1), t0).ok());
  ASSERT_TRUE(registry.register_node(node("chatty", 1), t0).ok());

  ASSERT_TRUE(registry.heartbeat("chatty", t0 + seconds(10)).ok());
  // Exactly at the lease's end the node is still alive; a moment later it is lost.
  EXPECT_TRUE(registry.expire(t0 + seconds(15)).empty());
  EXPECT_EQ(registry.expire(t0 + seconds(16)), (std::vector<std::string>{"quiet"}));
  EXPECT_FALSE(registry.contains("quiet"));
  EXPECT_TRUE(registry.contains("chatty"));

  EXPECT_EQ(registry.expire(t0 + seconds(26)), (std::vector<std::string>{"chatty"}));
  EXPECT_TRUE(registry.list().empty());
}

TEST(NodeRegistryTest, AHeartbeatFromAnUnknownOrExpiredNodeAsksItToRegisterAgain) {
  NodeRegistry registry(seconds(15));
  Status status = registry.heartbeat("ghost", TimePoint());
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_NE(status.message().find("register again"), std::string::npos) << status.message();

  ASSERT_TRUE(registry.register_node(node("node-a", 1), TimePoint()).ok());
  registry.expire(TimePoint() + seconds(20));
  EXPECT_EQ(registry.heartbeat("node-a", TimePoint() + seconds(21)).code(), StatusCode::kNotFound);
}

TEST(NodeRegistryTest, ReservationsTakeSlotsAndGpusUntilReleased) {
  NodeRegistry registry;
  ASSERT_TRUE(registry.register_node(node("node-a", 4, 4), TimePoint()).ok());
  ASSERT_TRUE(registry.reserve("node-a", 3, {0, 2}).ok());
  NodeStatus status = registry.list().front();
  EXPECT_EQ(status.free_slots, 1);
  EXPECT_EQ(status.free_gpus, (std::vector<int>{1, 3}));

  Status too_many = registry.reserve("node-a", 2, {});
  EXPECT_EQ(too_many.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(too_many.message().find("1 free slots; 2 requested"), std::string::npos) << too_many.message();
  EXPECT_EQ(registry.reserve("node-a", 1, {2}).code(), StatusCode::kResourceExhausted);  // GPU 2 is taken
  EXPECT_EQ(registry.reserve("node-a", 1, {7}).code(), StatusCode::kResourceExhausted);  // no GPU 7
  EXPECT_EQ(registry.reserve("nowhere", 1, {}).code(), StatusCode::kNotFound);

  registry.release("node-a", 3, {0, 2});
  status = registry.list().front();
  EXPECT_EQ(status.free_slots, 4);
  EXPECT_EQ(status.free_gpus, (std::vector<int>{0, 1, 2, 3}));
  registry.release("nowhere", 1, {});  // a gone node is ignored
}

TEST(NodeRegistryTest, ReRegisteringANodeStartsItFresh) {
  NodeRegistry registry(seconds(15));
  ASSERT_TRUE(registry.register_node(node("node-a", 2), TimePoint()).ok());
  ASSERT_TRUE(registry.reserve("node-a", 2, {}).ok());
  ASSERT_TRUE(registry.register_node(node("node-a", 3), TimePoint() + seconds(10)).ok());
  NodeStatus status = registry.list().front();
  EXPECT_EQ(status.free_slots, 3);
  EXPECT_EQ(status.lease_expiry, TimePoint() + seconds(25));
}

}  // namespace
}  // namespace cohort::coordinator
