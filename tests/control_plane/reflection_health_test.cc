// cohortd's gRPC server reflection and per-service health over TLS with real credentials: an
// in-process `--role all` DaemonServer on 127.0.0.1:0 lists its services to an authenticated
// caller through grpc.reflection.v1alpha (and refuses one without credentials), answers
// grpc.health.v1 per service ("", cohort.v1.Coordinator, cohort.v1.Agent, ...), follows
// set_serving() for one service, and turns every service NOT_SERVING while it drains (a running
// task that ignores SIGTERM keeps the drain going for its grace period).

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/info.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "tests/control_plane/coordinator_calls.h"
#include "tests/control_plane/proto_file_client.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using google::protobuf::Message;
using testing::ProtoFileClient;

constexpr const char* kReflectionMethod = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo";
constexpr const char* kHealthCheck = "/grpc.health.v1.Health/Check";
// grpc.health.v1.HealthCheckResponse.ServingStatus
constexpr int kServing = 1;
constexpr int kNotServing = 2;
// How long a stopped task may ignore SIGTERM: the drain lasts about this long.
constexpr auto kStopGrace = std::chrono::seconds(3);

// Every rank ignores SIGTERM (so does its sleep, which inherits the disposition), so a drain
// waits the whole grace period before SIGKILL.
constexpr const char* kStubbornWorker = "trap '' TERM; while :; do sleep 0.2; done";

class ReflectionHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonServerOptions options;
    options.role = DaemonRole::kAll;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir_.path();
    options.tick_interval = std::chrono::milliseconds(50);
    options.node_id = "node-a";
    options.worker_command = {"/bin/sh", "-c", kStubbornWorker};
    options.stop_grace_period = kStopGrace;
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    admin_ = tls::make_channel(server_->address(), testing::admin_security(data_dir_.path()));
  }
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  // The service names reflection lists, as `caller` sees them; `status` gets the call's status.
  std::set<std::string> list_services(const std::shared_ptr<grpc::Channel>& caller, grpc::Status* status) {
    std::unique_ptr<Message> request = reflection_.message("grpc.reflection.v1alpha.ServerReflectionRequest");
    if (request == nullptr) return {};
    request->GetReflection()->SetString(request.get(), request->GetDescriptor()->FindFieldByName("list_services"),
                                        "*");
    ProtoFileClient::Reply reply =
        reflection_.call(caller, kReflectionMethod, *request, "grpc.reflection.v1alpha.ServerReflectionResponse");
    *status = reply.status;
    std::set<std::string> names;
    if (reply.message == nullptr) return names;
    const Message& response = *reply.message;
    const google::protobuf::FieldDescriptor* list = response.GetDescriptor()->FindFieldByName("list_services_response");
    EXPECT_TRUE(response.GetReflection()->HasField(response, list)) << response.DebugString();
    const Message& services = response.GetReflection()->GetMessage(response, list);
    const google::protobuf::FieldDescriptor* service = services.GetDescriptor()->FindFieldByName("service");
    for (int i = 0; i < services.GetReflection()->FieldSize(services, service); ++i) {
      const Message& entry = services.GetReflection()->GetRepeatedMessage(services, service, i);
      names.insert(entry.GetReflection()->GetString(entry, entry.GetDescriptor()->FindFieldByName("name")));
    }
    return names;
  }

  // grpc.health.v1 Check for `service`: its ServingStatus, or -1 when the call fails (`status`).
  int health(const std::string& service, grpc::Status* status = nullptr) {
    std::unique_ptr<Message> request = health_.message("grpc.health.v1.HealthCheckRequest");
    if (request == nullptr) return -1;
    request->GetReflection()->SetString(request.get(), request->GetDescriptor()->FindFieldByName("service"),
                                        service);
    ProtoFileClient::Reply reply = health_.call(admin_, kHealthCheck, *request, "grpc.health.v1.HealthCheckResponse");
    if (status != nullptr) *status = reply.status;
    if (reply.message == nullptr) return -1;
    const Message& response = *reply.message;
    return response.GetReflection()->GetEnumValue(response, response.GetDescriptor()->FindFieldByName("status"));
  }

  TempDir data_dir_;
  std::unique_ptr<DaemonServer> server_;
  std::shared_ptr<grpc::Channel> admin_;
  ProtoFileClient reflection_{"grpc/reflection/v1alpha/reflection.proto"};
  ProtoFileClient health_{"grpc/health/v1/health.proto"};
};

