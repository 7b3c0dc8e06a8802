// Who may call what, over real TLS, for every method of every cohort service: the methods are
// enumerated from the services' descriptors, so a method added later is covered without anyone
// remembering to list it here.
//
//   - without credentials                              -> UNAUTHENTICATED
//   - plaintext against a TLS port                     -> fails
//   - a certificate from another CA                    -> refused (the handshake fails)
//   - user B on user A's job                           -> PERMISSION_DENIED
//   - a node certificate claiming another node's id    -> PERMISSION_DENIED
//   - a user on node-only, admin-only or job-only methods -> PERMISSION_DENIED
//
// The cluster is a coordinator (role coordinator) and an agent on its own daemon that joins it
// with a join token, as `cohortd --role agent --join-token` does.

#include <sys/stat.h>

#include <future>
#include <thread>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/info.grpc.pb.h"
#include "cohort/v1/rendezvous.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/security/authenticator.h"
#include "daemon/security/cluster_ca.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::MethodDescriptor;
using google::protobuf::ServiceDescriptor;

constexpr auto kCallTimeout = std::chrono::seconds(10);

const std::vector<std::string>& cohort_services() {
  static const std::vector<std::string> kServices = {"cohort.v1.Coordinator", "cohort.v1.Rendezvous",
                                                     "cohort.v1.Agent", "cohort.v1.Info"};
  return kServices;
}

std::vector<const MethodDescriptor*> methods_of(const std::string& service) {
  const ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  EXPECT_NE(descriptor, nullptr) << service;
  std::vector<const MethodDescriptor*> methods;
  for (int i = 0; descriptor != nullptr && i < descriptor->method_count(); ++i) methods.push_back(descriptor->method(i));
  return methods;
}

std::string path_of(const MethodDescriptor* method) {
  return "/" + method->service()->full_name() + "/" + method->name();
}

// A request for `method` with `fields` set where the request type has them: "job_id", "node_id",
// and the nested "node.node_id" / "attempt.job_id" / "attempt.attempt".
std::string request_bytes(const MethodDescriptor* method, const std::map<std::string, std::string>& fields) {
  std::unique_ptr<Message> request(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(method->input_type())->New());
  for (const auto& [path, value] : fields) {
    Message* message = request.get();
    std::string name = path;
    if (size_t dot = path.find('.'); dot != std::string::npos) {
      const FieldDescriptor* outer = message->GetDescriptor()->FindFieldByName(path.substr(0, dot));
      if (outer == nullptr || outer->type() != FieldDescriptor::TYPE_MESSAGE) continue;
      message = message->GetReflection()->MutableMessage(message, outer);
      name = path.substr(dot + 1);
    }
    const FieldDescriptor* field = message->GetDescriptor()->FindFieldByName(name);
    if (field == nullptr) continue;
    if (field->type() == FieldDescriptor::TYPE_STRING) message->GetReflection()->SetString(message, field, value);
    if (field->type() == FieldDescriptor::TYPE_INT32)
      message->GetReflection()->SetInt32(message, field, std::stoi(value));
  }
  return request->SerializeAsString();
}

// Calls `method` (any kind: a streaming method's status arrives the same way) and returns its status.
grpc::Status call(const std::shared_ptr<grpc::Channel>& channel, const MethodDescriptor* method,
                  const std::string& body) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, path_of(method), grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

class AccessControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonServerOptions coordinator_options;
    coordinator_options.role = DaemonRole::kCoordinator;
    coordinator_options.listen = "127.0.0.1:0";
    coordinator_options.data_dir = coordinator_dir_.path();
    auto coordinator = DaemonServer::start(coordinator_options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    coordinator_ = std::move(*coordinator);
    admin_ = testing::admin_security(coordinator_dir_.path());

    // The agent joins with a join token made by the admin, over the real JoinCluster flow.
    auto admin_stub = cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), admin_));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    cohort::v1::CreateJoinTokenResponse token;
    grpc::Status made = admin_stub->CreateJoinToken(&context, {}, &token);
    ASSERT_TRUE(made.ok()) << made.error_code() << " " << made.error_message();
    DaemonServerOptions agent_options;
    agent_options.role = DaemonRole::kAgent;
    agent_options.listen = "127.0.0.1:0";
    agent_options.data_dir = agent_dir_.path();
    agent_options.node_id = "node-a";
    agent_options.coordinator_address = coordinator_->address();
    agent_options.join_token = token.token();
    agent_options.worker_command = {"/bin/true"};
    first_token_ = token.token();
    auto agent = DaemonServer::start(agent_options);
    ASSERT_TRUE(agent.ok()) << agent.status().to_string();
    agent_ = std::move(*agent);
  }
  void TearDown() override {
    if (agent_) agent_->shutdown();
    if (coordinator_) coordinator_->shutdown();
  }

  // The daemon that serves `service`'s methods in this cluster.
  const std::string& address_for(const std::string& service) const {
    return service == "cohort.v1.Agent" ? agent_->address() : coordinator_->address();
  }
  std::shared_ptr<grpc::Channel> channel(const std::string& service, const tls::ChannelSecurity& security) const {
    tls::ChannelSecurity s = security;
    if (service == "cohort.v1.Agent") s.target_name = security::node_tls_name("node-a");
    return tls::make_channel(address_for(service), s);
  }

  coordinator::testing::TempDir coordinator_dir_;
  coordinator::testing::TempDir agent_dir_;
  std::unique_ptr<DaemonServer> coordinator_;
  std::unique_ptr<DaemonServer> agent_;
  tls::ChannelSecurity admin_;
  std::string first_token_;

  std::string new_join_token() {
    auto stub = cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), admin_));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    cohort::v1::CreateJoinTokenResponse token;
    EXPECT_TRUE(stub->CreateJoinToken(&context, {}, &token).ok());
    return token.token();
  }
  // Starts an agent that joins as `node_id` with `token`; its error, or OK.
  Status join_as(const std::string& node_id, const std::string& token) {
    coordinator::testing::TempDir dir;
    DaemonServerOptions options;
    options.role = DaemonRole::kAgent;
    options.listen = "127.0.0.1:0";
    options.data_dir = dir.path();
    options.node_id = node_id;
    options.coordinator_address = coordinator_->address();
    options.join_token = token;
    options.worker_command = {"/bin/true"};
    auto agent = DaemonServer::start(options);
    if (!agent.ok()) return agent.status();
    (*agent)->shutdown();
    return ok_status();
  }
};

TEST_F(AccessControlTest, EveryMethodIsInThePolicyTable) {
  for (const std::string& service : cohort_services()) {
    for (const MethodDescriptor* method : methods_of(service))
      EXPECT_EQ(security::method_policy().count(path_of(method)), 1u) << path_of(method) << " has no policy";
  }
}

TEST_F(AccessControlTest, EveryMethodWithoutCredentialsIsUnauthenticated) {
  tls::ChannelSecurity anonymous;  // TLS, trusting the cluster CA, but no token, secret or certificate
  anonymous.ca_pem = coordinator_->security().ca_pem();
  int checked = 0;
  for (const std::string& service : cohort_services()) {
    for (const MethodDescriptor* method : methods_of(service)) {
      grpc::Status status = call(channel(service, anonymous), method, "");
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
          << path_of(method) << ": " << status.error_code() << " " << status.error_message();
      EXPECT_NE(status.error_message().find("needs credentials"), std::string::npos) << status.error_message();
      ++checked;
    }
  }
  EXPECT_GE(checked, 35);  // 19 Coordinator, 11 Rendezvous, 4 Agent, 1 Info methods
}

TEST_F(AccessControlTest, PlaintextAgainstATlsPortFails) {
  tls::ChannelSecurity plaintext;
  plaintext.insecure = true;
  for (const std::string& service : cohort_services()) {
    for (const MethodDescriptor* method : methods_of(service)) {
      grpc::Status status = call(channel(service, plaintext), method, "");
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << path_of(method) << ": " << status.error_message();
    }
  }
}

TEST_F(AccessControlTest, ACertificateFromAnotherCaIsRefused) {
  coordinator::testing::TempDir other_dir;
  StatusOr<security::ClusterCa> other = security::ClusterCa::load_or_create(other_dir.path());
  ASSERT_TRUE(other.ok());
  // A node certificate for node-a, but signed by a CA this cluster never saw; and the admin's token
  // sent to a server the client verifies against that foreign CA.
  StatusOr<security::KeyAndCertificate> forged = other->issue("node-a", {"node-a"}, {});
  ASSERT_TRUE(forged.ok());
  tls::ChannelSecurity forged_node;
  forged_node.ca_pem = coordinator_->security().ca_pem();
  forged_node.certificate_pem = forged->certificate_pem;
  forged_node.key_pem = forged->key_pem;
  tls::ChannelSecurity wrong_trust = admin_;
  wrong_trust.ca_pem = other->certificate_pem();
  for (const std::string& service : cohort_services()) {
    for (const MethodDescriptor* method : methods_of(service)) {
      grpc::Status node = call(channel(service, forged_node), method, "");
      EXPECT_EQ(node.error_code(), grpc::StatusCode::UNAVAILABLE) << path_of(method) << ": " << node.error_message();
      grpc::Status user = call(channel(service, wrong_trust), method, "");
      EXPECT_EQ(user.error_code(), grpc::StatusCode::UNAVAILABLE) << path_of(method) << ": " << user.error_message();
    }
  }
}

