#include "daemon/coordinator/coordinator.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"

namespace cohort::coordinator {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::TempDir;
using testing::valid_spec;

constexpr Duration kLease = seconds(15);
constexpr Duration kGenerous = seconds(30);  // never reached when the test passes

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

// The nodes that got stop orders, in order.
std::vector<std::string> stopped_nodes(const AgentOrders& orders) {
  std::vector<std::string> nodes;
  for (const StopOrder& stop : orders.stops) nodes.push_back(stop.node_id);
  return nodes;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override { open(); }

  void open() {
    CoordinatorOptions options;
    options.data_dir = dir_.path();
    options.node_lease = kLease;
    auto coordinator = Coordinator::open(options, &clock_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    coordinator_ = std::move(*coordinator);
  }

  void add_node(const std::string& id, int slots) {
    NodeInfo info;
    info.node_id = id;
    info.address = id + ":7071";
    info.hostname = id;
    info.slots = slots;
    auto orders = coordinator_->register_node(info);
    ASSERT_TRUE(orders.ok()) << orders.status().to_string();
    EXPECT_TRUE(orders->empty());
  }

  std::string submit(const cohort::v1::JobSpec& spec) {
    auto id = coordinator_->submit(spec);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.value_or("");
  }

  Job job(const std::string& id) {
    auto job = coordinator_->get_job(id);
    EXPECT_TRUE(job.ok()) << job.status().to_string();
    return job.value_or(Job());
  }

  AgentOrders exit_task(const std::string& node, const std::string& id, int attempt, int rank, int code,
                        int signal = 0) {
    auto orders = coordinator_->report_task_exit(TaskExit{node, id, attempt, rank, code, signal});
    EXPECT_TRUE(orders.ok()) << orders.status().to_string();
    return orders.ok() ? *orders : AgentOrders();
  }

  // Places the queued jobs and reports every launched node started.
  AgentOrders tick_and_start() {
    AgentOrders orders = coordinator_->tick();
    for (const LaunchOrder& launch : orders.launches) {
      EXPECT_TRUE(
          coordinator_->report_tasks_started(launch.node.node_id, launch.job_id, launch.attempt).ok());
    }
    return orders;
  }

  int free_slots(const std::string& node) {
    for (const NodeStatus& status : coordinator_->list_nodes()) {
      if (status.info.node_id == node) return status.free_slots;
    }
    return -1;
  }

  std::vector<JobState> state_history(const std::string& id) {
    std::vector<JobState> states;
    auto events = coordinator_->events(id, 0, Duration(0));
    EXPECT_TRUE(events.ok());
    for (const JobEvent& event : events.value_or(std::vector<JobEvent>())) {
      if (event.kind == JobEvent::Kind::kStateChange) states.push_back(event.change.to);
    }
    return states;
  }

  // Declared before the coordinator, so they outlive it.
  TempDir dir_;
  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, ARankExitingNonZeroFailsTheJobWithAReasonNamingTheRank) {
  add_node("node-a", 2);
  add_node("node-b", 2);
  const std::string id = submit(valid_spec("mlp", 2, 2));
  EXPECT_EQ(id, "mlp-1");
  EXPECT_EQ(job(id).state(), JobState::kPending);

  // Placement: both nodes, node-major ranks, one launch order per node.
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 2u);
  EXPECT_TRUE(orders.stops.empty());
  const LaunchOrder& first = orders.launches[0];
  EXPECT_EQ(first.job_id, id);
  EXPECT_EQ(first.attempt, 1);
  EXPECT_EQ(first.node.node_id, "node-a");
  EXPECT_EQ(first.node.first_rank, 0);
  EXPECT_EQ(first.world_size, 4);
  EXPECT_EQ(first.num_nodes, 2);
  EXPECT_EQ(first.master_address, "node-a");
  EXPECT_EQ(orders.launches[1].node.node_id, "node-b");
  EXPECT_EQ(orders.launches[1].node.first_rank, 2);
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  EXPECT_EQ(job(id).placement.world_size(), 4);
  EXPECT_EQ(free_slots("node-a"), 0);
  EXPECT_EQ(free_slots("node-b"), 0);

  // RUNNING only once every node has started its tasks.
  ASSERT_TRUE(coordinator_->report_tasks_started("node-a", id, 1).ok());
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  clock_.advance(seconds(3));
  ASSERT_TRUE(coordinator_->report_tasks_started("node-b", id, 1).ok());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  EXPECT_EQ(job(id).start_unix_ms, FakeClock::kDefaultStartUnixMillis + 3000);

  auto rendezvous = coordinator_->rendezvous(id, 1);
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status().to_string();
  std::shared_ptr<Rendezvous> rdzv = *rendezvous;

  // Rank 3 dies: the job fails, the reason names it, and every node with live ranks gets a stop.
  orders = exit_task("node-b", id, 1, 3, 1);
  const Job failed = job(id);
  EXPECT_EQ(failed.state(), JobState::kFailed);
  EXPECT_EQ(failed.machine.reason(), "rank 3 on node node-b exited with code 1");
  EXPECT_NE(failed.end_unix_ms, 0);
  EXPECT_EQ(stopped_nodes(orders), (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_TRUE(contains(orders.stops[0].reason, "rank 3 on node node-b exited with code 1"));

  // No rank waits on the dead one: the rendezvous is closed with the reason.
  Status joined = rdzv->join("node-a", 0, kGenerous).status();
  EXPECT_EQ(joined.code(), StatusCode::kAborted);
  EXPECT_TRUE(contains(joined.message(), "rank 3 on node node-b exited with code 1")) << joined.message();

  // Slots come back as the stopped ranks exit, node by node.
  exit_task("node-a", id, 1, 0, 0, 15);
  exit_task("node-a", id, 1, 1, 0, 15);
  EXPECT_EQ(free_slots("node-a"), 2);
  EXPECT_EQ(free_slots("node-b"), 0);
  exit_task("node-b", id, 1, 2, 0, 15);
  EXPECT_EQ(free_slots("node-b"), 2);
  EXPECT_EQ(job(id).state(), JobState::kFailed);  // the later exits change nothing
  EXPECT_EQ(coordinator_->rendezvous(id, 1).status().code(), StatusCode::kFailedPrecondition);

  EXPECT_EQ(state_history(id), (std::vector<JobState>{JobState::kPending, JobState::kPlaced,
                                                      JobState::kRunning, JobState::kFailed}));
}

// Issue 16: an agent that killed a stopped or silent rank says what it saw; the reason carries it.
TEST_F(CoordinatorTest, AnAgentsHangDetailBecomesTheJobsReason) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("mlp", 1, 2));
  tick_and_start();
  TaskExit exit{"node-a", id, 1, 1, 0, 9};
  exit.detail = "pid 42 stopped (SIGSTOP or SIGTSTP: process state T) for 5.0 s; the agent killed it";
  auto orders = coordinator_->report_task_exit(exit);
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_NE(job(id).machine.reason().find("rank 1 on node node-a: pid 42 stopped (SIGSTOP"), std::string::npos)
      << job(id).machine.reason();
}

TEST_F(CoordinatorTest, EveryRankExitingZeroSucceeds) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("ok", 1, 2));
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  // The exits may overtake the agent's start report: an exited task had started.
  EXPECT_TRUE(exit_task("node-a", id, 1, 0, 0).empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  EXPECT_TRUE(exit_task("node-a", id, 1, 1, 0).empty());
  EXPECT_EQ(job(id).state(), JobState::kSucceeded);
  EXPECT_EQ(job(id).machine.reason(), "all 2 rank(s) exited with code 0");
  EXPECT_EQ(free_slots("node-a"), 2);
  // A late start report for a finished attempt is harmless.
  EXPECT_TRUE(coordinator_->report_tasks_started("node-a", id, 1).ok());
  EXPECT_EQ(job(id).state(), JobState::kSucceeded);
}

TEST_F(CoordinatorTest, AnInvalidSpecIsRejectedBeforeAnythingIsQueued) {
  add_node("node-a", 4);
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_procs_per_node(0);
  spec.set_communicator("mpi");
  auto id = coordinator_->submit(spec);
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(id.status().message(), "procs_per_node is 0")) << id.status().message();
  EXPECT_TRUE(contains(id.status().message(), "communicator 'mpi'")) << id.status().message();
  EXPECT_TRUE(coordinator_->list_jobs().empty());
  EXPECT_TRUE(coordinator_->tick().empty());
}

