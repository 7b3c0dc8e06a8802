// The example command jobs of configs/jobs/ end to end (issue 12), through a live secure cluster
// (a coordinator and two agents, two simulated nodes: live_cluster.h). Each spec is loaded from its
// YAML as `cohort submit` loads it, with the program's path pointed at this build's copy (the YAML
// names the installed one):
//
//   - mnist_dp_command.yaml: the C++ example trainer (worker/examples/train_mnist_dp,
//     --init env://) on 2 nodes x 2 ranks reaches SUCCEEDED, and the metrics it reported with
//     cohort::report_metrics (loss, test accuracy) are in GetJob's record, and the real `cohort
//     status` (//client:cohort, the admin's credentials file) prints them;
//   - fashion_ddp_python.yaml: the torch.distributed DDP script (Debian's python3-torch,
//     init_process_group("gloo") from the environment) on 2 ranks reaches SUCCEEDED and rank 0's
//     log shows its test accuracy.

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include <gtest/gtest.h>

#include "client/job_spec_yaml.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/security/daemon_security.h"
#include "tests/control_plane/live_cluster.h"

namespace cohort::daemon {
namespace {

// From the test's runfiles (see the BUILD rule's data).
constexpr const char* kTrainerRunfile = "worker/examples/train_mnist_dp";
constexpr const char* kDdpScriptRunfile = "worker/examples/python/train_fashion_ddp.py";
constexpr const char* kJobsRunfiles = "configs/jobs";
constexpr const char* kCohortRunfile = "client/cohort";
// One CLI call (a GetJob) on the loaded 2-core machine; timeout(1) kills it past this.
constexpr int kCliTimeoutS = 30;
// Debian's dataset-fashion-mnist, which both programs read.
constexpr const char* kFashionMnistDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kAccuracyLine = "test accuracy: ";

std::string runfile(const char* path) { return std::filesystem::absolute(path).string(); }

// The number after the last "test accuracy: " in `log`, or -1 when there is none.
double logged_accuracy(const std::string& log) {
  const size_t at = log.rfind(kAccuracyLine);
  if (at == std::string::npos) return -1;
  return std::atof(log.c_str() + at + std::string(kAccuracyLine).size());
}

class ExampleCommandJobsTest : public testing::LiveClusterTest {
 protected:
  void SetUp() override {
    if (!std::filesystem::is_directory(kFashionMnistDir)) {
      GTEST_SKIP() << kFashionMnistDir << " is missing: install Debian's dataset-fashion-mnist (deploy/install-deps.sh)";
    }
    LiveClusterTest::SetUp();
  }

  // Two ranks per node: the C++ job fills both nodes.
  void configure_agent(DaemonServerOptions& options) override { options.slots = 2; }

  // configs/jobs/<file>, read as `cohort submit` reads it.
  cohort::v1::JobSpec load_example(const std::string& file) {
    StatusOr<cohort::v1::JobSpec> spec = client::load_job_spec_file(runfile(kJobsRunfiles) + "/" + file);
    EXPECT_TRUE(spec.ok()) << spec.status().to_string();
    return spec.ok() ? *spec : cohort::v1::JobSpec();
  }

  // The metrics events of the job's history (WatchJob from the oldest retained event, as the CLI's
  // progress bar reads it), in order; the stream ends after the final state.
  std::vector<cohort::v1::Metrics> metrics_history(const std::string& id) {
    cohort::v1::WatchJobRequest request;
    request.set_job_id(id);
    grpc::ClientContext context;
    testing::set_deadline(&context);
    auto reader = stub_->WatchJob(&context, request);
    std::vector<cohort::v1::Metrics> history;
    cohort::v1::JobEvent event;
    while (reader->Read(&event)) {
      if (event.has_metrics()) history.push_back(event.metrics());
    }
    grpc::Status status = reader->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return history;
  }

  // The real CLI's output (stdout and stderr) for `cohort --credentials <admin's> --coordinator
  // <address> ARGS...`, bounded by kCliTimeoutS; *exit_code is its exit status.
  std::string run_cli(const std::vector<std::string>& args, int* exit_code) {
    const std::string output = coordinator_dir_.path() + "/cli.out";
    const std::string credentials = coordinator_dir_.path() + "/" + security::kAdminCredentialsFile;
    std::string command = "timeout " + std::to_string(kCliTimeoutS) + " '" + runfile(kCohortRunfile) +
                          "' --credentials '" + credentials + "' --coordinator " + coordinator_->address();
    for (const std::string& arg : args) command += " '" + arg + "'";
    command += " >'" + output + "' 2>&1";
    const int status = std::system(command.c_str());
    *exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return testing::read_file(output);
  }