TEST_F(AccessControlTest, UserBOnUserAsJobIsPermissionDenied) {
  tls::ChannelSecurity alice = testing::user_security(*coordinator_, "alice");
  tls::ChannelSecurity bob = testing::user_security(*coordinator_, "bob");
  auto alice_stub = cohort::v1::Coordinator::NewStub(channel("cohort.v1.Coordinator", alice));
  cohort::v1::SubmitJobRequest submit;
  *submit.mutable_spec() = coordinator::testing::valid_spec("mlp", /*nodes=*/1);
  submit.set_wait_for_capacity(true);
  cohort::v1::SubmitJobResponse submitted;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  grpc::Status status = alice_stub->SubmitJob(&context, submit, &submitted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const std::string job = submitted.job_id();

  int checked = 0;
  for (const MethodDescriptor* method : methods_of("cohort.v1.Coordinator")) {
    if (security::method_policy().at(path_of(method)) != security::Access::kUser) continue;
    if (method->input_type()->FindFieldByName("job_id") == nullptr) continue;
    const std::string body = request_bytes(method, {{"job_id", job}});
    grpc::Status denied = call(channel("cohort.v1.Coordinator", bob), method, body);
    EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << path_of(method) << ": " << denied.error_code() << " " << denied.error_message();
    EXPECT_NE(denied.error_message().find("belongs to alice"), std::string::npos) << denied.error_message();
    ++checked;
  }
  EXPECT_GE(checked, 4);  // GetJob, CancelJob, WatchJob, StreamLogs

  // Bob's list does not show Alice's job; --all is for admins; the admin sees it.
  auto bob_stub = cohort::v1::Coordinator::NewStub(channel("cohort.v1.Coordinator", bob));
  cohort::v1::ListJobsResponse listed;
  grpc::ClientContext list_context;
  list_context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  ASSERT_TRUE(bob_stub->ListJobs(&list_context, {}, &listed).ok());
  EXPECT_EQ(listed.jobs_size(), 0);
  cohort::v1::ListJobsRequest all;
  all.set_all_users(true);
  grpc::ClientContext all_context;
  all_context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  EXPECT_EQ(bob_stub->ListJobs(&all_context, all, &listed).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  auto admin_stub = cohort::v1::Coordinator::NewStub(channel("cohort.v1.Coordinator", admin_));
  grpc::ClientContext admin_context;
  admin_context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  listed.Clear();
  ASSERT_TRUE(admin_stub->ListJobs(&admin_context, all, &listed).ok());
  ASSERT_EQ(listed.jobs_size(), 1);
  EXPECT_EQ(listed.jobs(0).owner(), "alice");
}

TEST_F(AccessControlTest, ANodeCertificateClaimingAnotherNodeIsPermissionDenied) {
  tls::ChannelSecurity node_b = testing::node_security(*coordinator_, "node-b");
  int checked = 0;
  for (const MethodDescriptor* method : methods_of("cohort.v1.Coordinator")) {
    if (security::method_policy().at(path_of(method)) != security::Access::kNode) continue;
    const std::string body =
        request_bytes(method, {{"node_id", "node-a"}, {"node.node_id", "node-a"}, {"job_id", "j-1"}, {"attempt", "1"}});
    grpc::Status denied = call(channel("cohort.v1.Coordinator", node_b), method, body);
    EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << path_of(method) << ": " << denied.error_code() << " " << denied.error_message();
    EXPECT_NE(denied.error_message().find("node node-b cannot act for node node-a"), std::string::npos)
        << denied.error_message();
    ++checked;
  }
  EXPECT_EQ(checked, 5);  // RegisterNode, Heartbeat, ReportTaskExit, ReportTasksStarted, RenewNodeCertificate
}

TEST_F(AccessControlTest, CredentialsOfTheWrongKindArePermissionDenied) {
  tls::ChannelSecurity alice = testing::user_security(*coordinator_, "alice");
  tls::ChannelSecurity node_b = testing::node_security(*coordinator_, "node-b");
  for (const std::string& service : cohort_services()) {
    for (const MethodDescriptor* method : methods_of(service)) {
      const security::Access access = security::method_policy().at(path_of(method));
      // A plain user on what is for admins, nodes, the coordinator or a job's ranks.
      if (access == security::Access::kAdmin || access == security::Access::kNode ||
          access == security::Access::kJobSecret || access == security::Access::kJoinToken ||
          (access == security::Access::kCoordinator && service != "cohort.v1.Agent")) {
        grpc::Status status = call(channel(service, alice), method, "");
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << path_of(method) << ": " << status.error_code() << " " << status.error_message();
      }
      // A node on what is for users or the coordinator.
      if (access == security::Access::kUser || access == security::Access::kAdmin ||
          access == security::Access::kCoordinator) {
        grpc::Status status = call(channel(service, node_b), method, "");
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << path_of(method) << ": " << status.error_code() << " " << status.error_message();
      }
    }
  }
}

TEST_F(AccessControlTest, RevokedUsersAndNodesAreRefused) {
  tls::ChannelSecurity carol = testing::user_security(*coordinator_, "carol");
  tls::ChannelSecurity node_c = testing::node_security(*coordinator_, "node-c");
  auto admin_stub = cohort::v1::Coordinator::NewStub(channel("cohort.v1.Coordinator", admin_));
  for (auto [name, is_node] : {std::pair<std::string, bool>{"carol", false}, {"node-c", true}}) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    grpc::Status status;
    if (is_node) {
      cohort::v1::RevokeNodeRequest request;
      request.set_node_id(name);
      cohort::v1::RevokeNodeResponse response;
      status = admin_stub->RevokeNode(&context, request, &response);
    } else {
      cohort::v1::RevokeUserRequest request;
      request.set_name(name);
      cohort::v1::RevokeUserResponse response;
      status = admin_stub->RevokeUser(&context, request, &response);
    }
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  const MethodDescriptor* list_jobs =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName("cohort.v1.Coordinator.ListJobs");
  grpc::Status user = call(channel("cohort.v1.Coordinator", carol), list_jobs, "");
  EXPECT_EQ(user.error_code(), grpc::StatusCode::UNAUTHENTICATED) << user.error_message();
  const MethodDescriptor* heartbeat =
      google::protobuf::DescriptorPool::generated_pool()->FindMethodByName("cohort.v1.Coordinator.Heartbeat");
  grpc::Status node = call(channel("cohort.v1.Coordinator", node_c), heartbeat,
                           request_bytes(heartbeat, {{"node_id", "node-c"}}));
  EXPECT_EQ(node.error_code(), grpc::StatusCode::UNAUTHENTICATED) << node.error_message();
  EXPECT_NE(node.error_message().find("revoked"), std::string::npos) << node.error_message();
}

TEST_F(AccessControlTest, JoinTokensAdmitOneNodeAndALiveNodeCannotBeClaimed) {
  // The token node-a joined with is used up.
  Status reused = join_as("node-c", first_token_);
  EXPECT_EQ(reused.code(), StatusCode::kUnauthenticated) << reused.to_string();
  // A fresh token cannot take over node-a's identity while node-a's certificate is valid...
  Status claimed = join_as("node-a", new_join_token());
  EXPECT_EQ(claimed.code(), StatusCode::kAlreadyExists) << claimed.to_string();
  EXPECT_NE(claimed.message().find("cohort node revoke node-a"), std::string::npos) << claimed.to_string();
  // ...nor a name that matches another node's certificate name case-insensitively.
  Status upper = join_as("NODE-A", new_join_token());
  EXPECT_EQ(upper.code(), StatusCode::kInvalidArgument) << upper.to_string();
  // A new node joins with a new token.
  EXPECT_TRUE(join_as("node-c", new_join_token()).ok());
}

TEST_F(AccessControlTest, ARevokedNodeLeavesTheRegistryAtOnce) {
  auto stub = cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), admin_));
  auto live_nodes = [&] {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
    cohort::v1::ListNodesResponse nodes;
    EXPECT_TRUE(stub->ListNodes(&context, {}, &nodes).ok());
    return nodes.nodes_size();
  };
  const auto give_up = std::chrono::steady_clock::now() + kCallTimeout;
  while (live_nodes() != 1 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(live_nodes(), 1);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kCallTimeout);
  cohort::v1::RevokeNodeRequest request;
  request.set_node_id("node-a");
  cohort::v1::RevokeNodeResponse response;
  ASSERT_TRUE(stub->RevokeNode(&context, request, &response).ok());
  EXPECT_EQ(live_nodes(), 0);
}

TEST_F(AccessControlTest, FirstStartWritesPrivateAdminCredentials) {
  struct stat info {};
  ASSERT_EQ(::stat((coordinator_dir_.path() + "/admin.credentials").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  ASSERT_EQ(::stat((coordinator_dir_.path() + "/ca").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((agent_dir_.path() + "/node/node.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace cohort::daemon
