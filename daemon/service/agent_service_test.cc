// The agent's launch contract as a worker sees it, driving AgentService::LaunchTasks directly
// (no server): job_spec.pb written per attempt, COHORT_INIT per local rank, the coordinator's
// MASTER_PORT (or a free one), COHORT_RESUME on a restart that resumes, CUDA_VISIBLE_DEVICES from
// the task's GPUs; and a draining agent refuses launches.

#include "daemon/service/agent_service.h"

#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "daemon/agent/process_launcher.h"
#include "daemon/agent/task_supervisor.h"
#include "daemon/agent/test_util.h"

namespace cohort::daemon {
namespace {

using agent::testing::kTestWaitTimeout;
using agent::testing::TempDir;
using agent::testing::wait_until;

constexpr const char* kPrintEnvironment =
    "echo \"init=$COHORT_INIT spec=$COHORT_JOB_SPEC port=$MASTER_PORT attempt=$COHORT_ATTEMPT "
    "resume=${COHORT_RESUME:-unset} cuda=${CUDA_VISIBLE_DEVICES-unset} coordinator=$COHORT_COORDINATOR\"";

class AgentServiceTest : public ::testing::Test {
 protected:
  AgentServiceTest() {
    agent::TaskSupervisorOptions options;
    options.log_dir = dir_.path();
    options.node_id = "node-a";
    supervisor_ = std::make_unique<agent::TaskSupervisor>(options, &launcher_, nullptr);
    AgentServiceOptions service_options;
    service_options.node_id = "node-a";
    service_options.slots = 4;
    service_options.worker_command = {"/bin/sh", "-c", kPrintEnvironment};
    service_options.spec_dir = dir_.path();
    service_ = std::make_unique<AgentService>(supervisor_.get(), service_options);
  }

  cohort::v1::LaunchTasksRequest request(int attempt) {
    cohort::v1::LaunchTasksRequest request;
    request.set_job_id("mnist-1");
    request.set_attempt(attempt);
    request.mutable_spec()->set_name("mnist");
    request.mutable_spec()->mutable_restart_policy()->set_from_checkpoint(true);
    request.set_world_size(2);
    request.set_num_nodes(1);
    request.set_master_address("127.0.0.1");
    request.set_coordinator_address("10.0.0.1:7070");
    cohort::v1::Task* first = request.add_tasks();
    first->set_rank(0);
    first->set_local_rank(0);
    first->add_gpus(1);
    cohort::v1::Task* second = request.add_tasks();
    second->set_rank(1);
    second->set_local_rank(1);
    second->add_gpus(2);
    second->add_gpus(3);
    return request;
  }

  // The rank's whole output once it has exited.
  std::string output_of(int rank) {
    std::string text;
    EXPECT_TRUE(wait_until(
        [&] {
          auto log = supervisor_->log("mnist-1", rank);
          if (!log.ok()) return false;
          auto chunk = (*log)->read_from(0);
          text = chunk.data;
          return chunk.closed;
        },
        kTestWaitTimeout));
    return text;
  }

  TempDir dir_;
  agent::PosixProcessLauncher launcher_;
  std::unique_ptr<agent::TaskSupervisor> supervisor_;
  std::unique_ptr<AgentService> service_;
};

TEST_F(AgentServiceTest, FirstAttemptGetsSpecInitPortAndGpus) {
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.set_master_port(29512);
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.pids_size(), 2);
  const std::string spec_path = dir_.path() + "/mnist-1/attempt-1/job_spec.pb";
  EXPECT_EQ(output_of(0), "init=cohort://10.0.0.1:7070/mnist-1?attempt=1&local_rank=0 spec=" + spec_path +
                              " port=29512 attempt=1 resume=unset cuda=1 coordinator=10.0.0.1:7070\n");
  EXPECT_EQ(output_of(1), "init=cohort://10.0.0.1:7070/mnist-1?attempt=1&local_rank=1 spec=" + spec_path +
                              " port=29512 attempt=1 resume=unset cuda=2,3 coordinator=10.0.0.1:7070\n");
  cohort::v1::JobSpec spec;
  std::ifstream in(spec_path, std::ios::binary);
  ASSERT_TRUE(spec.ParseFromIstream(&in));
  EXPECT_EQ(spec.name(), "mnist");
}

TEST_F(AgentServiceTest, RestartResumesAndWithoutAPortTheAgentPicksOne) {
  cohort::v1::LaunchTasksRequest launch = request(2);  // master_port 0: the agent's choice
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &response).ok());
  const std::string output = output_of(0);
  EXPECT_NE(output.find("attempt=2 resume=1"), std::string::npos) << output;
  EXPECT_NE(output.find("/mnist-1/attempt-2/job_spec.pb"), std::string::npos) << output;
  EXPECT_EQ(output.find("port=0 "), std::string::npos) << output;
  EXPECT_EQ(output.find("port= "), std::string::npos) << output;
}

// A rank placed without GPUs sees none (an empty CUDA_VISIBLE_DEVICES), rather than every GPU of
// the node.
TEST_F(AgentServiceTest, RanksWithoutGpusSeeNone) {
  cohort::v1::LaunchTasksRequest launch = request(1);
  for (cohort::v1::Task& task : *launch.mutable_tasks()) task.clear_gpus();
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &response).ok());
  for (int rank : {0, 1}) {
    const std::string output = output_of(rank);
    EXPECT_NE(output.find(" cuda= "), std::string::npos) << output;
  }
}

TEST_F(AgentServiceTest, DrainingAgentRefusesLaunches) {
  service_->start_draining();
  cohort::v1::LaunchTasksRequest launch = request(1);
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_NE(status.error_message().find("draining"), std::string::npos) << status.error_message();
}

}  // namespace
}  // namespace cohort::daemon