TEST_F(CoordinatorTest, AFailedAttemptWithRestartsLeftRunsAgainOnceItsSlotsDrain) {
  add_node("node-a", 2);
  cohort::v1::JobSpec spec = valid_spec("retry", 1, 2);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  tick_and_start();
  ASSERT_EQ(job(id).state(), JobState::kRunning);

  AgentOrders orders = exit_task("node-a", id, 1, 0, 0, 9);
  Job restarted = job(id);
  EXPECT_EQ(restarted.state(), JobState::kPending);
  EXPECT_EQ(restarted.attempt(), 2);
  EXPECT_TRUE(contains(restarted.machine.reason(),
                       "attempt 1 failed: rank 0 on node node-a was killed by "
                       "signal 9 (SIGKILL); restarting (restart 1 of 1)"))
      << restarted.machine.reason();
  EXPECT_EQ(stopped_nodes(orders), (std::vector<std::string>{"node-a"}));

  // Rank 1 of attempt 1 still holds its slot: attempt 2 must not overlap it.
  EXPECT_TRUE(coordinator_->tick().launches.empty());
  EXPECT_TRUE(contains(job(id).waiting_for, "needs 1 node(s) with 2 free slot(s)")) << job(id).waiting_for;
  // Its late metrics belong to a dead attempt and are dropped.
  ASSERT_TRUE(coordinator_->report_metrics(id, 1, Metrics{10, 0, 2.0, 0, 0, 0}).ok());
  EXPECT_FALSE(job(id).last_metrics.has_value());
  exit_task("node-a", id, 1, 1, 0, 15);
  EXPECT_EQ(job(id).state(), JobState::kPending);

  orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].attempt, 2);
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  EXPECT_EQ(coordinator_->rendezvous(id, 1).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(coordinator_->rendezvous(id, 2).ok());

  // The second attempt fails too, and no restarts are left.
  exit_task("node-a", id, 2, 1, 3);
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_EQ(job(id).machine.reason(),
            "rank 1 on node node-a exited with code 3 (attempt 2; all 1 restart(s) used)");
}

TEST_F(CoordinatorTest, NothingIsPlacedOnADrainingNode) {
  add_node("node-a", 2);
  ASSERT_TRUE(coordinator_->heartbeat("node-a", /*unschedulable=*/true).ok());
  const std::string id = submit(valid_spec("drain", 1, 1));
  EXPECT_TRUE(coordinator_->tick().launches.empty());
  EXPECT_EQ(job(id).state(), JobState::kPending);
  // Back to schedulable (a drain that was called off): the job is placed.
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  EXPECT_EQ(coordinator_->tick().launches.size(), 1u);
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
}

TEST_F(CoordinatorTest, ANodeThatMissesItsLeaseFailsItsJobAndOnlyTheLiveNodesGetStops) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("lease", 2, 1));
  tick_and_start();
  ASSERT_EQ(job(id).state(), JobState::kRunning);

  clock_.advance(seconds(10));
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  clock_.advance(seconds(5));
  EXPECT_TRUE(coordinator_->tick().empty()) << "node-b's lease ends exactly now: not yet lost";
  clock_.advance(seconds(1));
  AgentOrders orders = coordinator_->tick();

  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_EQ(job(id).machine.reason(), "node node-b lost: no heartbeat for 15.0 s");
  EXPECT_EQ(stopped_nodes(orders), (std::vector<std::string>{"node-a"}));
  ASSERT_EQ(coordinator_->list_nodes().size(), 1u);
  EXPECT_EQ(coordinator_->heartbeat("node-b").code(), StatusCode::kNotFound);
  exit_task("node-a", id, 1, 0, 0, 15);
  EXPECT_EQ(free_slots("node-a"), 1);
}

TEST_F(CoordinatorTest, ALostNodesJobWithRestartsWaitsForCapacityAndRunsElsewhere) {
  add_node("node-a", 1);
  cohort::v1::JobSpec spec = valid_spec("mobile", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(2);
  const std::string id = submit(spec);
  tick_and_start();
  clock_.advance(kLease + seconds(1));
  coordinator_->tick();
  EXPECT_EQ(job(id).state(), JobState::kPending);
  EXPECT_EQ(job(id).attempt(), 2);
  EXPECT_TRUE(contains(job(id).waiting_for, "0 of 0 live node(s)")) << job(id).waiting_for;

  add_node("node-c", 1);
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].node.node_id, "node-c");
  EXPECT_EQ(job(id).placement.nodes[0].node_id, "node-c");
}

// Found by the chaos test (seed 108898): a node lost while an attempt was PLACED fails the attempt
// before the launch orders for its other nodes went out; the dispatcher skips those, and without
// report_launch_skipped the nodes that never heard of the attempt kept its slots reserved forever.
TEST_F(CoordinatorTest, ASkippedLaunchFreesTheSlotsItsNodeHeldForTheAttempt) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("skipped", 2, 1));
  AgentOrders placed = coordinator_->tick();  // PLACED: the orders are queued, none sent yet
  ASSERT_EQ(placed.launches.size(), 2u);
  ASSERT_EQ(free_slots("node-a"), 0);
  EXPECT_EQ(coordinator_->report_launch_skipped("node-a", id, 1).code(), StatusCode::kFailedPrecondition)
      << "an active attempt's launch must be sent, not skipped";

  clock_.advance(seconds(10));
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  clock_.advance(seconds(6));
  coordinator_->tick();  // node-b lost: the attempt fails while its launch on node-a is still queued
  ASSERT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_EQ(free_slots("node-a"), 0) << "node-a's stop order would release them once its tasks exit";

  ASSERT_TRUE(coordinator_->report_launch_skipped("node-a", id, 1).ok());
  EXPECT_EQ(free_slots("node-a"), 1);
  EXPECT_TRUE(coordinator_->report_launch_skipped("node-a", id, 1).ok()) << "a repeat is harmless";
  EXPECT_EQ(free_slots("node-a"), 1);
  EXPECT_EQ(coordinator_->report_launch_skipped("node-a", "no-such-job", 1).code(), StatusCode::kNotFound);
}

// Found by the chaos test: a SIGSTOPped or killed agent keeps its lease for up to 15 s, and each
// restart was placed on it again, its launch failing and costing another restart, until the job had
// none left. An unreachable agent's node is suspect until it heartbeats again.
TEST_F(CoordinatorTest, ALaunchTheAgentDidNotAnswerSendsTheRestartToAnotherNode) {
  add_node("node-b", 1);
  add_node("node-c", 1);
  cohort::v1::JobSpec spec = valid_spec("unreachable", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(2);
  const std::string id = submit(spec);
  AgentOrders placed = coordinator_->tick();
  ASSERT_EQ(placed.launches.size(), 1u);
  ASSERT_EQ(placed.launches[0].node.node_id, "node-b");  // best fit, ties by node id

  auto failed = coordinator_->report_launch_failure("node-b", id, 1, "Agent.LaunchTasks: deadline exceeded",
                                                    LaunchFailure::kUnreachable);
  ASSERT_TRUE(failed.ok()) << failed.status().to_string();
  EXPECT_EQ(job(id).state(), JobState::kPending);
  EXPECT_EQ(job(id).attempt(), 2);
  EXPECT_TRUE(contains(job(id).machine.reason(), "on node node-b failed: Agent.LaunchTasks: deadline exceeded"))
      << job(id).machine.reason();
  EXPECT_EQ(free_slots("node-b"), 0) << "suspect: placement sees no free capacity there";

  AgentOrders restarted = coordinator_->tick();
  ASSERT_EQ(restarted.launches.size(), 1u);
  EXPECT_EQ(restarted.launches[0].node.node_id, "node-c");
  EXPECT_EQ(restarted.launches[0].attempt, 2);

  // Listing says why node-b takes nothing.
  const std::vector<NodeStatus> nodes = coordinator_->list_nodes();
  ASSERT_EQ(nodes.size(), 2u);
  EXPECT_FALSE(nodes[0].schedulable());
  EXPECT_TRUE(contains(nodes[0].suspect_reason, "did not answer a launch (job " + id + " attempt 1"))
      << nodes[0].suspect_reason;
  EXPECT_TRUE(nodes[1].schedulable());
}

TEST_F(CoordinatorTest, ARestartWaitsWhileItsOnlyNodeIsSuspectAndRunsOnceItHeartbeats) {
  add_node("node-b", 1);
  cohort::v1::JobSpec spec = valid_spec("wait", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  ASSERT_EQ(coordinator_->tick().launches.size(), 1u);
  ASSERT_TRUE(coordinator_
                  ->report_launch_failure("node-b", id, 1, "Agent.LaunchTasks: connection refused",
                                          LaunchFailure::kUnreachable)
                  .ok());
  ASSERT_EQ(job(id).state(), JobState::kPending);

  // The restart does not go to the node whose agent just did not answer: it waits, saying why.
  EXPECT_TRUE(coordinator_->tick().launches.empty());
  EXPECT_EQ(job(id).state(), JobState::kPending);
  EXPECT_TRUE(contains(job(id).waiting_for, "node node-b is suspect: its agent did not answer a launch"))
      << job(id).waiting_for;
  clock_.advance(seconds(3));
  EXPECT_TRUE(coordinator_->tick().launches.empty()) << "still no heartbeat: still suspect";

  // The agent was only slow: its next heartbeat makes the node schedulable again.
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].node.node_id, "node-b");
  EXPECT_EQ(orders.launches[0].attempt, 2);
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  EXPECT_TRUE(job(id).waiting_for.empty()) << job(id).waiting_for;
}

