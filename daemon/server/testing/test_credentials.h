#pragma once

// Credentials for tests that talk to a real DaemonServer over gRPC, obtained the way each real
// caller holds them: the first admin's credentials file from the data directory, a user added
// through the identity store, a node certificate signed by the cluster CA, a job attempt's secret.
// Tests never switch security off.

#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "daemon/server/daemon_server.h"
#include "worker/base/credentials_file.h"
#include "worker/base/tls.h"

namespace cohort::daemon::testing {

// The first admin (<data_dir>/admin.credentials, written at the coordinator's first start).
inline tls::ChannelSecurity admin_security(const std::string& data_dir) {
  StatusOr<Credentials> credentials = load_credentials(data_dir + "/" + security::kAdminCredentialsFile);
  EXPECT_TRUE(credentials.ok()) << credentials.status().to_string();
  tls::ChannelSecurity security;
  if (!credentials.ok()) return security;
  security.ca_pem = credentials->ca_certificate;
  security.bearer_token = credentials->token;
  return security;
}

// A new user `name` (an admin with `admin`).
inline tls::ChannelSecurity user_security(DaemonServer& server, const std::string& name, bool admin = false) {
  StatusOr<std::string> token = server.security().identities()->add_user(name, admin);
  EXPECT_TRUE(token.ok()) << token.status().to_string();
  tls::ChannelSecurity security;
  security.ca_pem = server.security().ca_pem();
  security.bearer_token = token.ok() ? *token : "";
  return security;
}

// The agent of node `node_id`: a certificate for it from the cluster CA.
inline tls::ChannelSecurity node_security(DaemonServer& server, const std::string& node_id) {
  StatusOr<security::KeyAndCertificate> issued = server.security().issue_node_certificate(node_id);
  EXPECT_TRUE(issued.ok()) << issued.status().to_string();
  tls::ChannelSecurity security;
  security.ca_pem = server.security().ca_pem();
  if (issued.ok()) {
    security.certificate_pem = issued->certificate_pem;
    security.key_pem = issued->key_pem;
  }
  return security;
}

// A rank of `job_id`'s attempt: the CA and the attempt's secret, as the agent hands them over.
inline tls::ChannelSecurity job_security(DaemonServer& server, const std::string& job_id, int attempt) {
  tls::ChannelSecurity security;
  security.ca_pem = server.security().ca_pem();
  security.job_secret = server.security().attempt_secret(job_id, attempt);
  return security;
}

}  // namespace cohort::daemon::testing
