// The agent's launch contract as a worker sees it, driving AgentService::LaunchTasks directly
// (no server): job_spec.pb written per attempt, COHORT_INIT per local rank, the coordinator's
// MASTER_PORT (or a free one), COHORT_RESUME on a restart that resumes, CUDA_VISIBLE_DEVICES from
// the task's GPUs; and a draining agent refuses launches.

#include "daemon/service/agent_service.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/process_launcher.h"
#include "daemon/agent/task_supervisor.h"
#include "daemon/agent/test_util.h"
#include "daemon/agent/unix_user.h"

namespace cohort::daemon {
namespace {

using agent::testing::kTestWaitTimeout;
using agent::testing::TempDir;
using agent::testing::wait_until;

constexpr const char* kPrintEnvironment =
    "echo \"init=$COHORT_INIT spec=$COHORT_JOB_SPEC port=$MASTER_PORT attempt=$COHORT_ATTEMPT "
    "resume=${COHORT_RESUME:-unset} cuda=${CUDA_VISIBLE_DEVICES-unset} coordinator=$COHORT_COORDINATOR\"";

// Passes launches to the real launcher, except that one whose argv holds `marker` waits in launch()
// until open() (as a launch whose working_dir or command lies on a hung mount blocks there).
class GatedLauncher final : public agent::ProcessLauncher {
 public:
  explicit GatedLauncher(agent::ProcessLauncher* real) : real_(real) {}

  StatusOr<std::unique_ptr<agent::ProcessHandle>> launch(const agent::LaunchOptions& options) override {
    if (std::find(options.argv.begin(), options.argv.end(), marker_) != options.argv.end()) {
      std::unique_lock<std::mutex> lock(mu_);
      ++blocked_;
      cv_.notify_all();
      cv_.wait(lock, [this] { return open_; });
    }
    return real_->launch(options);
  }
  // Whether a gated launch has reached launch().
  bool blocked() {
    std::lock_guard<std::mutex> lock(mu_);
    return blocked_ > 0;
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  agent::ProcessLauncher* const real_;
  const std::string marker_ = "gated-launch";
  std::mutex mu_;
  std::condition_variable cv_;
  int blocked_ = 0;
  bool open_ = false;
};

class AgentServiceTest : public ::testing::Test {
 protected:
  AgentServiceTest() {
    // The agent's data directory as cohortd lays it out; the job user must pass through it.
    ::chmod(dir_.path().c_str(), 0711);
    agent::TaskSupervisorOptions options;
    options.log_dir = log_dir_;
    options.node_id = "node-a";
    supervisor_ = std::make_unique<agent::TaskSupervisor>(options, &gated_launcher_, nullptr);
    service_options_.node_id = "node-a";
    service_options_.slots = 4;
    service_options_.worker_command = {"/bin/sh", "-c", kPrintEnvironment};
    service_options_.spec_dir = log_dir_;
    service_options_.job_dir_root = dir_.path() + "/jobs";
    // Run unprivileged, this test is a single-user daemon: its jobs run as the user running it.
    service_options_.run_jobs_as_daemon_user = ::geteuid() != 0;
    service_ = std::make_unique<AgentService>(supervisor_.get(), service_options_);
  }

  // Replaces the service with one whose worker runs `command` (and whatever else `options` says).
  void use_worker(const std::string& command) {
    service_options_.worker_command = {"/bin/sh", "-c", command};
    service_ = std::make_unique<AgentService>(supervisor_.get(), service_options_);
  }

  // Job slow-1's launch of `attempt`, its tasks sleeping: for the gated launcher to hold.
  cohort::v1::LaunchTasksRequest gated_request(int attempt) {
    cohort::v1::LaunchTasksRequest gated = request(attempt);
    gated.set_job_id("slow-1");
    for (const char* arg : {"/bin/sh", "-c", "exec sleep 100", "gated-launch"}) gated.mutable_spec()->add_command(arg);
    return gated;
  }