// A one-way partition: node-b's agent heartbeats, but the coordinator's launches never reach it.
// Before the hold, every heartbeat made it schedulable again and every restart went there.
TEST_F(CoordinatorTest, ANodeWhoseAgentHeartbeatsButNeverAnswersALaunchStaysSuspectLongerEachTime) {
  add_node("node-b", 1);
  cohort::v1::JobSpec spec = valid_spec("oneway", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(5);
  const std::string id = submit(spec);
  auto launch_fails = [&](int attempt) {
    AgentOrders orders = coordinator_->tick();
    ASSERT_EQ(orders.launches.size(), 1u) << "attempt " << attempt;
    ASSERT_EQ(orders.launches[0].attempt, attempt);
    ASSERT_TRUE(coordinator_
                    ->report_launch_failure("node-b", id, attempt, "Agent.LaunchTasks: deadline exceeded",
                                            LaunchFailure::kUnreachable)
                    .ok());
  };
  launch_fails(1);
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());  // the first: cleared at once, as before
  launch_fails(2);

  // The second in a row: heartbeats within the hold do not make it schedulable.
  for (int i = 0; i < 3; ++i) {
    clock_.advance(seconds(4));
    ASSERT_TRUE(coordinator_->heartbeat("node-b").ok()) << "its lease is still renewed";
    EXPECT_TRUE(coordinator_->tick().launches.empty()) << "heartbeat " << i << " within the hold";
  }
  EXPECT_EQ(job(id).attempt(), 3) << "no restart was spent meanwhile";
  const std::vector<NodeStatus> nodes = coordinator_->list_nodes();
  ASSERT_EQ(nodes.size(), 1u);
  EXPECT_TRUE(contains(nodes[0].suspect_reason, "again and again while its heartbeats arrive"))
      << nodes[0].suspect_reason;
  EXPECT_TRUE(contains(job(id).waiting_for, "node node-b is suspect")) << job(id).waiting_for;

  // After the hold, a heartbeat clears it; a launch that then gets through ends the streak.
  clock_.advance(kSuspectHoldBase);
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  ASSERT_TRUE(coordinator_->report_tasks_started("node-b", id, 3).ok());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
}

TEST_F(CoordinatorTest, ASuspectNodeThatNeverHeartbeatsIsLostAndItsRestartWaitsForANewNode) {
  add_node("node-b", 1);
  cohort::v1::JobSpec spec = valid_spec("dead", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  ASSERT_EQ(coordinator_->tick().launches.size(), 1u);
  ASSERT_TRUE(
      coordinator_->report_launch_failure("node-b", id, 1, "unavailable", LaunchFailure::kUnreachable).ok());
  clock_.advance(kLease + seconds(1));
  EXPECT_TRUE(coordinator_->tick().launches.empty());
  EXPECT_TRUE(coordinator_->list_nodes().empty()) << "the suspect node's lease ran out";
  add_node("node-c", 1);
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].node.node_id, "node-c");
  EXPECT_EQ(job(id).attempt(), 2) << "one restart for the one failed launch";
}

TEST_F(CoordinatorTest, ALaunchTheAgentRefusedLeavesTheNodeSchedulable) {
  add_node("node-b", 1);
  cohort::v1::JobSpec spec = valid_spec("refused", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  ASSERT_EQ(coordinator_->tick().launches.size(), 1u);
  // The agent answered (a spawn error): the node itself is fine.
  ASSERT_TRUE(coordinator_->report_launch_failure("node-b", id, 1, "exec cohort-worker: no such file").ok());
  EXPECT_TRUE(coordinator_->list_nodes()[0].schedulable());
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].node.node_id, "node-b");
}

TEST_F(CoordinatorTest, ReRegisteringALiveNodeMeansItsAgentRestartedAndItsTasksAreLost) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("agent", 2, 1));
  tick_and_start();
  NodeInfo again;
  again.node_id = "node-b";
  again.address = "node-b:7071";
  again.slots = 1;
  auto orders = coordinator_->register_node(again);
  ASSERT_TRUE(orders.ok());
  EXPECT_EQ(stopped_nodes(*orders), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(id).machine.reason(), "node node-b re-registered")) << job(id).machine.reason();
  EXPECT_EQ(free_slots("node-b"), 1);
}

TEST_F(CoordinatorTest, TheQueueIsFifoAndItsHeadBlocksJobsBehindIt) {
  add_node("node-a", 2);
  const std::string small = submit(valid_spec("small", 1, 1));
  tick_and_start();
  const std::string wide = submit(valid_spec("wide", 1, 2));
  const std::string tiny = submit(valid_spec("tiny", 1, 1));
  // One slot is free and `tiny` would fit it, but `wide` is first in line.
  EXPECT_TRUE(coordinator_->tick().launches.empty());
  EXPECT_TRUE(contains(job(wide).waiting_for, "needs 1 node(s) with 2 free slot(s) each; 0 of 1"))
      << job(wide).waiting_for;
  EXPECT_EQ(job(tiny).waiting_for, "queued behind job wide-2 (first in line)");

  exit_task("node-a", small, 1, 0, 0);
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].job_id, wide);
  EXPECT_EQ(job(wide).waiting_for, "");
  EXPECT_EQ(job(tiny).state(), JobState::kPending);
}

