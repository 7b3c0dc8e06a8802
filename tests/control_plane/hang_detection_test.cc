// Hang detection through a live secure cluster (issue 16): a stopped rank is found by its agent
// within seconds, whatever the collective timeout, and the job's reason names the rank, its pid,
// its node and what was seen; a rank busy in a long computation that keeps beating is not killed;
// a rank that beat and then went silent is.
//
// Command jobs of small shell programs keep each case about the control plane: the shell stands in
// for a rank (its heartbeat is `touch "$COHORT_HEARTBEAT_FILE"`, what worker/base/rank_heartbeat.h
// does from a thread in cohort-worker).

#include <signal.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/agent/task_supervisor.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

using namespace std::chrono_literals;
using testing::worker_pids;

// What the issue asks: detected within 15 s; the margin covers the tick, the exit report and the
// stop of the other ranks on a loaded 2-core machine.
constexpr auto kDetectionBound = 15s;
constexpr auto kReportMargin = 10s;

cohort::v1::JobSpec shell_job(const std::string& name, int nodes, const std::string& script) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(1);
  spec.add_command("sh");
  spec.add_command("-c");
  spec.add_command(script);
  return spec;
}

// The agents' default limits (stopped_task_limit 5 s): the case the issue names.
class HangDetectionTest : public testing::LiveClusterTest {};

TEST_F(HangDetectionTest, AStoppedRankFailsTheJobWithinSecondsNamingTheRankAndWhatWasSeen) {
  const std::string id = submit(shell_job("stopped", 2, "exec sleep 300"));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(wait_for_workers(id, 2));
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  std::vector<pid_t> rank1 = worker_pids(id, 1);
  ASSERT_EQ(rank1.size(), 1u);
  const auto stopped_at = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(rank1[0], SIGSTOP), 0);
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  const auto took = std::chrono::steady_clock::now() - stopped_at;
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_LT(took, kDetectionBound + kReportMargin)
      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms";
  EXPECT_GE(took, agent::kDefaultStoppedTaskLimit);
  const std::string node = job.placement().nodes(1).node_id();
  EXPECT_NE(job.reason().find("rank 1 on node " + node + ": pid " + std::to_string(rank1[0]) + " stopped (SIGSTOP"),
            std::string::npos)
      << job.reason();
  EXPECT_TRUE(wait_for_no_workers(id)) << "the stopped rank is killed and the other one stopped";
}

// Short heartbeat timeout so that "a long computation" is a few seconds.
class HeartbeatTest : public testing::LiveClusterTest {
 protected:
  static constexpr auto kHeartbeatTimeout = 1500ms;
  void configure_agent(DaemonServerOptions& options) override { options.task_heartbeat_timeout = kHeartbeatTimeout; }
};

// Rank 0 computes for three heartbeat timeouts while a background loop beats (as cohort-worker's
// heartbeat thread does); rank 1 never beats at all. Neither is killed.
TEST_F(HeartbeatTest, ABusyRankThatBeatsIsNotKilled) {
  const std::string id = submit(shell_job(
      "busy", 2,
      "if [ \"$RANK\" = 0 ]; then (while :; do touch \"$COHORT_HEARTBEAT_FILE\"; sleep 0.2; done) & fi; "
      "sleep 4.5; exit 0"));
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  EXPECT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
}

// Rank 1 beats once, then "hangs" with no beat (its thread stuck): killed after the timeout.
TEST_F(HeartbeatTest, ARankThatStopsBeatingFailsTheJobNamingTheHeartbeat) {
  const std::string id = submit(shell_job(
      "silent", 2, "if [ \"$RANK\" = 1 ]; then touch \"$COHORT_HEARTBEAT_FILE\"; fi; sleep 300"));
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_NE(job.reason().find("rank 1 on node"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("sent no heartbeat for"), std::string::npos) << job.reason();
  EXPECT_TRUE(wait_for_no_workers(id));
}

}  // namespace
}  // namespace cohort::daemon