  // LaunchTasks of `launch` on its own thread (the caller joins it); its status into `status`,
  // its response into `response` when given.
  std::thread launch_on_thread(const cohort::v1::LaunchTasksRequest& launch, grpc::Status* status,
                               cohort::v1::LaunchTasksResponse* response = nullptr) {
    return std::thread([this, &launch, status, response] {
      grpc::ServerContext context;
      cohort::v1::LaunchTasksResponse ignored;
      *status = service_->LaunchTasks(&context, &launch, response != nullptr ? response : &ignored);
    });
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
    request.set_owner("alice");  // the coordinator sends the job's owner; a launch without one is refused
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
  const std::string log_dir_ = dir_.path() + "/logs";
  AgentServiceOptions service_options_;
  agent::PosixProcessLauncher launcher_;
  GatedLauncher gated_launcher_{&launcher_};
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
  const std::string spec_path = log_dir_ + "/mnist-1/attempt-1/job_spec.pb";
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

TEST_F(AgentServiceTest, RanksRunAsTheJobUserInTheirOwnDirectory) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  StatusOr<agent::UnixUser> user = agent::lookup_unix_user(agent::kDefaultJobUser);
  ASSERT_TRUE(user.ok()) << user.status().message();
  use_worker(
      "echo \"uid=$(id -u) euid=$(id -u -r) pwd=$(pwd) dir=$COHORT_JOB_DIR secret=$COHORT_JOB_SECRET\"; "
      "cat \"$COHORT_JOB_SPEC\" >/dev/null && echo spec-readable");
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.set_job_secret("s3cret");
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string job_dir = dir_.path() + "/jobs/mnist-1";
  const std::string uid = std::to_string(user->uid);
  EXPECT_EQ(output_of(0), "uid=" + uid + " euid=" + uid + " pwd=" + job_dir + " dir=" + job_dir +
                              " secret=s3cret\nspec-readable\n");
  struct stat info {};
  ASSERT_EQ(::stat(job_dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, user->uid);
  EXPECT_EQ(info.st_mode & 07777, kJobDirMode);
  ASSERT_EQ(::stat((log_dir_ + "/mnist-1/attempt-1/job_spec.pb").c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, user->uid);
  EXPECT_EQ(info.st_mode & 07777, kJobSpecFileMode);
  // The logs stay the agent's.
  ASSERT_EQ(::stat((log_dir_ + "/mnist-1/attempt-1/rank-0.log").c_str(), &info), 0);
  EXPECT_EQ(info.st_uid, 0u);
}

TEST_F(AgentServiceTest, OwnerRunsAsTheUserItIsMappedTo) {
  if (::geteuid() != 0) GTEST_SKIP() << "switching users needs root";
  StatusOr<agent::UnixUser> nobody = agent::lookup_unix_user("nobody");
  if (!nobody.ok()) GTEST_SKIP() << "no user nobody";
  service_options_.user_map = {{"alice", "nobody"}};
  use_worker("id -u");
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.set_owner("alice");
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &response).ok());
  EXPECT_EQ(output_of(0), std::to_string(nobody->uid) + "\n");
}

// Two owners without a user_map entry on one root agent would share job_user, and with it each
// other's environment (the job secret), files and ranks: the first holds it, the second is refused
// naming both and the fix, also after the agent restarts; mapped to their own user they run.
TEST_F(AgentServiceTest, JobUserServesOneUnmappedOwnerPerNode) {
  if (::geteuid() != 0) GTEST_SKIP() << "an agent that is not root runs no job as job_user";
  StatusOr<agent::UnixUser> nobody = agent::lookup_unix_user("nobody");
  if (!nobody.ok()) GTEST_SKIP() << "no user nobody";
  use_worker("id -u");
  auto launch_as = [&](const std::string& owner, const std::string& job_id) {
    cohort::v1::LaunchTasksRequest launch = request(1);
    launch.set_owner(owner);
    launch.set_job_id(job_id);
    cohort::v1::LaunchTasksResponse response;
    grpc::ServerContext context;
    return service_->LaunchTasks(&context, &launch, &response);
  };
  grpc::Status alice = launch_as("alice", "mnist-1");
  ASSERT_TRUE(alice.ok()) << alice.error_message();
  grpc::Status bob = launch_as("bob", "bob-1");
  EXPECT_EQ(bob.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  for (const std::string expected :
       {"job 'bob-1' on node node-a", "owner 'bob' cannot run jobs as job_user 'cohort-job'",
        "owner 'alice' holds it", "map 'bob' to their own Unix user in user_map", "shared_job_user: true"}) {
    EXPECT_NE(bob.error_message().find(expected), std::string::npos) << expected << " in " << bob.error_message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/jobs/bob-1"));  // nothing made for bob
  EXPECT_EQ(output_of(0), std::to_string(agent::lookup_unix_user("cohort-job")->uid) + "\n");

  // A restarted agent remembers who holds job_user.
  use_worker("id -u");
  EXPECT_EQ(launch_as("bob", "bob-1").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // Mapped to their own user, bob's jobs run beside alice's.
  service_options_.user_map = {{"bob", "nobody"}};
  use_worker("id -u");
  grpc::Status mapped = launch_as("bob", "bob-1");
  EXPECT_TRUE(mapped.ok()) << mapped.error_message();
}

// A launch without an owner (an older coordinator's) would otherwise make "" hold job_user.
TEST_F(AgentServiceTest, ALaunchWithoutAnOwnerIsRefusedNamingTheJob) {
  if (::geteuid() != 0) GTEST_SKIP() << "an agent that is not root runs no job as job_user";
  use_worker("true");
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.clear_owner();
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  for (const std::string expected : {"job 'mnist-1' on node node-a", "names no owner", "job_user 'cohort-job'"}) {
    EXPECT_NE(status.error_message().find(expected), std::string::npos) << expected << " in " << status.error_message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/job_user.holder"));
}

// shared_job_user: the operator accepted that unmapped owners share job_user.
TEST_F(AgentServiceTest, SharedJobUserRunsEveryUnmappedOwner) {
  if (::geteuid() != 0) GTEST_SKIP() << "an agent that is not root runs no job as job_user";
  service_options_.shared_job_user = true;
  use_worker("true");
  for (const std::string owner : {"alice", "bob"}) {
    cohort::v1::LaunchTasksRequest launch = request(1);
    launch.set_owner(owner);
    launch.set_job_id(owner + "-1");
    cohort::v1::LaunchTasksResponse response;
    grpc::ServerContext context;
    grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
    EXPECT_TRUE(status.ok()) << owner << ": " << status.error_message();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/job_user.holder"));
}

TEST_F(AgentServiceTest, MissingJobUserIsALaunchErrorSayingHowToCreateIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "an agent that is not root runs jobs as itself";
  service_options_.job_user = "cohort-no-such-user";
  use_worker("true");
  cohort::v1::LaunchTasksRequest launch = request(1);
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("cohort-no-such-user"), std::string::npos) << status.error_message();
  EXPECT_NE(status.error_message().find("useradd"), std::string::npos) << status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

// Every regular file and directory under `root`, resolved: none may lie outside it.
std::vector<std::string> paths_outside(const std::string& root) {
  std::vector<std::string> outside;
  const std::string real_root = std::filesystem::canonical(root).string() + "/";
  for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.is_symlink()) continue;  // a planted link itself; what matters is where files went
    const std::string real = std::filesystem::canonical(entry.path()).string();
    if (real.rfind(real_root, 0) != 0) outside.push_back(real);
  }
  return outside;
}

TEST_F(AgentServiceTest, JobIdThatLeavesTheDataDirectoryIsRefused) {
  for (const std::string id : {"../../x", "..", "a/b", ""}) {
    cohort::v1::LaunchTasksRequest launch = request(1);
    launch.set_job_id(id);
    cohort::v1::LaunchTasksResponse response;
    grpc::ServerContext context;
    grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << id;
    if (!id.empty()) {
      EXPECT_NE(status.error_message().find(id), std::string::npos) << status.error_message();
    }
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/../x"));
  EXPECT_FALSE(std::filesystem::exists(dir_.path() + "/../../x"));
  EXPECT_TRUE(paths_outside(dir_.path()).empty());
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

TEST_F(AgentServiceTest, LinksPlantedInTheDataDirectoryAreNotFollowed) {
  TempDir elsewhere;
  std::filesystem::create_directories(log_dir_);
  std::filesystem::create_directories(dir_.path() + "/jobs");
  // The job's log directory, then its own directory, pointing outside.
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), (log_dir_ + "/mnist-1").c_str()), 0);
  ASSERT_EQ(::symlink(elsewhere.path().c_str(), (dir_.path() + "/jobs/mnist-2").c_str()), 0);
  for (const std::string id : {"mnist-1", "mnist-2"}) {
    cohort::v1::LaunchTasksRequest launch = request(1);
    launch.set_job_id(id);
    cohort::v1::LaunchTasksResponse response;
    grpc::ServerContext context;
    grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
    EXPECT_NE(status.error_message().find("symbolic link"), std::string::npos) << status.error_message();
  }
  EXPECT_TRUE(std::filesystem::is_empty(elsewhere.path()));
  EXPECT_TRUE(paths_outside(dir_.path()).empty());
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

// A command job runs its own program (found along PATH), not the worker, with the spec's env
// under cohort's launch environment, torchrun's NODE_RANK, and its working_dir under the job's
// directory.
TEST_F(AgentServiceTest, CommandJobRunsItsProgramWithItsEnvironment) {
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.set_node_rank(0);
  launch.mutable_spec()->clear_restart_policy();
  for (const char* arg : {"sh", "-c", "echo \"$GREETING rank=$RANK/$WORLD_SIZE node=$NODE_RANK pwd=$(pwd)\""})
    launch.mutable_spec()->add_command(arg);
  (*launch.mutable_spec()->mutable_env())["GREETING"] = "hello";
  launch.mutable_spec()->set_working_dir("run/a");  // made by the agent, owned by the job's user
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string job_dir = std::filesystem::canonical(dir_.path() + "/jobs/mnist-1").string();
  EXPECT_EQ(output_of(0), "hello rank=0/2 node=0 pwd=" + job_dir + "/run/a\n");
  EXPECT_EQ(output_of(1), "hello rank=1/2 node=0 pwd=" + job_dir + "/run/a\n");
}

// A restarted command job is told so, whatever from_checkpoint says: its own code decides.
TEST_F(AgentServiceTest, RestartedCommandJobSeesTheResumeFlag) {
  cohort::v1::LaunchTasksRequest launch = request(2);
  launch.mutable_spec()->clear_restart_policy();
  for (const char* arg : {"/bin/sh", "-c", "echo resume=${COHORT_RESUME:-unset} attempt=$COHORT_ATTEMPT"})
    launch.mutable_spec()->add_command(arg);
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &response).ok());
  EXPECT_EQ(output_of(0), "resume=1 attempt=2\n");
}

TEST_F(AgentServiceTest, CommandOutsideTheAgentsAllowListIsRefused) {
  service_options_.allowed_commands = {"/usr/bin/python3"};
  service_ = std::make_unique<AgentService>(supervisor_.get(), service_options_);
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.mutable_spec()->add_command("/bin/sh");
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(status.error_message().find("\"/bin/sh\" is not in node node-a's allowed_commands (/usr/bin/python3)"),
            std::string::npos)
      << status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 0);

  // A graph job (cohort-worker) may not smuggle code in through the loader either.
  cohort::v1::LaunchTasksRequest graph = request(1);
  (*graph.mutable_spec()->mutable_env())["LD_PRELOAD"] = "/tmp/x.so";
  status = service_->LaunchTasks(&context, &graph, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("env sets LD_PRELOAD"), std::string::npos) << status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

TEST_F(AgentServiceTest, CommandNotOnPathAndWorkingDirOutsideTheRootsAreRefused) {
  cohort::v1::LaunchTasksRequest launch = request(1);
  launch.mutable_spec()->add_command("no-such-program-anywhere");
  cohort::v1::LaunchTasksResponse response;
  grpc::ServerContext context;
  grpc::Status status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(status.error_message().find("\"no-such-program-anywhere\" was not found in PATH"), std::string::npos)
      << status.error_message();

  launch.mutable_spec()->set_command(0, "/bin/true");
  launch.mutable_spec()->set_working_dir("/etc");
  status = service_->LaunchTasks(&context, &launch, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("working_dir"), std::string::npos) << status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}


// Issue 16: the supervisor keys tasks by job; a stop for another attempt (a late order, or the
// coordinator fencing an old attempt) must leave the attempt that runs here alone.
TEST_F(AgentServiceTest, StopTasksForAnotherAttemptLeavesTheRunningOneAlone) {
  use_worker("exec sleep 100");
  cohort::v1::LaunchTasksRequest launch = request(2);
  cohort::v1::LaunchTasksResponse launched;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &launched).ok());
  cohort::v1::StopTasksRequest stop;
  stop.set_job_id("mnist-1");
  stop.set_attempt(1);
  cohort::v1::StopTasksResponse stopped;
  ASSERT_TRUE(service_->StopTasks(&context, &stop, &stopped).ok());
  EXPECT_EQ(stopped.signalled(), 0);
  EXPECT_EQ(supervisor_->running_tasks(), 2);
  stop.set_attempt(2);
  ASSERT_TRUE(service_->StopTasks(&context, &stop, &stopped).ok());
  EXPECT_EQ(stopped.signalled(), 2);
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

// Heartbeat reconciliation, the agent's side: the running attempts it reports, and a reply's stop
// carried out on the very tasks reported (real processes), never on a launch that began since.
TEST_F(AgentServiceTest, AHeartbeatReplysStopEndsTheReportedTasksButNoLaterLaunchOfTheAttempt) {
  use_worker("exec sleep 100");
  cohort::v1::LaunchTasksRequest launch = request(1);
  cohort::v1::LaunchTasksResponse launched;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &launched).ok());
  std::vector<AgentService::RunningLaunch> reported = service_->running_launches();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].job_id, "mnist-1");
  EXPECT_EQ(reported[0].attempt, 1);
  EXPECT_EQ(reported[0].ranks, (std::vector<int>{0, 1}));
  const uint64_t first = reported[0].launch;