TEST_F(ReflectionHealthTest, ReflectionListsEveryServiceToAnAuthenticatedCaller) {
  grpc::Status status;
  const std::set<std::string> services = list_services(admin_, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  for (const char* expected : {"cohort.v1.Coordinator", "cohort.v1.Rendezvous", "cohort.v1.Agent", "cohort.v1.Info",
                               "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}) {
    EXPECT_EQ(services.count(expected), 1u) << expected << " not listed";
  }

  // A node's certificate is an identity too (kAnyIdentity).
  auto node = tls::make_channel(server_->address(), testing::node_security(*server_, "node-b"));
  EXPECT_FALSE(list_services(node, &status).empty());
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(ReflectionHealthTest, ReflectionDescribesAMethodsMessages) {
  // file_containing_symbol: the descriptor of the file that defines cohort.v1.Coordinator.
  std::unique_ptr<Message> request = reflection_.message("grpc.reflection.v1alpha.ServerReflectionRequest");
  ASSERT_NE(request, nullptr);
  request->GetReflection()->SetString(
      request.get(), request->GetDescriptor()->FindFieldByName("file_containing_symbol"), "cohort.v1.Coordinator");
  ProtoFileClient::Reply reply =
      reflection_.call(admin_, kReflectionMethod, *request, "grpc.reflection.v1alpha.ServerReflectionResponse");
  ASSERT_TRUE(reply.status.ok()) << reply.status.error_message();
  ASSERT_NE(reply.message, nullptr);
  const Message& response = *reply.message;
  const auto* field = response.GetDescriptor()->FindFieldByName("file_descriptor_response");
  ASSERT_TRUE(response.GetReflection()->HasField(response, field)) << response.DebugString();
  const Message& files = response.GetReflection()->GetMessage(response, field);
  const auto* protos = files.GetDescriptor()->FindFieldByName("file_descriptor_proto");
  bool found = false;
  for (int i = 0; i < files.GetReflection()->FieldSize(files, protos); ++i) {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(file.ParseFromString(files.GetReflection()->GetRepeatedString(files, protos, i)));
    for (const auto& service : file.service()) {
      if (service.name() != "Coordinator") continue;
      found = std::any_of(service.method().begin(), service.method().end(),
                          [](const auto& method) { return method.name() == "SubmitJob"; });
    }
  }
  EXPECT_TRUE(found) << "no Coordinator service with SubmitJob in the reflected files";
}

TEST_F(ReflectionHealthTest, ReflectionRefusesACallerWithoutCredentials) {
  tls::ChannelSecurity anonymous;  // TLS, trusting the cluster CA, but no token or certificate
  anonymous.ca_pem = server_->security().ca_pem();
  grpc::Status status;
  EXPECT_TRUE(list_services(tls::make_channel(server_->address(), anonymous), &status).empty());
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
}

TEST_F(ReflectionHealthTest, HealthPerServiceFollowsSetServing) {
  for (const char* service : {"", kCoordinatorService, kAgentService, kRendezvousService, kInfoService})
    EXPECT_EQ(health(service), kServing) << "service '" << service << "'";
  grpc::Status status;
  EXPECT_EQ(health("cohort.v1.Nothing", &status), -1);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();

  // What a standby coordinator does: only the Coordinator (and so the whole daemon) is NOT_SERVING.
  ASSERT_TRUE(server_->set_serving(kCoordinatorService, false).ok());
  EXPECT_EQ(health(kCoordinatorService), kNotServing);
  EXPECT_EQ(health(""), kNotServing);
  EXPECT_EQ(health(kAgentService), kServing);
  ASSERT_TRUE(server_->set_serving(kCoordinatorService, true).ok());
  EXPECT_EQ(health(kCoordinatorService), kServing);
  EXPECT_EQ(health(""), kServing);
  EXPECT_EQ(server_->set_serving("cohort.v1.Nothing", false).code(), StatusCode::kNotFound);
}

TEST_F(ReflectionHealthTest, EveryServiceIsNotServingWhileTheDaemonDrains) {
  auto coordinator = cohort::v1::Coordinator::NewStub(admin_);
  ASSERT_EQ(testing::wait_for_nodes(*coordinator, 1).nodes_size(), 1);
  const std::string id = testing::submit_job(*coordinator, coordinator::testing::valid_spec("stubborn"));
  ASSERT_EQ(testing::wait_for_job_state(*coordinator, id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  EXPECT_EQ(health(kAgentService), kServing);

  std::atomic<bool> drained{false};
  const auto started = std::chrono::steady_clock::now();
  std::thread drainer([&] {
    server_->drain();
    drained = true;
  });
  // The drain waits for the task, which ignores SIGTERM, for about kStopGrace; meanwhile health
  // says NOT_SERVING for every service, and the daemon still answers.
  int checked = 0;
  const auto deadline = started + kStopGrace - std::chrono::milliseconds(500);
  while (!drained && std::chrono::steady_clock::now() < deadline) {
    for (const char* service : {"", kCoordinatorService, kAgentService, kRendezvousService, kInfoService}) {
      const int status = health(service);
      // The first probe may race the drain's start; after that, never SERVING.
      if (checked > 0 || status == kNotServing) {
        EXPECT_EQ(status, kNotServing) << "service '" << service << "'";
      }
    }
    ++checked;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(drained) << "the drain ended before the stubborn task's grace period";
  EXPECT_GT(checked, 3);
  // set_serving() cannot undo a drain.
  ASSERT_TRUE(server_->set_serving(kAgentService, true).ok());
  EXPECT_EQ(health(kAgentService), kNotServing);
  auto info = cohort::v1::Info::NewStub(admin_);
  grpc::ClientContext context;
  testing::set_deadline(&context);
  cohort::v1::VersionInfo version;
  EXPECT_TRUE(info->GetVersion(&context, cohort::v1::GetVersionRequest(), &version).ok());
  drainer.join();
  EXPECT_EQ(testing::wait_for_job_state(*coordinator, id, cohort::v1::FAILED).state(), cohort::v1::FAILED);
}

}  // namespace
}  // namespace cohort::daemon
