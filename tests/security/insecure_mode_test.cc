// The one way to run cohortd without TLS: `insecure: true`, refused unless the listen address is
// loopback. This tests that mode itself; every other test talks TLS with real credentials.

#include <filesystem>

#include <gtest/gtest.h>

#include "client/client.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"

namespace cohort::daemon {
namespace {

TEST(InsecureModeTest, RefusedOnAnAddressOtherHostsCanReach) {
  coordinator::testing::TempDir dir;
  DaemonServerOptions options;
  options.listen = "0.0.0.0:0";
  options.data_dir = dir.path();
  options.insecure = true;
  auto server = DaemonServer::start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("loopback"), std::string::npos) << server.status().message();
}

TEST(InsecureModeTest, LoopbackServesPlaintextAndNoTls) {
  coordinator::testing::TempDir dir;
  DaemonServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir.path();
  options.insecure = true;
  auto server = DaemonServer::start(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  client::Client plaintext((*server)->address());  // ClientOptions default: plaintext
  EXPECT_TRUE(plaintext.list().ok());
  EXPECT_TRUE(plaintext.server_version().ok());
  // No CA, no first admin: nothing to hand out in this mode.
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/admin.credentials"));
  client::ClientOptions tls;
  tls.security.insecure = false;
  tls.security.ca_pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  EXPECT_FALSE(client::Client((*server)->address(), tls).list().ok());
  (*server)->shutdown();
}

TEST(InsecureModeTest, TheDefaultIsTlsAndPlaintextIsRefused) {
  coordinator::testing::TempDir dir;
  DaemonServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = dir.path();
  auto server = DaemonServer::start(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  StatusOr<std::vector<cohort::v1::JobRecord>> refused = client::Client((*server)->address()).list();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--credentials"), std::string::npos) << refused.status().message();
  client::ClientOptions admin;
  admin.security = testing::admin_security(dir.path());
  EXPECT_TRUE(client::Client((*server)->address(), admin).list().ok());
  (*server)->shutdown();
}

}  // namespace
}  // namespace cohort::daemon