  // The reply to that heartbeat orders attempt 1 stopped (its job was cancelled and every StopTasks
  // failed): both processes end as on StopTasks.
  StatusOr<int> stopped = service_->stop_reported("mnist-1", 1, first, "the job is CANCELLED");
  ASSERT_TRUE(stopped.ok()) << stopped.status().to_string();
  EXPECT_EQ(*stopped, 2);
  EXPECT_EQ(supervisor_->running_tasks(), 0);
  StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks("mnist-1");
  ASSERT_TRUE(tasks.ok());
  for (const agent::TaskInfo& task : *tasks) {
    ASSERT_TRUE(task.exit.has_value()) << "rank " << task.rank;
    EXPECT_EQ(task.exit->signal, SIGTERM) << "rank " << task.rank;
  }
  EXPECT_TRUE(service_->running_launches().empty());

  // The same attempt launched again (a coordinator whose records were restored hands the job id
  // out again): a stop judged on the first launch's report, arriving late, leaves it running.
  ASSERT_TRUE(service_->LaunchTasks(&context, &launch, &launched).ok());
  stopped = service_->stop_reported("mnist-1", 1, first, "late");
  ASSERT_TRUE(stopped.ok()) << stopped.status().to_string();
  EXPECT_EQ(*stopped, 0);
  EXPECT_EQ(supervisor_->running_tasks(), 2);
  reported = service_->running_launches();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_NE(reported[0].launch, first);
  // Nor does a stop of another attempt of the job.
  EXPECT_EQ(service_->stop_reported("mnist-1", 2, reported[0].launch, "other attempt").value_or(-1), 0);
  EXPECT_EQ(supervisor_->running_tasks(), 2);
  EXPECT_EQ(service_->stop_reported("mnist-1", 1, reported[0].launch, "its own").value_or(-1), 2);
  EXPECT_EQ(supervisor_->running_tasks(), 0);
}

