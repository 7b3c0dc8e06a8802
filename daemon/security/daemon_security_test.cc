// DaemonSecurity's node certificates over their lifetime, with a movable clock: an agent whose
// certificate expired refuses to start and says when it expired and how to join again; a node
// whose certificate expired may join again with a new token (a live one may not).

#include "daemon/security/daemon_security.h"

#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"

namespace cohort::security {
namespace {

using std::chrono::hours;
using std::chrono::system_clock;

constexpr hours kDay{24};

// A clock the test moves: an offset from the real one.
struct MovableClock {
  std::atomic<int64_t> offset_hours{0};
  std::function<system_clock::time_point()> function() {
    return [this] { return system_clock::now() + hours(offset_hours.load()); };
  }
};

DaemonSecurityOptions coordinator_options(const std::string& dir) {
  DaemonSecurityOptions options;
  options.coordinator = true;
  options.data_dir = dir;
  options.listen_host = "127.0.0.1";
  return options;
}

// What `cohortd --role agent` keeps in <data_dir>/node after joining, made here by the coordinator.
void write_node_files(const std::string& agent_dir, const KeyAndCertificate& node, const std::string& ca_pem) {
  const std::string dir = agent_dir + "/node";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_TRUE(write_private_file(dir + "/node.key", node.key_pem, 0600).ok());
  ASSERT_TRUE(write_private_file(dir + "/node.crt", node.certificate_pem, 0644).ok());
  ASSERT_TRUE(write_private_file(dir + "/ca.crt", ca_pem, 0644).ok());
}

DaemonSecurityOptions agent_options(const std::string& dir, MovableClock* clock) {
  DaemonSecurityOptions options;
  options.agent = true;
  options.data_dir = dir;
  options.listen_host = "127.0.0.1";
  options.node_id = "node-a";
  options.coordinator_address = "127.0.0.1:1";  // nothing listens: no renewal can reach it
  options.clock = clock->function();
  return options;
}

TEST(DaemonSecurityTest, AnExpiredNodeCertificateFailsTheStartNamingItsDateAndTheFix) {
  coordinator::testing::TempDir coordinator_dir, agent_dir;
  auto coordinator = DaemonSecurity::open(coordinator_options(coordinator_dir.path()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
  StatusOr<KeyAndCertificate> node = (*coordinator)->issue_node_certificate("node-a");
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  write_node_files(agent_dir.path(), *node, (*coordinator)->ca_pem());
  StatusOr<CertificateInfo> info = certificate_info(node->certificate_pem);
  ASSERT_TRUE(info.ok());
  EXPECT_NEAR(static_cast<double>(info->not_after_unix - info->not_before_unix),
              static_cast<double>(std::chrono::seconds(kLeafValidity).count() + 3600), 2.0);

  MovableClock clock;
  {
    auto agent = DaemonSecurity::open(agent_options(agent_dir.path(), &clock));
    ASSERT_TRUE(agent.ok()) << agent.status().to_string();
    EXPECT_EQ((*agent)->node_certificate_info().common_name, "node-a");
    EXPECT_EQ((*agent)->node_certificate_info().not_after_unix, info->not_after_unix);
  }
  // A year and a day later.
  clock.offset_hours = (kLeafValidity + kDay).count();
  auto expired = DaemonSecurity::open(agent_options(agent_dir.path(), &clock));
  ASSERT_FALSE(expired.ok());
  EXPECT_EQ(expired.status().code(), StatusCode::kFailedPrecondition);
  const std::string message = expired.status().message();
  EXPECT_NE(message.find(agent_dir.path() + "/node/node.crt"), std::string::npos) << message;
  EXPECT_NE(message.find("expired at " + format_utc(info->not_after_unix)), std::string::npos) << message;
  EXPECT_NE(message.find("`cohort node token`"), std::string::npos) << message;
  EXPECT_NE(message.find("`cohort node revoke node-a`"), std::string::npos) << message;
  EXPECT_NE(message.find("--join-token"), std::string::npos) << message;
}

TEST(DaemonSecurityTest, ANodeWhoseCertificateExpiredMayJoinAgainButALiveOneMayNot) {
  coordinator::testing::TempDir coordinator_dir;
  MovableClock clock;
  DaemonSecurityOptions options = coordinator_options(coordinator_dir.path());
  options.clock = clock.function();
  auto coordinator = DaemonSecurity::open(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
  ASSERT_TRUE((*coordinator)->issue_node_certificate("node-a").ok());
  auto now_ms = [&] {
    return std::chrono::duration_cast<std::chrono::milliseconds>(clock.function()().time_since_epoch()).count();
  };
  StatusOr<KeyAndCsr> request = make_key_and_csr("node-a");
  ASSERT_TRUE(request.ok());

  StatusOr<std::string> token = (*coordinator)->identities()->add_join_token(hours(1), now_ms());
  ASSERT_TRUE(token.ok());
  StatusOr<std::string> claimed = (*coordinator)->sign_node("node-a", request->csr_pem, *token);
  EXPECT_EQ(claimed.status().code(), StatusCode::kAlreadyExists) << claimed.status().to_string();

  clock.offset_hours = (kLeafValidity + kDay).count();
  token = (*coordinator)->identities()->add_join_token(hours(1), now_ms());
  ASSERT_TRUE(token.ok());
  StatusOr<std::string> rejoined = (*coordinator)->sign_node("node-a", request->csr_pem, *token);
  ASSERT_TRUE(rejoined.ok()) << rejoined.status().to_string();
  StatusOr<CertificateInfo> info = certificate_info(*rejoined);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->common_name, "node-a");
  // The new certificate holds the id again (the CA signs by the real clock: it is valid at offset 0).
  clock.offset_hours = 0;
  token = (*coordinator)->identities()->add_join_token(hours(1), now_ms());
  ASSERT_TRUE(token.ok());
  EXPECT_EQ((*coordinator)->sign_node("node-a", request->csr_pem, *token).status().code(), StatusCode::kAlreadyExists);
}

}  // namespace
}  // namespace cohort::security
