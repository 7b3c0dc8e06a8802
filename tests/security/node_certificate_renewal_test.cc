// Node certificate renewal over real mutual TLS against a real coordinator (DaemonServer): an
// agent whose certificate is in its renewal window (the last third of its validity; the agent's
// clock is moved, the TLS stack checks the real one) trades it for a new one at start and from its
// periodic check, and its open gRPC port serves the new one without a restart, verifying callers
// against the cluster CA as before, as does its HTTPS port (http_listen) to new connections; the
// certificate is for the caller's node id, never another.

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/info.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/security/cluster_ca.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/security/daemon_security.h"
#include "daemon/server/daemon_http.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "daemon/service/info_service.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using std::chrono::hours;
using std::chrono::system_clock;

constexpr auto kCallTimeout = std::chrono::seconds(10);
// Inside a kLeafValidity certificate's renewal window (its last 122 days), not past its end.
constexpr hours kIntoTheWindow{24 * 300};

class NodeCertificateRenewalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    DaemonServerOptions options;
    options.role = DaemonRole::kCoordinator;
    options.listen = "127.0.0.1:0";
    options.data_dir = coordinator_dir_.path();
    auto coordinator = DaemonServer::start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    coordinator_ = std::move(*coordinator);
    admin_ = testing::admin_security(coordinator_dir_.path());
  }
  void TearDown() override {
    if (coordinator_) coordinator_->shutdown();
  }

  std::string new_join_token() {
    auto stub = cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), admin_));
    grpc::ClientContext context;
    context.set_deadline(system_clock::now() + kCallTimeout);
    cohort::v1::CreateJoinTokenResponse token;
    EXPECT_TRUE(stub->CreateJoinToken(&context, {}, &token).ok());
    return token.token();
  }
  // The agent's security as `cohortd --role agent` opens it, on a clock `offset_hours_` ahead.
  security::DaemonSecurityOptions agent_options(std::chrono::seconds check_interval = std::chrono::seconds(0)) {
    security::DaemonSecurityOptions options;
    options.agent = true;
    options.data_dir = agent_dir_.path();
    options.listen_host = "127.0.0.1";
    options.node_id = "node-a";
    options.coordinator_address = coordinator_->address();
    options.clock = [this] { return system_clock::now() + hours(offset_hours_.load()); };
    options.renewal_check_interval = check_interval;
    options.certificate_reload_interval = std::chrono::seconds(1);
    return options;
  }
  security::CertificateInfo on_disk() {
    StatusOr<std::string> pem = security::read_file(agent_dir_.path() + "/node/node.crt");
    EXPECT_TRUE(pem.ok());
    StatusOr<security::CertificateInfo> info = security::certificate_info(pem.ok() ? *pem : "");
    EXPECT_TRUE(info.ok());
    return info.ok() ? *info : security::CertificateInfo{};
  }
  // A node's channel to the coordinator with the key and certificate in the agent's data dir.
  std::unique_ptr<cohort::v1::Coordinator::Stub> node_stub() {
    tls::ChannelSecurity node;
    node.ca_pem = coordinator_->security().ca_pem();
    node.key_pem = *security::read_file(agent_dir_.path() + "/node/node.key");
    node.certificate_pem = *security::read_file(agent_dir_.path() + "/node/node.crt");
    return cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), node));
  }

  coordinator::testing::TempDir coordinator_dir_;
  coordinator::testing::TempDir agent_dir_;
  std::unique_ptr<DaemonServer> coordinator_;
  tls::ChannelSecurity admin_;
  std::atomic<int64_t> offset_hours_{0};
};