// The window between stop_reported's check and its stop: the reported tasks end by themselves and
// a LaunchTasks of the job's next attempt comes. It is refused while the stop is set up, or the stop
// (by job id) would end the new launch's tasks instead.
TEST_F(AgentServiceTest, ALaunchDuringAHeartbeatReplysStopIsRefusedNotStoppedInTheReportedTasksPlace) {
  grpc::Status relaunch = grpc::Status::OK;
  bool hooked = false;
  service_options_.reported_stop_checked = [&](const std::string& job_id) {
    hooked = true;
    // The reported tasks exit by themselves (here: killed from outside the agent) and are reaped.
    StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks(job_id);
    ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
    for (const agent::TaskInfo& task : *tasks) ::kill(task.pid, SIGKILL);
    ASSERT_TRUE(wait_until([&] { return supervisor_->running_tasks() == 0; }, kTestWaitTimeout));
    // The coordinator's launch of attempt 2 arrives now.
    const cohort::v1::LaunchTasksRequest next = request(2);
    cohort::v1::LaunchTasksResponse launched;
    grpc::ServerContext context;
    relaunch = service_->LaunchTasks(&context, &next, &launched);
  };
  use_worker("exec sleep 100");
  const cohort::v1::LaunchTasksRequest first = request(1);
  cohort::v1::LaunchTasksResponse launched;
  grpc::ServerContext context;
  ASSERT_TRUE(service_->LaunchTasks(&context, &first, &launched).ok());
  const std::vector<AgentService::RunningLaunch> reported = service_->running_launches();
  ASSERT_EQ(reported.size(), 1u);

  StatusOr<int> stopped = service_->stop_reported("mnist-1", 1, reported[0].launch, "the job is CANCELLED");
  ASSERT_TRUE(hooked);
  ASSERT_TRUE(stopped.ok()) << stopped.status().to_string();
  EXPECT_EQ(*stopped, 0) << "the reported tasks had ended; nothing else may be signalled";
  EXPECT_EQ(relaunch.error_code(), grpc::StatusCode::ALREADY_EXISTS) << relaunch.error_message();
  EXPECT_NE(relaunch.error_message().find("is stopping the job's earlier tasks"), std::string::npos)
      << relaunch.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 0);
  // Once the stop is done the launch goes through, and runs on.
  const cohort::v1::LaunchTasksRequest next = request(2);
  ASSERT_TRUE(service_->LaunchTasks(&context, &next, &launched).ok());
  EXPECT_EQ(supervisor_->running_tasks(), 2);
  EXPECT_EQ(service_->attempt_of("mnist-1"), 2);
}