TEST_F(CoordinatorTest, CancelDequeuesAPendingJobAndStopsARunningOne) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string running = submit(valid_spec("running", 2, 1));
  tick_and_start();
  const std::string queued = submit(valid_spec("queued", 1, 1));

  auto orders = coordinator_->cancel(queued, "");
  ASSERT_TRUE(orders.ok());
  EXPECT_TRUE(orders->empty());
  EXPECT_EQ(job(queued).state(), JobState::kCancelled);
  EXPECT_EQ(job(queued).machine.reason(), "cancelled by a client");

  orders = coordinator_->cancel(running, "user pressed ^C");
  ASSERT_TRUE(orders.ok());
  EXPECT_EQ(stopped_nodes(*orders), (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(job(running).state(), JobState::kCancelled);
  EXPECT_EQ(job(running).machine.reason(), "user pressed ^C");

  // The freed capacity does not revive the cancelled queued job.
  exit_task("node-a", running, 1, 0, 0, 15);
  exit_task("node-b", running, 1, 1, 0, 15);
  EXPECT_TRUE(coordinator_->tick().launches.empty());

  auto again = coordinator_->cancel(running, "");
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_TRUE(contains(again.status().message(), "already finished: CANCELLED")) << again.status().message();
  EXPECT_EQ(coordinator_->cancel("nope-9", "").status().code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, MalformedReportsAreRejectedWithWhatIsWrong) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("job", 2, 1));
  tick_and_start();
  auto wrong_node = coordinator_->report_task_exit(TaskExit{"node-a", id, 1, 1, 1, 0});
  EXPECT_EQ(wrong_node.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      contains(wrong_node.status().message(), "rank 1 is not placed on node node-a (it runs on node node-b)"))
      << wrong_node.status().message();
  EXPECT_EQ(coordinator_->report_task_exit(TaskExit{"node-a", id, 5, 0, 1, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(coordinator_->report_task_exit(TaskExit{"node-a", "ghost-1", 1, 0, 1, 0}).status().code(),
            StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->report_tasks_started("node-z", id, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(job(id).state(), JobState::kRunning);
}

TEST_F(CoordinatorTest, ARestartedCoordinatorKeepsEveryJob) {
  add_node("node-a", 4);
  const std::string done = submit(valid_spec("done", 1, 1));
  const std::string running = submit(valid_spec("running", 1, 1));
  cohort::v1::JobSpec resilient = valid_spec("resilient", 1, 1);
  resilient.mutable_restart_policy()->set_max_restarts(1);
  const std::string restartable = submit(resilient);
  tick_and_start();
  exit_task("node-a", done, 1, 0, 0);
  ASSERT_TRUE(coordinator_->report_metrics(running, 1, Metrics{50, 1, 0.5, 0.9, 100, 0}).ok());
  const std::string queued = submit(valid_spec("queued", 1, 8));  // never fits a 4-slot node

  coordinator_.reset();  // the coordinator stops (or crashes) ...
  open();                // ... and a new one starts on the same data directory

  std::vector<Job> jobs = coordinator_->list_jobs();
  ASSERT_EQ(jobs.size(), 4u);
  EXPECT_EQ(jobs[0].id, done);
  EXPECT_EQ(jobs[0].state(), JobState::kSucceeded);
  EXPECT_EQ(jobs[1].id, running);
  // Running attempts wait for their node to report them (issue 16's reconciliation).
  EXPECT_EQ(jobs[1].state(), JobState::kRunning);
  ASSERT_TRUE(jobs[1].last_metrics.has_value());  // written at shutdown
  EXPECT_EQ(jobs[1].last_metrics->step, 50);
  EXPECT_EQ(jobs[2].id, restartable);
  EXPECT_EQ(jobs[2].state(), JobState::kRunning);
  EXPECT_EQ(jobs[2].attempt(), 1);
  EXPECT_EQ(jobs[3].id, queued);
  EXPECT_EQ(jobs[3].state(), JobState::kPending);
  EXPECT_EQ(jobs[3].spec.procs_per_node(), 8);

  // The event history survived too, and new ids continue after the old ones.
  EXPECT_EQ(state_history(done), (std::vector<JobState>{JobState::kPending, JobState::kPlaced,
                                                        JobState::kRunning, JobState::kSucceeded}));
  EXPECT_EQ(submit(valid_spec("fresh", 1, 1)), "fresh-5");

  // Nodes re-register after a coordinator restart; this one no longer runs the two attempts (its
  // agent restarted too): they fail by their restart policy, and the restarted job runs again.
  add_node("node-a", 4);
  EXPECT_EQ(job(running).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(running).machine.reason(),
                       "the coordinator restarted and node node-a registered without job " + running))
      << job(running).machine.reason();
  EXPECT_EQ(job(restartable).state(), JobState::kPending);
  EXPECT_EQ(job(restartable).attempt(), 2);
  AgentOrders orders = coordinator_->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(orders.launches[0].job_id, restartable);
  EXPECT_EQ(orders.launches[0].attempt, 2);
}

// ---- reconciliation (issue 16) ----

NodeInfo node_info(const std::string& id, int slots) {
  NodeInfo info;
  info.node_id = id;
  info.address = id + ":7071";
  info.hostname = id;
  info.slots = slots;
  return info;
}

TEST_F(CoordinatorTest, ARestartedCoordinatorReadoptsTheAttemptsItsNodesStillRun) {
  add_node("node-a", 2);
  add_node("node-b", 2);
  const std::string id = submit(valid_spec("long", 2, 2));
  tick_and_start();
  ASSERT_EQ(job(id).state(), JobState::kRunning);
  coordinator_.reset();
  open();
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  auto a = coordinator_->register_node(node_info("node-a", 2), {RunningAttempt{id, 1, {0, 1}}});
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  EXPECT_TRUE(a->empty()) << "nothing to stop: the attempt is still ours";
  auto b = coordinator_->register_node(node_info("node-b", 2), {RunningAttempt{id, 1, {2, 3}}});
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->empty());
  // Its slots are held again, so nothing else is placed over its running workers.
  EXPECT_EQ(free_slots("node-a"), 0);
  EXPECT_EQ(free_slots("node-b"), 0);
  clock_.advance(kLease / 2);
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
  clock_.advance(kLease / 2 + seconds(1));  // past the reconcile window: adopted, nothing fails
  EXPECT_TRUE(coordinator_->tick().empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  EXPECT_EQ(job(id).attempt(), 1);
  for (int rank = 0; rank < 4; ++rank) exit_task(rank < 2 ? "node-a" : "node-b", id, 1, rank, 0);
  EXPECT_EQ(job(id).state(), JobState::kSucceeded);
  EXPECT_EQ(free_slots("node-a"), 2);
  EXPECT_EQ(free_slots("node-b"), 2);
}

// What a node's agent saw exit (RegisterNode's exits) for a rank of `attempt`.
TaskExit seen_exit(int rank, int code, int signal = 0) { return TaskExit{"", "", 0, rank, code, signal}; }

TEST_F(CoordinatorTest, ARestartedCoordinatorCountsTheRanksThatExitedBeforeItsRestartAndTheJobSucceeds) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("outlived", 1, 2));
  tick_and_start();
  ASSERT_EQ(job(id).state(), JobState::kRunning);
  exit_task("node-a", id, 1, 1, 0);  // taken by the coordinator that then restarts
  coordinator_.reset();
  open();
  // The agent runs rank 0 still; rank 1 it holds as exited with code 0.
  auto orders = coordinator_->register_node(node_info("node-a", 2), {RunningAttempt{id, 1, {0}, {seen_exit(1, 0)}}});
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  EXPECT_TRUE(orders->empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  EXPECT_EQ(free_slots("node-a"), 0);
  // Without the registration's exit, rank 1 would stay live here and this would not be the last rank.
  exit_task("node-a", id, 1, 0, 0);
  EXPECT_EQ(job(id).state(), JobState::kSucceeded) << job(id).machine.reason();
  EXPECT_EQ(free_slots("node-a"), 2);
}

TEST_F(CoordinatorTest, ARankThatFailedWhileTheCoordinatorWasDownFailsTheAttemptWhenItsNodeRegisters) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("failed-unheard", 1, 2));
  tick_and_start();
  coordinator_.reset();
  open();
  // Rank 1 exited with code 3 while no coordinator ran; its exit report comes after the registration.
  auto orders = coordinator_->register_node(node_info("node-a", 2), {RunningAttempt{id, 1, {0}, {seen_exit(1, 3)}}});
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  EXPECT_EQ(stopped_nodes(*orders), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(id).machine.reason(), "rank 1 on node node-a exited with code 3")) << job(id).machine.reason();
  // The queued report is a repeat; rank 0 exiting (stopped) frees the node.
  EXPECT_TRUE(exit_task("node-a", id, 1, 1, 3).empty());
  exit_task("node-a", id, 1, 0, 0, 15);
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_EQ(free_slots("node-a"), 2);
}

TEST_F(CoordinatorTest, ANodeWhoseRanksAllFinishedBeforeACoordinatorRestartIsNotTakenForALostOne) {
  add_node("node-a", 2);
  add_node("node-b", 2);
  const std::string id = submit(valid_spec("half-done", 2, 2));
  tick_and_start();
  exit_task("node-b", id, 1, 2, 0);
  exit_task("node-b", id, 1, 3, 0);
  coordinator_.reset();
  open();
  // node-b runs nothing of it any more; it holds both exits.
  auto b = coordinator_->register_node(node_info("node-b", 2), {RunningAttempt{id, 1, {}, {seen_exit(2, 0), seen_exit(3, 0)}}});
  ASSERT_TRUE(b.ok()) << b.status().to_string();
  EXPECT_TRUE(b->empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning) << job(id).machine.reason();
  EXPECT_EQ(free_slots("node-b"), 2);
  auto a = coordinator_->register_node(node_info("node-a", 2), {RunningAttempt{id, 1, {0, 1}}});
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(a->empty());
  clock_.advance(kLease / 2);
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
  clock_.advance(kLease / 2 + seconds(1));  // past the reconcile window: both nodes accounted for
  EXPECT_TRUE(coordinator_->tick().empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning) << job(id).machine.reason();
  exit_task("node-a", id, 1, 0, 0);
  exit_task("node-a", id, 1, 1, 0);
  EXPECT_EQ(job(id).state(), JobState::kSucceeded) << job(id).machine.reason();
  EXPECT_EQ(free_slots("node-a"), 2);
}

TEST_F(CoordinatorTest, ARankANodeNeitherRunsNorSawExitIsLost) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("forgotten", 1, 2));
  tick_and_start();
  coordinator_.reset();
  open();
  auto orders = coordinator_->register_node(node_info("node-a", 2), {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(orders.ok());
  EXPECT_EQ(stopped_nodes(*orders), (std::vector<std::string>{"node-a"}));
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(id).machine.reason(), "registered without job " + id + " attempt 1's rank(s) 1:"))
      << job(id).machine.reason();
}