TEST_F(NodeCertificateRenewalTest, ACertificateInItsRenewalWindowIsRenewedAtStart) {
  security::DaemonSecurityOptions join = agent_options();
  join.join_token = new_join_token();
  security::CertificateInfo joined;
  {
    auto agent = security::DaemonSecurity::open(join);
    ASSERT_TRUE(agent.ok()) << agent.status().to_string();
    joined = (*agent)->node_certificate_info();
  }
  // notAfter has whole seconds: the renewal must come at least one later to end later.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  {
    auto agent = security::DaemonSecurity::open(agent_options());  // not due: nothing changes
    ASSERT_TRUE(agent.ok()) << agent.status().to_string();
    EXPECT_EQ((*agent)->node_certificate_info().serial, joined.serial);
  }
  offset_hours_ = kIntoTheWindow.count();
  auto agent = security::DaemonSecurity::open(agent_options());
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  const security::CertificateInfo renewed = (*agent)->node_certificate_info();
  EXPECT_EQ(renewed.common_name, "node-a");
  EXPECT_NE(renewed.serial, joined.serial);
  EXPECT_GT(renewed.not_after_unix, joined.not_after_unix);
  // What this start serves and calls with is the renewed pair, and it is on disk.
  EXPECT_EQ((*agent)->serving_certificate().certificate_pem, (*agent)->to_coordinator().certificate_pem);
  EXPECT_EQ(on_disk().serial, renewed.serial);
  EXPECT_TRUE(security::certificate_matches_key((*agent)->serving_certificate().certificate_pem,
                                                *security::read_file(agent_dir_.path() + "/node/node.key")));
  struct stat info {};
  ASSERT_EQ(::stat((agent_dir_.path() + "/node/node.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  EXPECT_NE(::access((agent_dir_.path() + "/node/node.key.new").c_str(), F_OK), 0);
  EXPECT_NE(::access((agent_dir_.path() + "/node/node.crt.new").c_str(), F_OK), 0);
  // The coordinator recorded it for node-a; the old one stays valid until it expires.
  EXPECT_TRUE(coordinator_->security().identities()->certificate_valid(renewed.serial, "node-a"));
  EXPECT_TRUE(coordinator_->security().identities()->certificate_valid(joined.serial, "node-a"));
  // The renewed certificate authenticates node-a over mutual TLS (its Heartbeat is refused as
  // unknown, NOT_FOUND, not for its credentials).
  grpc::ClientContext context;
  context.set_deadline(system_clock::now() + kCallTimeout);
  cohort::v1::HeartbeatRequest beat;
  beat.set_node_id("node-a");
  cohort::v1::HeartbeatResponse response;
  grpc::Status status = node_stub()->Heartbeat(&context, beat, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND) << status.error_message();
}

TEST_F(NodeCertificateRenewalTest, ThePeriodicCheckRenewsOnceTheCertificateIsDue) {
  security::DaemonSecurityOptions join = agent_options(std::chrono::seconds(1));
  join.join_token = new_join_token();
  auto agent = security::DaemonSecurity::open(join);
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  const security::CertificateInfo joined = (*agent)->node_certificate_info();
  // The agent's port, as cohortd opens it (the Authenticator included).
  InfoService info({"agent"});
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", (*agent)->server_credentials(), &port);
  builder.RegisterService(&info);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string address = "127.0.0.1:" + std::to_string(port);
  // Its HTTPS port (http_listen, scraped with a token file), as cohortd opens it.
  const std::string token_file = agent_dir_.path() + "/scrape.token";
  ASSERT_TRUE(security::write_private_file(token_file, "scrape-secret\n", 0600).ok());
  metrics::DaemonMetrics metrics;
  DaemonHttpOptions http_options;
  http_options.listen = "127.0.0.1:0";
  http_options.token_file = token_file;
  http_options.security = agent->get();
  http_options.metrics = &metrics;
  StatusOr<std::unique_ptr<http::HttpServer>> https = create_daemon_http(http_options);
  ASSERT_TRUE(https.ok()) << https.status().to_string();
  ASSERT_TRUE((*https)->start().ok());
  const std::string https_address = "127.0.0.1:" + std::to_string((*https)->port());
  auto served_serial = [&](const std::string& at = "") -> std::string {
    StatusOr<std::vector<std::string>> chain =
        security::fetch_server_chain(at.empty() ? address : at, std::chrono::seconds(5));
    if (!chain.ok() || chain->empty()) return "";
    StatusOr<security::CertificateInfo> leaf = security::certificate_info(chain->front());
    return leaf.ok() ? leaf->serial : "";
  };
  // GetVersion is for any identity: the coordinator's certificate, checked against the cluster CA.
  auto call_as = [&](const security::KeyAndCertificate& identity) {
    tls::ChannelSecurity caller;
    caller.ca_pem = coordinator_->security().ca_pem();
    caller.target_name = security::node_tls_name("node-a");
    caller.certificate_pem = identity.certificate_pem;
    caller.key_pem = identity.key_pem;
    auto stub = cohort::v1::Info::NewStub(tls::make_channel(address, caller));
    grpc::ClientContext context;
    context.set_deadline(system_clock::now() + kCallTimeout);
    cohort::v1::VersionInfo version;
    return stub->GetVersion(&context, {}, &version);
  };
  coordinator::testing::TempDir other_dir;
  StatusOr<security::ClusterCa> other_ca = security::ClusterCa::load_or_create(other_dir.path());
  ASSERT_TRUE(other_ca.ok());
  StatusOr<security::KeyAndCertificate> forged = other_ca->issue(tls::kCoordinatorName, {tls::kCoordinatorName}, {});
  ASSERT_TRUE(forged.ok());
  EXPECT_EQ(served_serial(), joined.serial);
  EXPECT_EQ(served_serial(https_address), joined.serial);
  grpc::Status trusted = call_as(coordinator_->security().serving_certificate());
  EXPECT_TRUE(trusted.ok()) << trusted.error_code() << " " << trusted.error_message();
  EXPECT_EQ(call_as(*forged).error_code(), grpc::StatusCode::UNAVAILABLE) << "a certificate of another CA";

  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(on_disk().serial, joined.serial) << "renewed before it was due";
  offset_hours_ = kIntoTheWindow.count();
  const auto give_up = std::chrono::steady_clock::now() + kCallTimeout;
  while (on_disk().serial == joined.serial && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  // Back to now, where the renewed certificate is not due: the check (every second here) stops
  // renewing, and one in flight has finished after a further interval.
  offset_hours_ = 0;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const security::CertificateInfo renewed = on_disk();
  EXPECT_NE(renewed.serial, joined.serial);
  EXPECT_EQ(renewed.common_name, "node-a");
  EXPECT_GT(renewed.not_after_unix, joined.not_after_unix);
  // The running agent takes it into use: its calls to the coordinator, and its open port within
  // certificate_reload_interval, verifying callers exactly as before.
  EXPECT_EQ((*agent)->node_certificate_info().serial, renewed.serial);
  EXPECT_GE((*agent)->node_certificate_generation(), 1u);
  EXPECT_EQ((*agent)->to_coordinator().certificate_pem, *security::read_file(agent_dir_.path() + "/node/node.crt"));
  const auto reload_deadline = std::chrono::steady_clock::now() + kCallTimeout;
  while (served_serial() != renewed.serial && std::chrono::steady_clock::now() < reload_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(served_serial(), renewed.serial) << "the open port still serves the old certificate";
  // The HTTPS port too, to its new connections (it looks at serving.pem once a second).
  while (served_serial(https_address) != renewed.serial && std::chrono::steady_clock::now() < reload_deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(served_serial(https_address), renewed.serial) << "the HTTPS port still serves the old certificate";
  trusted = call_as(coordinator_->security().serving_certificate());
  EXPECT_TRUE(trusted.ok()) << trusted.error_code() << " " << trusted.error_message();
  EXPECT_EQ(call_as(*forged).error_code(), grpc::StatusCode::UNAVAILABLE) << "a certificate of another CA";
  server->Shutdown();
  (*https)->stop();
  agent->reset();
  auto restarted = security::DaemonSecurity::open(agent_options());
  ASSERT_TRUE(restarted.ok()) << restarted.status().to_string();
  EXPECT_EQ((*restarted)->node_certificate_info().serial, renewed.serial);
}

TEST_F(NodeCertificateRenewalTest, ANodeGetsACertificateOnlyForItsOwnNodeId) {
  security::DaemonSecurityOptions join = agent_options();
  join.join_token = new_join_token();
  ASSERT_TRUE(security::DaemonSecurity::open(join).ok());
  auto stub = node_stub();
  // Naming another node in the request: refused.
  StatusOr<security::KeyAndCsr> other = security::make_key_and_csr("node-b");
  ASSERT_TRUE(other.ok());
  cohort::v1::RenewNodeCertificateRequest request;
  request.set_node_id("node-b");
  request.set_csr_pem(other->csr_pem);
  cohort::v1::RenewNodeCertificateResponse response;
  {
    grpc::ClientContext context;
    context.set_deadline(system_clock::now() + kCallTimeout);
    grpc::Status status = stub->RenewNodeCertificate(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  }
  // A CSR whose subject names another node: the certificate is still node-a's.
  request.set_node_id("node-a");
  {
    grpc::ClientContext context;
    context.set_deadline(system_clock::now() + kCallTimeout);
    grpc::Status status = stub->RenewNodeCertificate(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  StatusOr<security::CertificateInfo> info = security::certificate_info(response.certificate_pem());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->common_name, "node-a");
  EXPECT_FALSE(coordinator_->security().identities()->node_has_valid_certificate(
      "node-b", std::chrono::duration_cast<std::chrono::milliseconds>(system_clock::now().time_since_epoch()).count()));
  // A user's token is not a node: refused.
  auto user = cohort::v1::Coordinator::NewStub(tls::make_channel(coordinator_->address(), admin_));
  grpc::ClientContext context;
  context.set_deadline(system_clock::now() + kCallTimeout);
  EXPECT_EQ(user->RenewNodeCertificate(&context, request, &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  // A revoked node cannot renew its way back.
  {
    grpc::ClientContext revoke_context;
    revoke_context.set_deadline(system_clock::now() + kCallTimeout);
    cohort::v1::RevokeNodeRequest revoke;
    revoke.set_node_id("node-a");
    cohort::v1::RevokeNodeResponse revoked;
    ASSERT_TRUE(user->RevokeNode(&revoke_context, revoke, &revoked).ok());
  }
  grpc::ClientContext after;
  after.set_deadline(system_clock::now() + kCallTimeout);
  EXPECT_EQ(stub->RenewNodeCertificate(&after, request, &response).error_code(), grpc::StatusCode::UNAUTHENTICATED);
}

}  // namespace
}  // namespace cohort::daemon