TEST_F(AgentServiceTest, ALaunchUnderWayIsNotReportedAndAHeartbeatStopDoesNotTouchIt) {
  const cohort::v1::LaunchTasksRequest gated = gated_request(1);
  grpc::Status status;
  std::thread launching = launch_on_thread(gated, &status);
  // Expectations only until the launch is let go and joined.
  EXPECT_TRUE(wait_until([&] { return gated_launcher_.blocked(); }, kTestWaitTimeout));
  // Until the launch ends the supervisor's tasks could be either attempt's: left out of the report.
  EXPECT_TRUE(service_->running_launches().empty());
  // A stop from a reply about an earlier report (whatever launch it names) does not mark the launch
  // under way stopped, as StopTasks for that attempt would.
  for (uint64_t launch : {uint64_t{0}, uint64_t{1}, uint64_t{2}}) {
    StatusOr<int> stopped = service_->stop_reported("slow-1", 1, launch, "stale");
    EXPECT_TRUE(stopped.ok()) << stopped.status().to_string();
    EXPECT_EQ(stopped.value_or(-1), 0);
  }
  gated_launcher_.open();
  launching.join();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 2);
  const std::vector<AgentService::RunningLaunch> reported = service_->running_launches();
  ASSERT_EQ(reported.size(), 1u);
  EXPECT_EQ(reported[0].job_id, "slow-1");
  EXPECT_EQ(service_->stop_reported("slow-1", 1, reported[0].launch, "now").value_or(-1), 2);
}


