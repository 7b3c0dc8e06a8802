// Bad job specs are rejected with a message that says what is wrong, before anything starts.
//
// tests/data/bad_specs/ holds one YAML file per mistake; each file's first line is
// `# expect: <part of the error>`. Every file must fail the client-side path (load_job_spec_file,
// validate_job_spec, validate_model) with that text, and every file that loads must be refused by
// a real in-process coordinator over gRPC (SubmitJob → INVALID_ARGUMENT with the same text) with no
// job recorded and no task launched. The example jobs in configs/jobs/ must pass the same checks.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/util/message_differencer.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "client/job_spec_yaml.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/job_spec_validation.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"
#include "tests/control_plane/coordinator_calls.h"
#include "worker/graph/shape_inference.h"

namespace cohort {
namespace {

namespace fs = std::filesystem;

using coordinator::testing::TempDir;

// Every RPC and wait here finishes well within this; a hang becomes a failure.
constexpr auto kTimeout = daemon::testing::kRpcTimeout;
constexpr auto kTestTickInterval = std::chrono::milliseconds(50);
using daemon::testing::kPollInterval;
using daemon::testing::set_deadline;
// The first line of a bad spec starts with this; the rest is a substring of the expected error.
constexpr std::string_view kExpectPrefix = "# expect: ";
// Well-formed specs must reach this many bad-spec files; fewer means the glob lost some.
constexpr size_t kMinBadSpecs = 12;

// The worker every task would run: it leaves a marker and fails loudly, so a launch cannot go unseen.
constexpr const char* kWorkerScript =
    "touch \"$MARKER_DIR/launched-$COHORT_JOB_ID-$RANK\"; "
    "echo 'bad_specs_test: the worker ran for a job that should have been rejected' >&2; exit 97";

// The directory the test's data files are under (Bazel runfiles of the workspace).
std::string runfiles_root() {
  if (const char* srcdir = std::getenv("TEST_SRCDIR")) {
    const char* workspace = std::getenv("TEST_WORKSPACE");
    return std::string(srcdir) + "/" + (workspace != nullptr ? workspace : "cohort");
  }
  return fs::read_symlink("/proc/self/exe").string() + ".runfiles/cohort";  // run by hand from bazel-bin
}

std::vector<std::string> yaml_files(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (entry.path().extension() == ".yaml") files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

struct BadSpec {
  std::string path;
  std::string expect;  // empty when the file lacks its expect line
};

std::vector<BadSpec> bad_specs() {
  std::vector<BadSpec> specs;
  for (const std::string& path : yaml_files(runfiles_root() + "/tests/data/bad_specs")) {
    std::ifstream file(path);
    std::string first;
    std::getline(file, first);
    BadSpec spec{path, ""};
    if (first.compare(0, kExpectPrefix.size(), kExpectPrefix) == 0)
      spec.expect = first.substr(kExpectPrefix.size());
    specs.push_back(spec);
  }
  return specs;
}

// The checks SubmitJob makes (daemon/service/coordinator_service.cc), client side.
Status validate(const cohort::v1::JobSpec& spec) {
  Status structural = coordinator::validate_job_spec(spec);
  graph::ModelValidationOptions options;
  options.check_stage_ranks = false;  // validate_job_spec's
  Status model = graph::validate_model(spec, options);
  if (!structural.ok() && !model.ok()) {
    return invalid_argument_error("{}; {}", structural.message(), model.message());
  }
  return structural.ok() ? model : structural;
}

Status load_and_validate(const std::string& path) {
  COHORT_ASSIGN_OR_RETURN(cohort::v1::JobSpec spec, client::load_job_spec_file(path));
  return validate(spec);
}

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

TEST(BadSpecsTest, EveryFileNamesItsExpectedError) {
  const std::vector<BadSpec> specs = bad_specs();
  EXPECT_GE(specs.size(), kMinBadSpecs) << "under " << runfiles_root() << "/tests/data/bad_specs";
  for (const BadSpec& spec : specs) {
    EXPECT_FALSE(spec.expect.empty()) << file_name(spec.path) << ": the first line must be `# expect: ...`";
  }
}

TEST(BadSpecsTest, EachFailsLoadOrValidationWithItsMessage) {
  for (const BadSpec& spec : bad_specs()) {
    SCOPED_TRACE(file_name(spec.path));
    Status status = load_and_validate(spec.path);
    ASSERT_FALSE(status.ok()) << "accepted";
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
    EXPECT_NE(status.message().find(spec.expect), std::string::npos)
        << "expected: " << spec.expect << "\ngot: " << status.message();
  }
}

TEST(BadSpecsTest, ExampleJobsLoadValidateAndRoundTrip) {
  const std::vector<std::string> jobs = yaml_files(runfiles_root() + "/configs/jobs");
  EXPECT_GE(jobs.size(), 5u);  // three graph jobs, two command jobs
  graph::ModelValidationOptions options;
  // The examples read Fashion-MNIST from its default place; without it, check everything else.
  options.check_files = fs::is_directory(graph::kDefaultFashionMnistDir);
  for (const std::string& path : jobs) {
    SCOPED_TRACE(file_name(path));
    StatusOr<cohort::v1::JobSpec> spec = client::load_job_spec_file(path);
    ASSERT_TRUE(spec.ok()) << spec.status().to_string();
    Status structural = coordinator::validate_job_spec(*spec);
    EXPECT_TRUE(structural.ok()) << structural.to_string();
    // A command job has no model: the coordinator skips the model check for it (SubmitJob).
    if (spec->command_size() == 0) {
      Status model = graph::validate_model(*spec, options);
      EXPECT_TRUE(model.ok()) << model.to_string();
    }
    StatusOr<cohort::v1::JobSpec> again =
        client::parse_job_spec_yaml(client::job_spec_to_yaml(*spec), "rendered.yaml");
    ASSERT_TRUE(again.ok()) << again.status().to_string();
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again));
  }
}

TEST(BadSpecsTest, SeveralStagesOnOneRankAreWiredByAnyOfThem) {
  // Rank 0 feeds rank 1 and takes its result back in a later stage: the edge 1 → 0 is matched by
  // rank 0's second stage, not its first.
  StatusOr<cohort::v1::JobSpec> spec = client::parse_job_spec_yaml(R"(
name: round-trip
nodes: 1
procs_per_node: 2
dataset: {kind: synthetic, train_size: 64, input_shape: [784], num_classes: 10}
model_parallel:
  stages:
    - {rank: 0, rank_out: 1, graph: {layers: [{type: linear, in_features: 784, out_features: 64}]}}
    - {rank: 1, rank_in: 0, rank_out: 0, graph: {layers: [{type: relu}]}}
    - {rank: 0, rank_in: 1, graph: {layers: [{type: linear, in_features: 64, out_features: 10}]}}
loss: cross_entropy
optimizer: {kind: sgd, lr: 0.1}
batch_size: 8
epochs: 1
)",
                                                                   "round_trip.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().to_string();
  Status status = validate(*spec);
  EXPECT_TRUE(status.ok()) << status.to_string();
}

// ---- against a real coordinator ----

class BadSpecsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("MARKER_DIR", marker_dir_.path().c_str(), 1);
    // A worker runs as the unprivileged job user when the test runs as root: it must be able to
    // leave its marker, or a wrongly launched job would go unseen.
    chmod(marker_dir_.path().c_str(), 01777);
    daemon::DaemonServerOptions options;
    options.role = daemon::DaemonRole::kAll;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir_.path();
    options.tick_interval = kTestTickInterval;
    options.node_id = "node-a";
    options.slots = 4;  // room for every bad spec's ranks, so only validation can refuse them
    options.worker_command = {"/bin/sh", "-c", kWorkerScript};
    auto server = daemon::DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    auto channel = tls::make_channel(server_->address(), daemon::testing::admin_security(data_dir_.path()));
    coordinator_ = cohort::v1::Coordinator::NewStub(channel);
    wait_for_node();
  }
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  void wait_for_node() {
    ASSERT_EQ(daemon::testing::wait_for_nodes(*coordinator_, 1).nodes_size(), 1);
  }

  grpc::Status submit(const cohort::v1::JobSpec& spec, std::string* job_id = nullptr) {
    cohort::v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    cohort::v1::SubmitJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = coordinator_->SubmitJob(&context, request, &response);
    if (job_id != nullptr) *job_id = response.job_id();
    return status;
  }

  int job_count() {
    cohort::v1::ListJobsResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_TRUE(coordinator_->ListJobs(&context, {}, &response).ok());
    return response.jobs_size();
  }

  size_t launched() const {
    return static_cast<size_t>(
        std::distance(fs::directory_iterator(marker_dir_.path()), fs::directory_iterator()));
  }

  TempDir data_dir_;
  TempDir marker_dir_;
  std::unique_ptr<daemon::DaemonServer> server_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> coordinator_;
};