  // Every rank's log, for a failure message.
  std::string all_logs(const cohort::v1::JobRecord& job, int world_size) {
    std::string text;
    for (int rank = 0; rank < world_size; ++rank)
      text += "--- rank " + std::to_string(rank) + "\n" + read_logs(job, rank);
    return text;
  }
};

TEST_F(ExampleCommandJobsTest, TheCppExampleTrainerRunsOnTwoNodesTimesTwoRanksAndReportsItsMetrics) {
  cohort::v1::JobSpec spec = load_example("mnist_dp_command.yaml");
  ASSERT_GE(spec.command_size(), 1);
  EXPECT_EQ(spec.command(0), "train_mnist_dp");  // the installed program, on the ranks' PATH
  spec.set_command(0, runfile(kTrainerRunfile));
  ASSERT_EQ(spec.nodes(), 2);
  ASSERT_EQ(spec.procs_per_node(), 2);

  const std::string id = submit(spec);
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason() << "\n" << all_logs(job, 4);
  ASSERT_EQ(job.placement().nodes_size(), 2);
  EXPECT_NE(job.placement().nodes(0).node_id(), job.placement().nodes(1).node_id());
  EXPECT_EQ(job.placement().world_size(), 4);
  // What `cohort status` shows: rank 0's last cohort::report_metrics, the last epoch's end with its
  // test accuracy (chance is 0.1), the same the program printed.
  const cohort::v1::Metrics& metrics = job.last_metrics();
  EXPECT_GT(metrics.step(), 0);
  EXPECT_EQ(metrics.rank(), 0);
  EXPECT_EQ(metrics.epoch(), 1);
  EXPECT_EQ(metrics.total_epochs(), 2);  // the totals the CLI's progress bar needs
  EXPECT_EQ(metrics.total_steps(), 30);   // --max-steps 30 (2 epochs of 16 steps would be 32)
  EXPECT_GT(metrics.loss(), 0.0);
  EXPECT_GT(metrics.accuracy(), 0.3) << all_logs(job, 4);
  const std::string rank0 = read_logs(job, 0);
  EXPECT_NEAR(logged_accuracy(rank0), metrics.accuracy(), 1e-4) << rank0;
  // The history holds the reports on the way (both epoch ends at least), steps never going back.
  const std::vector<cohort::v1::Metrics> history = metrics_history(id);
  ASSERT_GE(history.size(), 2u);
  for (size_t i = 1; i < history.size(); ++i) EXPECT_GE(history[i].step(), history[i - 1].step());
  EXPECT_EQ(history.back().step(), metrics.step());

  // `cohort status` shows them: its progress row prints the loss and the accuracy as a percentage
  // (client/cli/job_follower.cc's format_progress).
  int exit_code = -1;
  const std::string status = run_cli({"status", id}, &exit_code);
  EXPECT_EQ(exit_code, 0) << status;
  char loss[64];
  char accuracy[64];
  std::snprintf(loss, sizeof(loss), "loss %.4f", metrics.loss());
  std::snprintf(accuracy, sizeof(accuracy), "acc %.2f%%", metrics.accuracy() * 100);
  EXPECT_NE(status.find("SUCCEEDED"), std::string::npos) << status;
  EXPECT_NE(status.find(loss), std::string::npos) << "no '" << loss << "' in:\n" << status;
  EXPECT_NE(status.find(accuracy), std::string::npos) << "no '" << accuracy << "' in:\n" << status;
}

TEST_F(ExampleCommandJobsTest, ThePythonDdpScriptRunsOnTwoRanksAndRankZeroLogsItsAccuracy) {
  cohort::v1::JobSpec spec = load_example("fashion_ddp_python.yaml");
  ASSERT_GE(spec.command_size(), 2);
  EXPECT_EQ(spec.command(0), "/usr/bin/python3");
  spec.set_command(1, runfile(kDdpScriptRunfile));  // the YAML names the installed copy

  const std::string id = submit(spec);
  ASSERT_FALSE(id.empty());
  const cohort::v1::JobRecord job = wait_for_state(id, cohort::v1::SUCCEEDED);
  ASSERT_EQ(job.state(), cohort::v1::SUCCEEDED) << job.reason() << "\n" << all_logs(job, 2);
  EXPECT_EQ(job.placement().world_size(), 2);
  const std::string rank0 = read_logs(job, 0);
  EXPECT_NE(rank0.find("rank 0 of 2 joined"), std::string::npos) << rank0;
  EXPECT_GT(logged_accuracy(rank0), 0.5) << rank0;  // chance is 0.1
  EXPECT_NE(read_logs(job, 1).find("rank 1 of 2 joined"), std::string::npos) << read_logs(job, 1);
}

}  // namespace
}  // namespace cohort::daemon