// A launch blocked in the filesystem or in exec (a working_dir or command on a hung mount) holds
// up nothing else: another job's StopTasks, attempt_of (the daemon's exit reports, and so its
// heartbeats) and launch all answer while it waits. A stop of the blocked attempt answers at once
// and its tasks are stopped as soon as they started.
TEST_F(AgentServiceTest, ALaunchBlockedInExecHoldsUpNoOtherJob) {
  use_worker("exec sleep 100");
  grpc::ServerContext context;
  cohort::v1::LaunchTasksRequest running = request(1);
  cohort::v1::LaunchTasksResponse launched;
  ASSERT_TRUE(service_->LaunchTasks(&context, &running, &launched).ok());

  cohort::v1::LaunchTasksRequest gated = gated_request(1);
  gated.mutable_tasks()->RemoveLast();
  cohort::v1::LaunchTasksResponse gated_response;
  grpc::Status gated_status;
  std::thread gated_launch = launch_on_thread(gated, &gated_status, &gated_response);
  ASSERT_TRUE(wait_until([&] { return gated_launcher_.blocked(); }));

  // Each would have waited for the gated launch while LaunchTasks held the service's lock.
  constexpr auto kBound = std::chrono::seconds(5);
  auto attempt = std::async(std::launch::async, [&] { return service_->attempt_of("mnist-1"); });
  EXPECT_EQ(attempt.wait_for(kBound), std::future_status::ready) << "attempt_of waited for another job's launch";
  cohort::v1::LaunchTasksRequest third = request(1);
  third.set_job_id("third-1");
  third.mutable_tasks()->RemoveLast();
  auto third_launch = std::async(std::launch::async, [&] {
    grpc::ServerContext third_context;
    cohort::v1::LaunchTasksResponse response;
    return service_->LaunchTasks(&third_context, &third, &response);
  });
  EXPECT_EQ(third_launch.wait_for(kBound), std::future_status::ready) << "a launch waited for another job's launch";
  // StopTasks of attempt 1 of `job` on another thread: (OK?, tasks signalled).
  auto stop_async = [&](const std::string& job) {
    return std::async(std::launch::async, [this, job] {
      grpc::ServerContext stop_context;
      cohort::v1::StopTasksRequest stop_request;
      stop_request.set_job_id(job);
      stop_request.set_attempt(1);
      cohort::v1::StopTasksResponse response;
      grpc::Status status = service_->StopTasks(&stop_context, &stop_request, &response);
      return std::make_pair(status.ok(), response.signalled());
    });
  };
  auto stop = stop_async("mnist-1");
  EXPECT_EQ(stop.wait_for(kBound), std::future_status::ready) << "StopTasks waited for another job's launch";
  auto stop_gated = stop_async("slow-1");
  EXPECT_EQ(stop_gated.wait_for(kBound), std::future_status::ready) << "StopTasks waited for its own job's launch";
  gated_launcher_.open();
  gated_launch.join();
  EXPECT_EQ(attempt.get(), std::optional<int>(1));
  EXPECT_TRUE(third_launch.get().ok());
  EXPECT_EQ(stop.get(), std::make_pair(true, 2));
  EXPECT_EQ(stop_gated.get(), std::make_pair(true, 1));
  ASSERT_TRUE(gated_status.ok()) << gated_status.error_message();
  ASSERT_EQ(gated_response.pids_size(), 1);
  // The stop that came during the launch ended its task once it started.
  EXPECT_TRUE(wait_until([&] {
    auto tasks = supervisor_->tasks("slow-1");
    return tasks.ok() && tasks->size() == 1 && (*tasks)[0].exit.has_value();
  }));
  EXPECT_EQ(service_->attempt_of("slow-1"), std::optional<int>(1));
}