TEST_F(CoordinatorTest, ANodeRegisteringWithTheTasksOfACancelledJobIsToldAgainToStopThem) {
  add_node("node-a", 1);
  const std::string id = submit(valid_spec("cancelled", 1, 1));
  tick_and_start();
  auto cancelled = coordinator_->cancel(id, "");
  ASSERT_TRUE(cancelled.ok());
  ASSERT_EQ(stopped_nodes(*cancelled), (std::vector<std::string>{"node-a"}));
  // That stop never arrived; the node re-registers still running the task.
  auto orders = coordinator_->register_node(node_info("node-a", 1), {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  ASSERT_EQ(orders->stops.size(), 1u);
  EXPECT_EQ(orders->stops[0].node_id, "node-a");
  EXPECT_EQ(orders->stops[0].job_id, id);
  EXPECT_EQ(orders->stops[0].attempt, 1);
  EXPECT_TRUE(contains(orders->stops[0].reason, "CANCELLED")) << orders->stops[0].reason;
  EXPECT_EQ(free_slots("node-a"), 0) << "its task still runs there";
  exit_task("node-a", id, 1, 0, 0, 15);
  EXPECT_EQ(free_slots("node-a"), 1);
  EXPECT_EQ(job(id).state(), JobState::kCancelled);
}

TEST_F(CoordinatorTest, ANodeRegisteringWithASupersededAttemptIsToldToStopIt) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  cohort::v1::JobSpec spec = valid_spec("superseded", 2, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  tick_and_start();
  // Rank 1 fails: attempt 1 is over, its rank 0 on node-a is told to stop (that stop is lost).
  AgentOrders failed = exit_task("node-b", id, 1, 1, 1);
  ASSERT_EQ(stopped_nodes(failed), (std::vector<std::string>{"node-a"}));
  ASSERT_EQ(job(id).attempt(), 2);
  auto orders = coordinator_->register_node(node_info("node-a", 1), {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  ASSERT_EQ(orders->stops.size(), 1u);
  EXPECT_EQ(orders->stops[0].attempt, 1);
  EXPECT_TRUE(contains(orders->stops[0].reason, "at attempt 2")) << orders->stops[0].reason;
}

TEST_F(CoordinatorTest, AnAttemptWhoseNodeNeverReportsItsTasksStartedFailsAtTheStartDeadline) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("unstarted", 2, 1));
  AgentOrders placed = coordinator_->tick();
  ASSERT_EQ(placed.launches.size(), 2u);
  // node-a started; node-b's launch failed and that report was lost (refused while the store failed).
  ASSERT_TRUE(coordinator_->report_tasks_started("node-a", id, 1).ok());
  auto keep_nodes_alive = [&](Duration total) {
    for (Duration passed(0); passed < total; passed += seconds(5)) {
      clock_.advance(seconds(5));
      ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
      ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
      EXPECT_TRUE(coordinator_->tick().empty());
    }
  };
  keep_nodes_alive(kDefaultStartTimeout - seconds(5));
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  EXPECT_EQ(free_slots("node-b"), 0);
  clock_.advance(seconds(5));
  AgentOrders orders = coordinator_->tick();
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(id).machine.reason(), "node(s) node-b did not report attempt 1's tasks started"))
      << job(id).machine.reason();
  // node-b is told to stop in case its tasks started after all; its slot is free again.
  EXPECT_EQ(stopped_nodes(orders), (std::vector<std::string>{"node-a", "node-b"}));
  EXPECT_EQ(free_slots("node-b"), 1);
  EXPECT_EQ(free_slots("node-a"), 0);
  exit_task("node-a", id, 1, 0, 0, 15);
  EXPECT_EQ(free_slots("node-a"), 1);
}

// Heartbeat reconciliation: the backstop for stops that never arrived while the node stays registered.

