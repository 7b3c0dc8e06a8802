#include "client/client.h"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/service/info_service.h"

namespace cohort::client {
namespace {

// A coordinator that answers GetJob / ListJobs / SubmitJob as the leader (job "live-job"), or holds
// every call without answering until the caller gives up (hung: a SIGSTOPped leader whose TCP
// connection stays READY).
class FakeCoordinator final : public cohort::v1::Coordinator::Service {
 public:
  explicit FakeCoordinator(bool hung) : hung_(hung) {}
  grpc::Status GetJob(grpc::ServerContext* context, const cohort::v1::GetJobRequest* request,
                      cohort::v1::GetJobResponse* response) override {
    if (hung_) return hang(context);
    response->mutable_job()->set_id(request->job_id());
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext* context, const cohort::v1::ListJobsRequest*,
                        cohort::v1::ListJobsResponse* response) override {
    if (hung_) return hang(context);
    response->add_jobs()->set_id("live-job");
    return grpc::Status::OK;
  }
  grpc::Status SubmitJob(grpc::ServerContext* context, const cohort::v1::SubmitJobRequest*,
                         cohort::v1::SubmitJobResponse* response) override {
    if (hung_) return hang(context);
    ++submits;
    response->set_job_id("live-job");
    return grpc::Status::OK;
  }
  std::atomic<int> calls{0};
  std::atomic<int> submits{0};

 private:
  grpc::Status hang(grpc::ServerContext* context) {
    ++calls;
    while (!context->IsCancelled()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return grpc::Status(grpc::StatusCode::CANCELLED, "gave up");
  }
  const bool hung_;
};

struct FakeServer {
  explicit FakeServer(bool hung) : service(hung) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    address = "127.0.0.1:" + std::to_string(port);
  }
  ~FakeServer() { server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
  FakeCoordinator service;
  std::unique_ptr<grpc::Server> server;
  std::string address;
};

TEST(ClientTest, ReadsTheDaemonVersion) {
  cohort::daemon::InfoService service({"agent"});
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  Client client("127.0.0.1:" + std::to_string(port));
  auto info = client.server_version();
  ASSERT_TRUE(info.ok()) << info.status().to_string();
  EXPECT_EQ(info->component(), "cohortd");
  server->Shutdown();
}

TEST(ClientTest, UnreachableDaemonNamesTheAddressAndWhatToDo) {
  // Bind and close a port so nothing listens there.
  int port = 0;
  {
    cohort::daemon::InfoService service({});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    builder.BuildAndStart()->Shutdown();
  }
  std::string address = "127.0.0.1:" + std::to_string(port);
  Client client(address);
  auto info = client.server_version();
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(info.status().message().find(address), std::string::npos);
  EXPECT_NE(info.status().message().find("COHORT_COORDINATOR"), std::string::npos);
}

TEST(ClientTest, ReadsLeaveACoordinatorThatHoldsThemWithoutAnswering) {
  // `cohort status` / `cohort list` given both coordinators, the first stopped (its connection
  // still up) after the second took over: each read must reach the live one within its deadline.
  FakeServer hung(/*hung=*/true);
  FakeServer live(/*hung=*/false);
  ClientOptions options;
  options.rpc_timeout = std::chrono::milliseconds(2000);
  Client client(hung.address + "," + live.address, options);
  const auto start = std::chrono::steady_clock::now();
  StatusOr<cohort::v1::JobRecord> job = client.get("job-1");
  ASSERT_TRUE(job.ok()) << job.status().to_string();
  EXPECT_EQ(job->id(), "job-1");
  StatusOr<std::vector<cohort::v1::JobRecord>> jobs = client.list({}, /*all_users=*/true);
  ASSERT_TRUE(jobs.ok()) << jobs.status().to_string();
  ASSERT_EQ(jobs->size(), 1u);
  EXPECT_EQ((*jobs)[0].id(), "live-job");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(2000))
      << "the hung coordinator may cost one try's share of the first call only";
  EXPECT_EQ(hung.service.calls.load(), 1) << "the second read must go straight to the live coordinator";
}

TEST(ClientTest, ASubmitIsNotSentToAnotherCoordinatorOnceOneMayHaveReceivedIt) {
  // The hung coordinator may have stored the job: sending it elsewhere could run it twice.
  FakeServer hung(/*hung=*/true);
  FakeServer live(/*hung=*/false);
  ClientOptions options;
  options.rpc_timeout = std::chrono::milliseconds(500);
  Client client(hung.address + "," + live.address, options);
  StatusOr<std::string> id = client.submit(cohort::v1::JobSpec());
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), StatusCode::kDeadlineExceeded) << id.status().to_string();
  EXPECT_EQ(live.service.submits.load(), 0);
}

TEST(ClientTest, CoordinatorAddressDefaultsAndEnvironmentOverride) {
  unsetenv("COHORT_COORDINATOR");
  EXPECT_EQ(default_coordinator_address(), "127.0.0.1:7070");
  setenv("COHORT_COORDINATOR", "10.0.0.5:9000", 1);
  EXPECT_EQ(default_coordinator_address(), "10.0.0.5:9000");
  unsetenv("COHORT_COORDINATOR");
}

}  // namespace
}  // namespace cohort::client