// The slots a launch in progress reserved count for the next one: two launches never both fit.
TEST_F(AgentServiceTest, SlotsOfALaunchInProgressAreReserved) {
  cohort::v1::LaunchTasksRequest gated = gated_request(1);
  // Three of the four slots.
  cohort::v1::Task* third = gated.add_tasks();
  third->set_rank(2);
  third->set_local_rank(2);
  gated.set_world_size(3);
  grpc::Status gated_status;
  std::thread gated_launch = launch_on_thread(gated, &gated_status);
  ASSERT_TRUE(wait_until([&] { return gated_launcher_.blocked(); }));
  cohort::v1::LaunchTasksRequest other = request(1);  // two tasks
  cohort::v1::LaunchTasksRequest again = gated;
  auto launch = [&](const cohort::v1::LaunchTasksRequest& launch_request) {
    return std::async(std::launch::async, [&] {
      grpc::ServerContext launch_context;
      cohort::v1::LaunchTasksResponse response;
      return service_->LaunchTasks(&launch_context, &launch_request, &response);
    });
  };
  auto refused = launch(other);
  auto twice = launch(again);
  constexpr auto kBound = std::chrono::seconds(5);
  EXPECT_EQ(refused.wait_for(kBound), std::future_status::ready);
  EXPECT_EQ(twice.wait_for(kBound), std::future_status::ready);
  gated_launcher_.open();
  gated_launch.join();
  const grpc::Status refused_status = refused.get();
  EXPECT_EQ(refused_status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused_status.error_message();
  const grpc::Status twice_status = twice.get();
  EXPECT_EQ(twice_status.error_code(), grpc::StatusCode::ALREADY_EXISTS) << twice_status.error_message();
  EXPECT_TRUE(gated_status.ok()) << gated_status.error_message();
  EXPECT_EQ(supervisor_->running_tasks(), 3);
  ASSERT_TRUE(supervisor_->stop("slow-1").ok());
}

// A drain (or fencing) that begins while a launch is under way: the launch passed the draining
// check before, so it must stop the tasks it started itself, and the drain waits for it to end so
// the supervisor holds every task it must stop.
TEST_F(AgentServiceTest, DrainingDuringABlockedLaunchLeavesNoTaskRunning) {
  cohort::v1::LaunchTasksRequest gated = gated_request(1);
  grpc::Status gated_status;
  std::thread gated_launch = launch_on_thread(gated, &gated_status);
  ASSERT_TRUE(wait_until([&] { return gated_launcher_.blocked(); }));
  auto drained = std::async(std::launch::async, [&] { service_->start_draining(); });
  // The drain waits for the launch (up to drain_launch_wait, 30 s here).
  EXPECT_EQ(drained.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  gated_launcher_.open();
  gated_launch.join();
  EXPECT_EQ(drained.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(gated_status.error_code(), grpc::StatusCode::UNAVAILABLE) << gated_status.error_message();
  for (const std::string expected : {"job 'slow-1' attempt 1", "node node-a began draining", "tasks were stopped"}) {
    EXPECT_NE(gated_status.error_message().find(expected), std::string::npos)
        << expected << " in " << gated_status.error_message();
  }
  EXPECT_TRUE(wait_until([&] { return supervisor_->running_tasks() == 0; })) << supervisor_->running_tasks();
  StatusOr<std::vector<agent::TaskInfo>> tasks = supervisor_->tasks("slow-1");
  ASSERT_TRUE(tasks.ok()) << tasks.status().to_string();
  ASSERT_EQ(tasks->size(), 2u);
  for (const agent::TaskInfo& task : *tasks) EXPECT_TRUE(task.exit.has_value()) << "rank " << task.rank;
}

// Fencing during a launch: the launch is told to stop its tasks once started, as a StopTasks would.
TEST_F(AgentServiceTest, FencingDuringABlockedLaunchStopsItsTasksOnceStarted) {
  cohort::v1::LaunchTasksRequest gated = gated_request(2);
  grpc::Status gated_status;
  std::thread gated_launch = launch_on_thread(gated, &gated_status);
  ASSERT_TRUE(wait_until([&] { return gated_launcher_.blocked(); }));
  EXPECT_EQ(service_->stop_launches_in_progress(),
            (std::vector<std::pair<std::string, int>>{{"slow-1", 2}}));
  gated_launcher_.open();
  gated_launch.join();
  EXPECT_TRUE(gated_status.ok()) << gated_status.error_message();
  EXPECT_TRUE(wait_until([&] { return supervisor_->running_tasks() == 0; })) << supervisor_->running_tasks();
  EXPECT_TRUE(service_->stop_launches_in_progress().empty());
}

}  // namespace
}  // namespace cohort::daemon
