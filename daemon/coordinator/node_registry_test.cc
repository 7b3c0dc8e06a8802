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