TEST_F(BadSpecsServerTest, SubmitJobRejectsEveryBadSpecBeforeQueueing) {
  int submitted = 0;
  for (const BadSpec& bad : bad_specs()) {
    StatusOr<cohort::v1::JobSpec> spec = client::load_job_spec_file(bad.path);
    if (!spec.ok()) continue;  // a YAML mistake never reaches the wire
    SCOPED_TRACE(file_name(bad.path));
    ++submitted;
    grpc::Status status = submit(*spec);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_NE(status.error_message().find(bad.expect), std::string::npos)
        << "expected: " << bad.expect << "\ngot: " << status.error_message();
  }
  EXPECT_GE(submitted, 8) << "most bad specs are well-formed YAML and must reach the coordinator";
  EXPECT_EQ(job_count(), 0);
  // Give a wrongly accepted job a few ticks to be placed and launched before looking.
  std::this_thread::sleep_for(kTestTickInterval * 4);
  EXPECT_EQ(launched(), 0u) << "a rejected job started a task";
}

TEST_F(BadSpecsServerTest, AnAcceptedJobDoesLaunchSoTheCheckAboveCanFail) {
  std::string job_id;
  grpc::Status status = submit(coordinator::testing::valid_spec("good", 1, 1), &job_id);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job_count(), 1);
  const auto give_up = std::chrono::steady_clock::now() + kTimeout;
  while (launched() == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(kPollInterval);
  EXPECT_EQ(launched(), 1u) << "the worker command never ran for " << job_id;
}

}  // namespace
}  // namespace cohort
