#pragma once

// The one place that builds gRPC channel credentials (STYLE rule 14), for every cohort client: the
// CLI and schedulers (a user's bearer token), agents and the coordinator calling each other
// (mutual TLS with node certificates), and worker ranks (the attempt's job secret).
//
//   ChannelSecurity security;
//   security.ca_pem = credentials.ca_certificate;   // trust only the cluster CA
//   security.bearer_token = credentials.token;      // "authorization: Bearer ..." on every call
//   auto channel = make_channel(credentials.coordinator, security);
//
// Every channel verifies the server's certificate against the cluster CA and the name it must
// carry (`target_name`: "cohort-coordinator" for the coordinator, the node id for an agent), so it
// does not depend on how the address was spelled (an IP, an alias, a namespace's veth address).

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "worker/base/status.h"

namespace cohort::tls {

// The name in the coordinator's certificate that every client checks.
inline constexpr const char* kCoordinatorName = "cohort-coordinator";
// Call metadata carrying a worker rank's job secret (rendezvous, metrics reports).
inline constexpr const char* kJobSecretMetadata = "x-cohort-job-secret";
// Call metadata carrying a join token's secret (JoinCluster).
inline constexpr const char* kJoinTokenMetadata = "x-cohort-join-token";
// Environment of a worker rank: the cluster CA (PEM) and the attempt's secret. Without
// COHORT_CA_CERTIFICATE, a rank talks plaintext (a coordinator in loopback development mode).
inline constexpr const char* kCaCertificateEnv = "COHORT_CA_CERTIFICATE";
inline constexpr const char* kJobSecretEnv = "COHORT_JOB_SECRET";
// HTTP/2 keepalive of long-lived channels: a peer that vanished without closing the connection is
// noticed within kKeepaliveTime + kKeepaliveTimeout. Servers accept pings this often.
inline constexpr std::chrono::milliseconds kKeepaliveTime{30000};
inline constexpr std::chrono::milliseconds kKeepaliveTimeout{10000};

struct ChannelSecurity {
  bool insecure = false;          // plaintext: only for a daemon started with `insecure: true`
  std::string ca_pem;             // the cluster CA (required unless insecure)
  std::string target_name = kCoordinatorName;  // the name the server's certificate must carry
  std::string certificate_pem;    // a client certificate (nodes, the coordinator); optional
  std::string key_pem;            // its private key
  std::string bearer_token;       // a user's token; optional
  std::string job_secret;         // a worker rank's attempt secret; optional
  std::string join_token;         // a joining node's token secret; optional
};

// A channel to `address` (HOST:PORT) with `security` and the keepalive above. Does not connect yet.
std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ChannelSecurity& security);
// The same with more channel arguments (e.g. reconnect backoff, worker/base/leader_channel.h).
std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ChannelSecurity& security,
                                            grpc::ChannelArguments args);

// A worker rank's security from its environment (COHORT_CA_CERTIFICATE, COHORT_JOB_SECRET).
ChannelSecurity worker_security_from_environment();

}  // namespace cohort::tls
