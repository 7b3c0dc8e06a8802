// Fencing and reconciliation through a live secure cluster (issue 16):
//   - agents that cannot renew their lease for a whole lease stop their tasks (fencing), and the
//     restarted coordinator then fails the attempt they no longer run, with a reason;
//   - a coordinator restarted within the lease re-adopts the running attempt from the agents'
//     RegisterNode reports: the same workers finish, attempt 1 SUCCEEDS, nothing is relaunched.

#include <sys/types.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

using namespace std::chrono_literals;
using testing::worker_pids;

cohort::v1::JobSpec shell_job(const std::string& name, const std::string& script) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(2);
  spec.set_procs_per_node(1);
  spec.add_command("sh");
  spec.add_command("-c");
  spec.add_command(script);
  return spec;
}

class FencingTest : public testing::LiveClusterTest {
 protected:
  // A short lease so that losing it takes seconds.
  static constexpr auto kLease = 2s;
  void configure_coordinator(DaemonServerOptions& options) override { options.node_lease = kLease; }

  void restart_coordinator() {
    coordinator_->shutdown();
    coordinator_.reset();
    start_coordinator();
  }
};

TEST_F(FencingTest, AgentsThatLoseTheirLeaseStopTheirTasksBeforeRegisteringAgain) {
  const std::string id = submit(shell_job("fenced", "exec sleep 300"));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  ASSERT_TRUE(wait_for_workers(id, 2));
  const auto gone_at = std::chrono::steady_clock::now();
  coordinator_->shutdown();  // no agent can renew its lease now
  // Lease, then the agent's stop (SIGTERM ends `sleep` at once); the bound adds a loaded machine's margin.
  const auto bound = gone_at + kLease + 10s;
  while (!worker_pids(id).empty() && std::chrono::steady_clock::now() < bound) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(worker_pids(id).empty()) << "the agents did not fence their tasks within the lease + 10 s";
  // Counted from the last renewal, a heartbeat interval (lease / 3) at most before the coordinator went.
  EXPECT_GE(std::chrono::steady_clock::now() - gone_at, std::chrono::milliseconds(kLease) * 2 / 3);

  coordinator_.reset();
  start_coordinator();
  // The recovered attempt fails, naming why: an agent's report of a fenced rank, an agent that
  // registers again with nothing running, or (when its reconnect backs off past the reconcile
  // window) one that did not report the attempt in time, whichever reaches the coordinator first.
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_TRUE(job.reason().find("could not renew its lease") != std::string::npos ||
              job.reason().find("registered without job " + id + " attempt 1") != std::string::npos ||
              job.reason().find("did not report attempt 1") != std::string::npos)
      << job.reason();
  EXPECT_TRUE(worker_pids(id).empty()) << "nothing was relaunched over the fenced attempt";
}

// The default lease (15 s): a coordinator back within it finds the agents still running the attempt.
class ReconcileTest : public testing::LiveClusterTest {};

TEST_F(ReconcileTest, ARestartedCoordinatorReadoptsTheRunningAttemptInsteadOfRelaunchingIt) {
  const std::string id = submit(shell_job("readopted", "sleep 8; exit 0"));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  ASSERT_TRUE(wait_for_workers(id, 2));
  const std::vector<pid_t> before = worker_pids(id);
  ASSERT_FALSE(before.empty());
  coordinator_->shutdown();
  coordinator_.reset();
  start_coordinator();
  EXPECT_EQ(get_job(id).state(), cohort::v1::RUNNING) << get_job(id).reason();
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 1) << "nothing was relaunched";
}

}  // namespace
}  // namespace cohort::daemon
