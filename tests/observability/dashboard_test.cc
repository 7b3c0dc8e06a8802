// The coordinator's web dashboard in a real browser (Debian's chromium, headless): a `--role all`
// DaemonServer with http_listen on 127.0.0.1:0 and TLS runs a command job of user alice that
// reports metrics for ~15 s (metrics_job, cohort::report_metrics). While it runs,
// dashboard_chromium.py drives Chromium over the DevTools protocol: alice logs in with her token,
// opens the job's page, and the chart's point count must grow while the job trains and equal what
// `cohort metrics JOB -o json` (the real CLI) prints once it ended; a screenshot of the page is the
// test's artefact ($TEST_UNDECLARED_OUTPUTS_DIR/dashboard_job.png); then bob logs in and sees
// neither the job in his list nor its page (the API answers 404). Chromium trusts the
// coordinator's key by its SPKI hash; TLS and tokens stay on.
//
// COHORT_DASHBOARD_TEST_STEPS (default 30) sets how many reports the job makes, 500 ms apart.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/security/daemon_security.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kChromium = "/usr/bin/chromium";
constexpr const char* kPython = "/usr/bin/python3";
// From the test's runfiles (the BUILD rule's data).
constexpr const char* kDriverRunfile = "tests/observability/dashboard_chromium.py";
constexpr const char* kJobRunfile = "tests/observability/metrics_job";
constexpr const char* kCohortRunfile = "client/cohort";
constexpr int kDefaultSteps = 30;
constexpr int kReportIntervalMs = 500;
// Bounds: the job reaching RUNNING, each browser step, the whole job, and the driver as a whole
// (timeout(1) kills it past this).
constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr int kStepTimeoutS = 45;
constexpr int kJobTimeoutS = 120;
constexpr int kDriverTimeoutS = 240;
constexpr auto kPoll = std::chrono::milliseconds(100);

std::string runfile(const char* path) { return std::filesystem::absolute(path).string(); }

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

int steps() {
  const char* value = std::getenv("COHORT_DASHBOARD_TEST_STEPS");
  const int steps = value == nullptr ? 0 : std::atoi(value);
  return steps > 0 ? steps : kDefaultSteps;
}

class DashboardChromiumTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kChromium, X_OK), 0) << kChromium << " is missing: run deploy/install-deps.sh";
    DaemonServerOptions options;
    options.role = DaemonRole::kAll;
    options.listen = "127.0.0.1:0";
    options.http_listen = "127.0.0.1:0";
    options.data_dir = dir_.path() + "/data";
    options.tick_interval = std::chrono::milliseconds(50);
    options.node_id = "node-a";
    options.slots = 2;
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    ASSERT_GT(server_->http_port(), 0);
    data_dir_ = options.data_dir;
  }
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  // A new (non-admin) user: the token, also written to <dir>/<name>.token (0600).
  std::string add_user(const std::string& name) {
    StatusOr<std::string> token = server_->security().identities()->add_user(name, /*admin=*/false);
    EXPECT_TRUE(token.ok()) << token.status().to_string();
    write_file(dir_.path() + "/" + name + ".token", token.value_or(""), 0600);
    return token.value_or("");
  }

  TempDir dir_;
  std::unique_ptr<DaemonServer> server_;
  std::string data_dir_;
};

TEST_F(DashboardChromiumTest, AliceWatchesHerJobTrainAndBobCannotSeeIt) {
  const std::string alice_token = add_user("alice");
  add_user("bob");
  tls::ChannelSecurity alice;
  alice.ca_pem = server_->security().ca_pem();
  alice.bearer_token = alice_token;
  auto stub = cohort::v1::Coordinator::NewStub(tls::make_channel(server_->address(), alice));

  cohort::v1::SubmitJobRequest submit;
  cohort::v1::JobSpec* spec = submit.mutable_spec();
  spec->set_name("dashboard");
  spec->set_nodes(1);
  spec->set_procs_per_node(1);
  for (const std::string& arg : {runfile(kJobRunfile), std::string("--steps"), std::to_string(steps()),
                                 std::string("--interval-ms"), std::to_string(kReportIntervalMs)})
    spec->add_command(arg);
  submit.set_wait_for_capacity(true);  // the agent may not have registered yet
  cohort::v1::SubmitJobResponse submitted;
  {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kStartTimeout);
    grpc::Status status = stub->SubmitJob(&context, submit, &submitted);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const std::string id = submitted.job_id();

  // The browser opens the page while the job trains.
  cohort::v1::JobState state = cohort::v1::PENDING;
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  while (state != cohort::v1::RUNNING && std::chrono::steady_clock::now() < deadline) {
    cohort::v1::GetJobRequest request;
    request.set_job_id(id);
    cohort::v1::GetJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kStartTimeout);
    grpc::Status status = stub->GetJob(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    state = response.job().state();
    ASSERT_NE(state, cohort::v1::FAILED) << response.job().reason();
    std::this_thread::sleep_for(kPoll);
  }
  ASSERT_EQ(state, cohort::v1::RUNNING) << "job " << id << " did not start within " << kStartTimeout.count() << " s";

  const std::string cert = dir_.path() + "/https.crt";
  write_file(cert, server_->security().serving_certificate().certificate_pem, 0644);
  const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  const std::string screenshot = std::string(outputs != nullptr ? outputs : dir_.path().c_str()) + "/dashboard_job.png";
  const std::string log = dir_.path() + "/driver.log";
  const std::string chromium_log = dir_.path() + "/chromium.log";
  const std::string command =
      "timeout -k 10 " + std::to_string(kDriverTimeoutS) + " " + kPython + " '" + runfile(kDriverRunfile) + "'" +
      " --url 'https://127.0.0.1:" + std::to_string(server_->http_port()) + "' --cert '" + cert + "' --job '" + id +
      "' --user alice --token-file '" + dir_.path() + "/alice.token' --other-user bob --other-token-file '" +
      dir_.path() + "/bob.token' --cohort '" + runfile(kCohortRunfile) + "' --credentials '" + data_dir_ + "/" +
      security::kAdminCredentialsFile + "' --coordinator " + server_->address() + " --screenshot '" + screenshot +
      "' --chromium " + kChromium + " --chromium-log '" + chromium_log + "' --timeout " +
      std::to_string(kStepTimeoutS) + " --job-timeout " + std::to_string(kJobTimeoutS) + " >'" + log + "' 2>&1";
  const int status = std::system(command.c_str());
  const std::string output = read_all(log);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the browser checks failed (status " << status << "):\n"
      << output << "\nChromium's log (tail):\n"
      << read_all(chromium_log).substr(0, 4000);
  EXPECT_NE(output.find("does not see the job"), std::string::npos) << output;
  // The artefact: a PNG of the job page.
  const std::string png = read_all(screenshot);
  ASSERT_GT(png.size(), 1000u) << screenshot;
  EXPECT_EQ(png.substr(1, 3), "PNG") << screenshot;
  std::cout << output << "screenshot: " << screenshot << "\n";
}

}  // namespace
}  // namespace cohort::daemon