TEST_F(CoordinatorTest, AHeartbeatStillReportingACancelledJobWhoseStopsAllFailedIsToldToStopIt) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("cancelled", 1, 1));
  tick_and_start();
  const std::string placed_on = job(id).placement.nodes.at(0).node_id;
  const std::string other = placed_on == "node-a" ? "node-b" : "node-a";
  auto cancelled = coordinator_->cancel(id, "");
  ASSERT_TRUE(cancelled.ok());
  ASSERT_EQ(stopped_nodes(*cancelled), std::vector<std::string>{placed_on});
  // Every send of that stop failed (the agent answered UNAVAILABLE past kMaxStopTries); the node
  // stays registered and keeps heartbeating with the task still running.
  clock_.advance(seconds(5));
  ASSERT_TRUE(coordinator_->heartbeat(other).ok());
  auto stops = coordinator_->heartbeat(placed_on, false, {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  ASSERT_EQ(stops->size(), 1u);
  EXPECT_EQ((*stops)[0].node_id, placed_on);
  EXPECT_EQ((*stops)[0].job_id, id);
  EXPECT_EQ((*stops)[0].attempt, 1);
  EXPECT_TRUE(contains((*stops)[0].reason, "the job is CANCELLED")) << (*stops)[0].reason;
  // The heartbeat renewed the lease: past the original one the node is still there.
  clock_.advance(kLease - seconds(1));
  ASSERT_TRUE(coordinator_->heartbeat(other).ok());
  EXPECT_TRUE(coordinator_->tick().empty());
  EXPECT_EQ(free_slots(placed_on), 0) << "its task still runs there";
  // Told again at every heartbeat until its exit comes; then nothing is left to stop.
  stops = coordinator_->heartbeat(placed_on, false, {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(stops.ok());
  EXPECT_EQ(stops->size(), 1u);
  exit_task(placed_on, id, 1, 0, 0, 15);
  EXPECT_EQ(free_slots(placed_on), 1);
  stops = coordinator_->heartbeat(placed_on, false, {});
  ASSERT_TRUE(stops.ok());
  EXPECT_TRUE(stops->empty());
  // The other node runs nothing of it and reports nothing: nothing for it either.
  stops = coordinator_->heartbeat(other, false, {});
  ASSERT_TRUE(stops.ok());
  EXPECT_TRUE(stops->empty());
}

TEST_F(CoordinatorTest, AHeartbeatStillReportingASupersededAttemptIsToldToStopItAndKeepsTheNewOne) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  add_node("node-c", 1);
  cohort::v1::JobSpec spec = valid_spec("superseded", 2, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  tick_and_start();
  const std::string a = job(id).placement.nodes.at(0).node_id;
  const std::string b = job(id).placement.nodes.at(1).node_id;
  // Rank 1 fails; the stop of rank 0 on the first node never arrives.
  ASSERT_EQ(stopped_nodes(exit_task(b, id, 1, 1, 1)), std::vector<std::string>{a});
  ASSERT_EQ(job(id).attempt(), 2);
  auto stops = coordinator_->heartbeat(a, false, {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  ASSERT_EQ(stops->size(), 1u);
  EXPECT_EQ((*stops)[0].attempt, 1);
  EXPECT_TRUE(contains((*stops)[0].reason, "is at attempt 2 now")) << (*stops)[0].reason;
  // Attempt 2 runs on the nodes that are free; a heartbeat reporting it is left alone.
  tick_and_start();
  ASSERT_EQ(job(id).state(), JobState::kRunning);
  const NodeAssignment second = job(id).placement.nodes.at(0);
  stops = coordinator_->heartbeat(second.node_id, false, {RunningAttempt{id, 2, {second.first_rank}}});
  ASSERT_TRUE(stops.ok());
  EXPECT_TRUE(stops->empty());
}

TEST_F(CoordinatorTest, AJustPlacedAttemptIsNotStoppedWhetherOrNotTheHeartbeatReportsIt) {
  add_node("node-a", 1);
  const std::string id = submit(valid_spec("placed", 1, 1));
  AgentOrders placed = coordinator_->tick();
  ASSERT_EQ(placed.launches.size(), 1u);
  ASSERT_EQ(job(id).state(), JobState::kPlaced);
  // The launch order has not reached the agent (or is being carried out there): its heartbeat lists
  // nothing. That is neither a stop nor a loss.
  auto stops = coordinator_->heartbeat("node-a", false, {});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  EXPECT_TRUE(stops->empty());
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  // The agent started the tasks and its heartbeat lists them before the dispatch thread has the
  // launch's answer (so before report_tasks_started): still the coordinator's, kept.
  stops = coordinator_->heartbeat("node-a", false, {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(stops.ok());
  EXPECT_TRUE(stops->empty());
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
  EXPECT_EQ(free_slots("node-a"), 0);
  ASSERT_TRUE(coordinator_->report_tasks_started("node-a", id, 1).ok());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  stops = coordinator_->heartbeat("node-a", false, {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(stops.ok());
  EXPECT_TRUE(stops->empty());
}

TEST_F(CoordinatorTest, AHeartbeatReportingAnAttemptTheCoordinatorDoesNotKnowOrdersNothing) {
  add_node("node-a", 2);
  const std::string id = submit(valid_spec("known", 1, 1));
  tick_and_start();
  // Tasks of a job this coordinator has no record of, of an attempt newer than any it made, and one
  // whose ranks all ended: another leader may have launched the first two (this one deposed without
  // knowing it yet), so no stop; the node's next registration reconciles them otherwise.
  auto stops = coordinator_->heartbeat(
      "node-a", false,
      {RunningAttempt{id, 1, {0}}, RunningAttempt{"ghost-7", 1, {0, 1}}, RunningAttempt{id, 3, {0}},
       RunningAttempt{"ended-8", 1, {}}});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  for (const StopOrder& stop : *stops) {
    ADD_FAILURE() << "job " << stop.job_id << " attempt " << stop.attempt << " stopped: " << stop.reason;
  }
  // Judging what a node runs changed nothing here.
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  // A node that is not registered must register (NOT_FOUND), which reconciles it; no stops.
  auto unknown = coordinator_->heartbeat("node-z", false, {RunningAttempt{"ghost-7", 1, {0}}});
  EXPECT_EQ(unknown.status().code(), StatusCode::kNotFound);
}

// A deposed leader that has not noticed yet (its gate still says leading) gets a heartbeat the
// agent's LeaderChannel sent it after one failed call to the new leader. What the new leader did
// since is behind this one's records: it placed the job this one holds PENDING, or the next attempt
// of a job whose attempt this one last saw fail. Neither is stopped; the superseded attempt is.
TEST_F(CoordinatorTest, AStaleLeadersHeartbeatReplyLeavesWhatANewLeaderMayHaveLaunchedAlone) {
  add_node("node-a", 1);
  cohort::v1::JobSpec spec = valid_spec("restarted", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string restarted = submit(spec);
  tick_and_start();
  ASSERT_EQ(job(restarted).placement.nodes.at(0).node_id, "node-a");
  // Its rank fails: attempt 2 is PENDING here. Before this coordinator ticks, it loses its lease; the
  // new leader places attempt 2 on node-a, whose agent launches it.
  exit_task("node-a", restarted, 1, 0, 1);
  ASSERT_EQ(job(restarted).attempt(), 2);
  ASSERT_EQ(job(restarted).state(), JobState::kPending);
  // A job submitted here and not placed yet (no tick since), which the new leader has placed on
  // node-a too, at attempt 1.
  const std::string waiting = submit(valid_spec("waiting", 1, 1));
  ASSERT_EQ(job(waiting).state(), JobState::kPending);
  auto stops = coordinator_->heartbeat(
      "node-a", false,
      {RunningAttempt{restarted, 2, {0}}, RunningAttempt{waiting, 1, {0}}, RunningAttempt{restarted, 1, {0}}});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  ASSERT_EQ(stops->size(), 1u) << "only the superseded attempt 1 is over whoever leads";
  EXPECT_EQ((*stops)[0].job_id, restarted);
  EXPECT_EQ((*stops)[0].attempt, 1);
  EXPECT_TRUE(contains((*stops)[0].reason, "is at attempt 2 now")) << (*stops)[0].reason;
  // A job that ended is over whoever leads: its tasks still reported are stopped.
  ASSERT_TRUE(coordinator_->cancel(waiting, "").ok());
  stops = coordinator_->heartbeat("node-a", false, {RunningAttempt{waiting, 1, {0}}});
  ASSERT_TRUE(stops.ok()) << stops.status().to_string();
  ASSERT_EQ(stops->size(), 1u);
  EXPECT_TRUE(contains((*stops)[0].reason, "the job is CANCELLED")) << (*stops)[0].reason;
}

TEST_F(CoordinatorTest, ARecoveredAttemptANodeNeverReportsFailsWhenTheReconcileWindowEnds) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("half", 2, 1));
  tick_and_start();
  coordinator_.reset();
  open();
  ASSERT_TRUE(coordinator_->register_node(node_info("node-a", 1), {RunningAttempt{id, 1, {0}}}).ok());
  clock_.advance(kLease - seconds(1));
  EXPECT_TRUE(coordinator_->tick().empty()) << "still within the window";
  ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
  clock_.advance(seconds(2));
  AgentOrders orders = coordinator_->tick();
  EXPECT_EQ(job(id).state(), JobState::kFailed);
  EXPECT_TRUE(contains(job(id).machine.reason(), "node(s) node-b did not report attempt 1")) << job(id).machine.reason();
  EXPECT_EQ(stopped_nodes(orders), (std::vector<std::string>{"node-a"}));
}

TEST_F(CoordinatorTest, ANodeReturningWithAnAttemptItNoLongerOwnsIsToldToStopIt) {
  add_node("node-a", 1);
  cohort::v1::JobSpec spec = valid_spec("moved", 1, 1);
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  tick_and_start();
  add_node("node-b", 1);
  // node-a goes silent past its lease: the attempt fails over to node-b.
  clock_.advance(kLease / 2);
  ASSERT_TRUE(coordinator_->heartbeat("node-b").ok());
  clock_.advance(kLease / 2 + seconds(1));
  AgentOrders moved = coordinator_->tick();
  ASSERT_EQ(moved.launches.size(), 1u);
  EXPECT_EQ(moved.launches[0].node.node_id, "node-b");
  // node-a comes back still running attempt 1 (it had not fenced): it is told to stop it, and its
  // slot counts as free again; attempt 2 is untouched.
  auto orders = coordinator_->register_node(node_info("node-a", 1), {RunningAttempt{id, 1, {0}}});
  ASSERT_TRUE(orders.ok());
  ASSERT_EQ(orders->stops.size(), 1u);
  EXPECT_EQ(orders->stops[0].node_id, "node-a");
  EXPECT_EQ(orders->stops[0].attempt, 1);
  EXPECT_EQ(free_slots("node-a"), 1);
  EXPECT_EQ(job(id).attempt(), 2);
  EXPECT_EQ(job(id).state(), JobState::kPlaced);
}

TEST_F(CoordinatorTest, ReRegisteringALiveNodeThatStillRunsItsTasksKeepsThem) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = submit(valid_spec("kept", 2, 1));
  tick_and_start();
  auto orders = coordinator_->register_node(node_info("node-b", 1), {RunningAttempt{id, 1, {1}}});
  ASSERT_TRUE(orders.ok());
  EXPECT_TRUE(orders->empty());
  EXPECT_EQ(job(id).state(), JobState::kRunning);
  EXPECT_EQ(free_slots("node-b"), 0);
}

TEST_F(CoordinatorTest, TheMetricsHistorySurvivesARestartAndNewEventsComeAfterIt) {
  add_node("node-a", 1);
  const std::string id = submit(valid_spec("curve", 1, 1));
  tick_and_start();
  for (int64_t step = 10; step <= 30; step += 10) {
    // Every field the worker sends, the communication wait different in each report.
    Metrics m{step, 0, 1.0 / static_cast<double>(step), 0.5, 100, 0};
    m.total_steps = 300;
    m.total_epochs = 3;
    m.samples_per_step = 16;
    m.comm_wait_s = 0.1 * static_cast<double>(step);
    m.comm_wait_ratio = static_cast<double>(step) / 100.0;
    ASSERT_TRUE(coordinator_->report_metrics(id, 1, m).ok());
  }
  auto before = coordinator_->metrics_history(id, 0, 0);
  ASSERT_TRUE(before.ok()) << before.status().to_string();
  ASSERT_EQ(before->size(), 3u);
  const int64_t last_seq = before->back().seq;

  coordinator_.reset();
  open();

  auto after = coordinator_->metrics_history(id, 0, 0);
  ASSERT_TRUE(after.ok()) << after.status().to_string();
  ASSERT_EQ(after->size(), before->size());
  for (size_t i = 0; i < after->size(); ++i) {
    EXPECT_EQ((*after)[i].seq, (*before)[i].seq);
    EXPECT_EQ((*after)[i].attempt, 1);
    EXPECT_EQ((*after)[i].metrics.step, (*before)[i].metrics.step);
    EXPECT_DOUBLE_EQ((*after)[i].metrics.loss, (*before)[i].metrics.loss);
    EXPECT_DOUBLE_EQ((*after)[i].metrics.comm_wait_s, 0.1 * static_cast<double>((*before)[i].metrics.step));
    EXPECT_DOUBLE_EQ((*after)[i].metrics.comm_wait_ratio, static_cast<double>((*before)[i].metrics.step) / 100.0);
    EXPECT_EQ((*after)[i].metrics.total_steps, 300);
    EXPECT_EQ((*after)[i].metrics.total_epochs, 3);
    EXPECT_EQ((*after)[i].metrics.samples_per_step, 16);
  }
  // The job's last metrics keep them too.
  ASSERT_TRUE(job(id).last_metrics.has_value());
  EXPECT_DOUBLE_EQ(job(id).last_metrics->comm_wait_s, 3.0);
  EXPECT_DOUBLE_EQ(job(id).last_metrics->comm_wait_ratio, 0.3);
  // Events after the restart (here: the next submission) never reuse a metrics report's seq.
  const std::string next = submit(valid_spec("next", 1, 1));
  auto events = coordinator_->events(next, 0, Duration(0));
  ASSERT_TRUE(events.ok());
  ASSERT_FALSE(events->empty());
  EXPECT_GT(events->front().seq, last_seq);
  EXPECT_EQ(coordinator_->metrics_history("nope-1", 0, 0).status().code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, WatchersGetStateChangesAndMetricsAsTheyHappen) {
  add_node("node-a", 1);
  const std::string id = submit(valid_spec("watched", 1, 1));
  auto initial = coordinator_->events(id, 0, Duration(0));
  ASSERT_TRUE(initial.ok());
  ASSERT_EQ(initial->size(), 1u);
  const int64_t seen = initial->back().seq;
  EXPECT_EQ(initial->back().change.reason, "submitted");
  EXPECT_EQ(initial->back().unix_ms, FakeClock::kDefaultStartUnixMillis);

  // Nothing new: a zero timeout returns at once with nothing.
  auto none = coordinator_->events(id, seen, Duration(0));
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // A watcher blocked on the job wakes when it is placed.
  StatusOr<std::vector<JobEvent>> woken = internal_error("not woken");
  std::thread watcher([&] { woken = coordinator_->events(id, seen, kGenerous); });
  coordinator_->tick();
  watcher.join();
  ASSERT_TRUE(woken.ok()) << woken.status().to_string();
  ASSERT_FALSE(woken->empty());
  EXPECT_EQ(woken->front().change.to, JobState::kPlaced);
  EXPECT_GT(woken->front().seq, seen);

  ASSERT_TRUE(coordinator_->report_metrics(id, 1, Metrics{7, 0, 1.25, 0, 320.0, 0}).ok());
  auto latest = coordinator_->events(id, woken->back().seq, Duration(0));
  ASSERT_TRUE(latest.ok());
  ASSERT_EQ(latest->size(), 1u);
  EXPECT_EQ(latest->front().kind, JobEvent::Kind::kMetrics);
  EXPECT_EQ(latest->front().metrics.step, 7);
  EXPECT_DOUBLE_EQ(job(id).last_metrics->loss, 1.25);

  EXPECT_EQ(coordinator_->events("ghost-1", 0, Duration(0)).status().code(), StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, ShutdownWakesWatchersClosesRendezvousAndRefusesJobs) {
  add_node("node-a", 1);
  const std::string id = submit(valid_spec("draining", 1, 1));
  coordinator_->tick();
  std::shared_ptr<Rendezvous> rdzv = coordinator_->rendezvous(id, 1).value();
  const int64_t last = coordinator_->events(id, 0, Duration(0))->back().seq;
  Status watched;
  std::thread watcher([&] { watched = coordinator_->events(id, last, kGenerous).status(); });
  coordinator_->shutdown();
  watcher.join();
  EXPECT_EQ(watched.code(), StatusCode::kUnavailable);
  EXPECT_EQ(rdzv->join("node-a", 0, kGenerous).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(coordinator_->submit(valid_spec()).status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(coordinator_->tick().empty());
}

// ListJobs pages: submission order, a filter, and a cursor that is the last job's seq.
TEST_F(CoordinatorTest, JobPagesFollowSubmissionOrder) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(submit(valid_spec("job" + std::to_string(i))));
  JobPage first = coordinator_->list_jobs_page(0, 2);
  ASSERT_EQ(first.jobs.size(), 2u);
  EXPECT_EQ(first.jobs[0].id, ids[0]);
  EXPECT_EQ(first.jobs[1].id, ids[1]);
  ASSERT_NE(first.next_after_seq, 0);
  JobPage second = coordinator_->list_jobs_page(first.next_after_seq, 2);
  ASSERT_EQ(second.jobs.size(), 2u);
  EXPECT_EQ(second.jobs[0].id, ids[2]);
  JobPage last = coordinator_->list_jobs_page(second.next_after_seq, 2);
  ASSERT_EQ(last.jobs.size(), 1u);
  EXPECT_EQ(last.jobs[0].id, ids[4]);
  EXPECT_EQ(last.next_after_seq, 0);  // no more
  // Exactly a page's worth left: no empty extra page.
  EXPECT_EQ(coordinator_->list_jobs_page(first.next_after_seq, 3).next_after_seq, 0);
  JobPage odd = coordinator_->list_jobs_page(0, 10, [](const Job& job) { return job.seq % 2 == 1; });
  EXPECT_EQ(odd.jobs.size(), 3u);
}

TEST_F(CoordinatorTest, CapacityCheckNamesWhatTheJobNeedsAndWhatTheClusterHas) {
  CapacityRequest request;
  Status none = coordinator_->check_capacity(valid_spec("a", 1, 1), request);
  EXPECT_EQ(none.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      contains(none.message(), "needs 1 node(s) with 1 slot(s) each, but the cluster has 0 live node(s)"))
      << none.message();
  EXPECT_TRUE(contains(none.message(), "--wait-for-capacity")) << none.message();
  request.wait_for_capacity = true;
  EXPECT_TRUE(coordinator_->check_capacity(valid_spec("a", 1, 1), request).ok());

  request.wait_for_capacity = false;
  add_node("n1", 4);
  add_node("n2", 2);
  EXPECT_TRUE(coordinator_->check_capacity(valid_spec("a", 2, 2), request).ok());
  Status too_many = coordinator_->check_capacity(valid_spec("a", 3, 1), request);
  EXPECT_EQ(too_many.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(too_many.message(), "needs 3 node(s)")) << too_many.message();
  EXPECT_TRUE(contains(too_many.message(), "the cluster has 2 live node(s), 2 of them that large"))
      << too_many.message();
  Status too_wide = coordinator_->check_capacity(valid_spec("a", 2, 3), request);
  EXPECT_EQ(too_wide.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(
      contains(too_wide.message(), "2 live node(s), 1 of them that large (the largest has 4 slot(s))"))
      << too_wide.message();
}

TEST_F(CoordinatorTest, CapacityCheckRefusesModelsLargerThanANodesMemory) {
  NodeInfo info;
  info.node_id = "big";
  info.address = "big:7071";
  info.slots = 4;
  info.memory_bytes = int64_t{8} << 30;  // 8 GiB
  ASSERT_TRUE(coordinator_->register_node(info).ok());
  CapacityRequest request;
  request.estimated_bytes_per_rank = int64_t{3} << 30;
  EXPECT_TRUE(coordinator_->check_capacity(valid_spec("a", 1, 2), request).ok());  // 6 GiB
  Status status = coordinator_->check_capacity(valid_spec("a", 1, 3), request);    // 9 GiB
  EXPECT_EQ(status.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(status.message(), "3 rank(s) per node need an estimated 3.0 GiB")) << status.message();
  EXPECT_TRUE(contains(status.message(), "has 8.0 GiB")) << status.message();
  // Beyond any node, even one still to join.
  request.wait_for_capacity = true;
  request.estimated_bytes_per_rank = kMaxEstimatedBytesPerRank + 1;
  Status huge = coordinator_->check_capacity(valid_spec("a", 1, 1), request);
  EXPECT_EQ(huge.code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(contains(huge.message(), "kMaxEstimatedBytesPerRank")) << huge.message();
}

TEST_F(CoordinatorTest, SpecPathsOutsideTheConfiguredRootsAreRefused) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.mutable_checkpoint()->set_dir("/srv/ckpt");
  spec.mutable_checkpoint()->set_interval_epochs(1);
  StatusOr<std::string> refused = coordinator_->submit(spec);
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(refused.status().message(), "checkpoint.dir '/srv/ckpt' lies outside"))
      << refused.status().message();
  coordinator_.reset();
  CoordinatorOptions options;
  options.data_dir = dir_.path();
  options.allowed_path_roots = {"/srv"};
  auto reopened = Coordinator::open(options, &clock_);
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  EXPECT_TRUE((*reopened)->submit(spec).ok());
  options.allowed_path_roots = {"relative"};
  EXPECT_EQ(Coordinator::open(options, &clock_).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::coordinator

namespace cohort::coordinator {
namespace {

// job_retention: a finished job's records (row, events, metrics history) are deleted by tick()
// once it ended more than the retention period ago; unfinished jobs are never deleted; a
// restarted coordinator neither brings the job back nor hands out its id again.
TEST_F(CoordinatorTest, FinishedJobsAreDeletedAfterTheRetentionPeriod) {
  add_node("node-a", 1);
  const std::string done = submit(valid_spec("done", 1, 1));
  tick_and_start();
  ASSERT_TRUE(coordinator_->report_metrics(done, 1, Metrics{10, 0, 0.5, 0.9, 100, 0}).ok());
  exit_task("node-a", done, 1, 0, 0);
  ASSERT_EQ(job(done).state(), JobState::kSucceeded);
  const std::string waiting = submit(valid_spec("waiting", 2, 1));  // never placed: one node only

  clock_.advance(kDefaultJobRetention - milliseconds(1));
  coordinator_->tick();
  EXPECT_TRUE(coordinator_->get_job(done).ok()) << "deleted before its retention period ended";
  auto kept = coordinator_->metrics_history(done, 0, 0);
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(kept->size(), 1u);

  clock_.advance(milliseconds(1));
  coordinator_->tick();
  EXPECT_EQ(coordinator_->get_job(done).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->metrics_history(done, 0, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(coordinator_->events(done, 0, Duration(0)).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(job(waiting).state(), JobState::kPending) << "an unfinished job is never deleted";

  // Restarted: the job stays gone (the store deleted it), its id is not reused, and its metrics
  // rows went with it.
  coordinator_.reset();
  open();
  EXPECT_EQ(coordinator_->get_job(done).status().code(), StatusCode::kNotFound);
  EXPECT_TRUE(coordinator_->get_job(waiting).ok());
  EXPECT_EQ(submit(valid_spec("done", 1, 1)), "done-3");
  EXPECT_EQ(coordinator_->metrics_history(done, 0, 0).status().code(), StatusCode::kNotFound);
}

TEST(CoordinatorRetentionTest, DeletedNewestJobKeepsItsIdRetiredAcrossRestarts) {
  TempDir dir;
  FakeClock clock;
  CoordinatorOptions options;
  options.data_dir = dir.path();
  options.job_retention = seconds(60);
  NodeInfo node;
  node.node_id = "node-a";
  node.address = "node-a:7071";
  node.hostname = "node-a";
  node.slots = 1;
  {
    auto coordinator = Coordinator::open(options, &clock);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    ASSERT_TRUE((*coordinator)->register_node(node).ok());
    auto id = (*coordinator)->submit(valid_spec("only", 1, 1));
    ASSERT_TRUE(id.ok());
    ASSERT_EQ(*id, "only-1");
    ASSERT_TRUE((*coordinator)->cancel(*id, "test").ok());  // PENDING → CANCELLED, holds nothing
    clock.advance(seconds(61));
    (*coordinator)->tick();
    ASSERT_EQ((*coordinator)->get_job(*id).status().code(), StatusCode::kNotFound);
    EXPECT_TRUE((*coordinator)->list_jobs().empty());
  }
  // Every job is gone from the database, yet the next id is not "only-1" again.
  auto reopened = Coordinator::open(options, &clock);
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  EXPECT_TRUE((*reopened)->list_jobs().empty());
  auto next = (*reopened)->submit(valid_spec("only", 1, 1));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(*next, "only-2");
  auto events = (*reopened)->events(*next, 0, Duration(0));
  ASSERT_TRUE(events.ok());
  ASSERT_FALSE(events->empty());
  EXPECT_GT(events->front().seq, 2) << "event seqs of the deleted job are not reused";
}

// The SQLite store, except that a save can be made to land and then answer UNAVAILABLE (an etcd
// write committed whose reply was lost in a leader change), and deletes can be refused.
struct LostReplyControl {
  bool lose_next_save_reply = false;
  bool refuse_deletes = false;
  std::string refuse_saves_of;  // a job id whose saves are refused (not written)
};

class LostReplyStore final : public JobStore {
 public:
  LostReplyStore(std::unique_ptr<JobStore> inner, LostReplyControl* control)
      : inner_(std::move(inner)), control_(control) {}
  Status upsert_job(const Job& job) override { return inner_->upsert_job(job); }
  Status append_event(const JobEvent& event) override { return inner_->append_event(event); }
  Status save(const Job& job, const JobEvent& event) override {
    if (job.id == control_->refuse_saves_of) return unavailable_error("etcd Txn: no member answered (test)");
    COHORT_RETURN_IF_ERROR(inner_->save(job, event));
    if (!control_->lose_next_save_reply) return ok_status();
    control_->lose_next_save_reply = false;
    return unavailable_error("etcd Txn: no answer within the deadline (test: the write landed)");
  }
  Status append_metrics(const std::string& job_id, const MetricsRecord& record, int64_t max_rows) override {
    return inner_->append_metrics(job_id, record, max_rows);
  }
  StatusOr<std::vector<MetricsRecord>> load_metrics(const std::string& job_id, int64_t after_seq,
                                                    int attempt) const override {
    return inner_->load_metrics(job_id, after_seq, attempt);
  }
  Status delete_job(const std::string& job_id) override {
    if (control_->refuse_deletes) return unavailable_error("etcd Txn: no member answered (test)");
    return inner_->delete_job(job_id);
  }
  Status put_node(const NodeInfo& node) override { return inner_->put_node(node); }
  Status delete_node(const std::string& node_id) override { return inner_->delete_node(node_id); }
  StatusOr<Snapshot> load_all() const override { return inner_->load_all(); }
  const std::string& path() const override { return inner_->path(); }

 private:
  std::unique_ptr<JobStore> inner_;
  LostReplyControl* control_;
};

class LostSaveReplyTest : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<Coordinator> open() {
    CoordinatorOptions options;
    options.data_dir = dir_.path();
    options.open_store = [this]() -> StatusOr<std::unique_ptr<JobStore>> {
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> inner, JobStore::open(dir_.path()));
      return std::unique_ptr<JobStore>(std::make_unique<LostReplyStore>(std::move(inner), &control_));
    };
    auto coordinator = Coordinator::open(options, &clock_);
    EXPECT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    return coordinator.ok() ? std::move(*coordinator) : nullptr;
  }
  TempDir dir_;
  FakeClock clock_;
  LostReplyControl control_;
};

TEST_P(LostSaveReplyTest, ASubmitWhoseSaveLandedWithoutAnAnswerLeavesNoSecondJobAfterARestart) {
  // GetParam(): the delete right after the lost reply fails too, so it happens at the store retry.
  const bool delete_fails_at_first = GetParam();
  std::vector<std::string> accepted;
  {
    auto coordinator = open();
    ASSERT_NE(coordinator, nullptr);
    control_.lose_next_save_reply = true;
    control_.refuse_deletes = delete_fails_at_first;
    auto refused = coordinator->submit(valid_spec("train", 1, 1));
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable) << refused.status().to_string();
    EXPECT_TRUE(coordinator->list_jobs().empty());
    if (delete_fails_at_first) {
      clock_.advance(kDefaultStoreRetryInterval);
      coordinator->tick();
      EXPECT_EQ(coordinator->store_status().code(), StatusCode::kUnavailable)
          << "the store counts as writable while a refused submit's record may still be in it";
      control_.refuse_deletes = false;
    }
    clock_.advance(kDefaultStoreRetryInterval);
    coordinator->tick();
    ASSERT_TRUE(coordinator->store_status().ok()) << coordinator->store_status().to_string();
    // The client was told the submit failed: it submits again.
    auto again = coordinator->submit(valid_spec("train", 1, 1));
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    accepted.push_back(*again);
  }
  // The next start (or takeover) loads only the job the client was told about.
  auto reopened = open();
  ASSERT_NE(reopened, nullptr);
  std::vector<std::string> loaded;
  for (const Job& job : reopened->list_jobs()) loaded.push_back(job.id);
  EXPECT_EQ(loaded, accepted) << "a refused submit's record loaded as a job of its own (it would run twice)";
}

INSTANTIATE_TEST_SUITE_P(DeleteAtOnceOrAtTheRetry, LostSaveReplyTest, ::testing::Bool());

class RegisterRefusedSaveTest : public LostSaveReplyTest {};

TEST_F(RegisterRefusedSaveTest, ARegistrationWhoseLaterWriteFailsStillGivesTheOrdersOfWhatItStored) {
  auto coordinator = open();
  ASSERT_NE(coordinator, nullptr);
  for (const char* node : {"node-a", "node-b"}) ASSERT_TRUE(coordinator->register_node(node_info(node, 2)).ok());
  auto first = coordinator->submit(valid_spec("first", 2, 1));
  auto second = coordinator->submit(valid_spec("second", 2, 1));
  ASSERT_TRUE(first.ok() && second.ok());
  std::map<std::string, int> rank_on_a;  // job id -> its rank on node-a
  for (const LaunchOrder& launch : coordinator->tick().launches) {
    ASSERT_TRUE(coordinator->report_tasks_started(launch.node.node_id, launch.job_id, launch.attempt).ok());
    if (launch.node.node_id == "node-a") rank_on_a[launch.job_id] = launch.node.first_rank;
  }
  ASSERT_EQ(rank_on_a.size(), 2u);
  // node-a registers again with both jobs' ranks there failed. The first job's failure is stored
  // (attempts are reconciled in job id order); the second's save is refused.
  control_.refuse_saves_of = *second;
  AgentOrders unsent;
  auto orders = coordinator->register_node(node_info("node-a", 2),
                                           {RunningAttempt{*first, 1, {}, {seen_exit(rank_on_a[*first], 1)}},
                                            RunningAttempt{*second, 1, {}, {seen_exit(rank_on_a[*second], 1)}}},
                                           &unsent);
  ASSERT_FALSE(orders.ok());
  EXPECT_EQ(orders.status().code(), StatusCode::kUnavailable) << orders.status().to_string();
  auto stored = coordinator->get_job(*first);
  ASSERT_TRUE(stored.ok());
  EXPECT_NE(stored->state(), JobState::kRunning) << "the first job's failure was not taken";
  // Its rank on node-b runs on unless the stop decided with that failure is sent.
  bool stops_first_on_b = false;
  for (const StopOrder& stop : unsent.stops) {
    stops_first_on_b = stops_first_on_b || (stop.node_id == "node-b" && stop.job_id == *first);
  }
  EXPECT_TRUE(stops_first_on_b) << "the orders decided before the refused write were dropped";
}

}  // namespace
}  // namespace cohort::coordinator
