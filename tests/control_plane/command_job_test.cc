// Command jobs through a live secure cluster (a coordinator and two agents, see live_cluster.h),
// with small shell programs so that each case is about the control plane, not training:
//   - every rank gets the launch environment (RANK ... MASTER_PORT, NODE_RANK, COHORT_INIT), the
//     spec's env, and runs as an unprivileged user;
//   - a rank that exits 1 on attempt 1 fails the attempt, the job restarts once
//     (max_restarts: 1), and attempt 2 sees COHORT_RESUME=1 and succeeds;
//   - cancel stops every rank of a running command job;
//   - a command outside the coordinator's allowed_commands is refused at submit, naming the list.

#include <sys/types.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

using testing::set_deadline;
using testing::worker_pids;

cohort::v1::JobSpec shell_job(const std::string& name, int nodes, int procs_per_node, const std::string& script) {
  cohort::v1::JobSpec spec;
  spec.set_name(name);
  spec.set_nodes(nodes);
  spec.set_procs_per_node(procs_per_node);
  spec.add_command("sh");  // a bare name: the agent finds it along PATH
  spec.add_command("-c");
  spec.add_command(script);
  return spec;
}

class CommandJobTest : public testing::LiveClusterTest {};

TEST_F(CommandJobTest, EveryRankGetsTheLaunchEnvironmentAndTheSpecsEnv) {
  cohort::v1::JobSpec spec = shell_job(
      "env", 2, 2,
      "echo \"rank=$RANK/$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE node=$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT "
      "init=${COHORT_INIT%%\\?*} greeting=$GREETING uid=$(id -u) attempt=$COHORT_ATTEMPT\"");
  (*spec.mutable_env())["GREETING"] = "hello";
  const std::string id = submit(spec);
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  ASSERT_EQ(job.placement().nodes_size(), 2);
  std::string master_port;
  for (int rank = 0; rank < 4; ++rank) {
    const std::string log = read_logs(job, rank);
    const std::string expected = "rank=" + std::to_string(rank) + "/4 local=" + std::to_string(rank % 2) +
                                 "/2 node=" + std::to_string(rank / 2) + " master=127.0.0.1:";
    EXPECT_EQ(log.rfind(expected, 0), 0u) << "rank " << rank << ": " << log;
    const size_t port_start = expected.size();
    const std::string port = log.substr(port_start, log.find(' ', port_start) - port_start);
    EXPECT_GT(std::stoi(port), 0) << log;
    if (rank == 0) master_port = port;
    EXPECT_EQ(port, master_port) << "every rank meets at one MASTER_PORT";
    EXPECT_NE(log.find("init=cohort://"), std::string::npos) << log;
    EXPECT_NE(log.find("greeting=hello"), std::string::npos) << log;
    EXPECT_EQ(log.find("uid=0 "), std::string::npos) << "a command job never runs as root: " << log;
    EXPECT_NE(log.find("attempt=1"), std::string::npos) << log;
  }
}

TEST_F(CommandJobTest, ARankThatFailsOnAttemptOneRestartsAndSeesTheResumeFlag) {
  cohort::v1::JobSpec spec = shell_job(
      "flaky", 2, 1,
      "echo \"attempt=$COHORT_ATTEMPT resume=${COHORT_RESUME:-unset}\"; "
      "if [ \"$COHORT_ATTEMPT\" = 1 ] && [ \"$RANK\" = 1 ]; then exit 1; fi");
  spec.mutable_restart_policy()->set_max_restarts(1);
  const std::string id = submit(spec);
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.attempt(), 2);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string log = read_logs(job, rank);
    EXPECT_NE(log.find("attempt=2 resume=1"), std::string::npos) << "rank " << rank << ": " << log;
  }
}

TEST_F(CommandJobTest, AFailingCommandWithoutRestartsFailsNamingTheRankAndCode) {
  const std::string id = submit(shell_job("failing", 1, 2, "if [ \"$RANK\" = 1 ]; then exit 3; fi"));
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::FAILED);
  ASSERT_EQ(job.state(), cohort::v1::FAILED) << job.reason();
  EXPECT_NE(job.reason().find("rank 1 on node "), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("exited with code 3"), std::string::npos) << job.reason();
}

TEST_F(CommandJobTest, CancelStopsEveryRank) {
  const std::string id = submit(shell_job("sleeper", 2, 1, "echo started; exec sleep 600"));
  ASSERT_FALSE(id.empty());
  ASSERT_EQ(wait_for_state(id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  ASSERT_TRUE(wait_for_workers(id, 2));
  cancel(id, "test cancel");
  EXPECT_EQ(wait_for_state(id, cohort::v1::CANCELLED).state(), cohort::v1::CANCELLED);
  EXPECT_TRUE(wait_for_no_workers(id)) << worker_pids(id).size() << " ranks still run";
}

class AllowListTest : public testing::LiveClusterTest {
 protected:
  void configure_coordinator(DaemonServerOptions& options) override {
    options.allowed_commands = {"/usr/bin/python3", "/bin/true"};
  }
};

TEST_F(AllowListTest, ACommandOutsideTheListIsRefusedAtSubmitNamingTheList) {
  cohort::v1::SubmitJobRequest request;
  *request.mutable_spec() = shell_job("outside", 1, 1, "echo hi");
  request.mutable_spec()->set_command(0, "/bin/sh");
  cohort::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = stub_->SubmitJob(&context, request, &response);
  ASSERT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("command[0] \"/bin/sh\" is not an allowed command"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("/usr/bin/python3, /bin/true"), std::string::npos) << status.error_message();
  EXPECT_TRUE(response.job_id().empty());

  // A listed command runs.
  cohort::v1::JobSpec allowed;
  allowed.set_name("allowed");
  allowed.set_nodes(1);
  allowed.set_procs_per_node(1);
  allowed.add_command("/bin/true");
  const std::string id = submit(allowed);
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(wait_for_state(id, cohort::v1::SUCCEEDED).state(), cohort::v1::SUCCEEDED);
}

}  // namespace
}  // namespace cohort::daemon
