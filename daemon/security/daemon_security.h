#pragma once

// DaemonSecurity: everything cohortd needs to serve and call over TLS with no setup, the way k3s
// bootstraps a cluster.
//
// Coordinator (roles coordinator and all), at every start:
//   - loads or creates the cluster CA in <data_dir>/ca (mode 0700);
//   - issues itself a certificate (CN and DNS name "cohort-coordinator", plus this host's names and
//     addresses) used both to serve and to call agents;
//   - on first start, creates the user "admin" and writes <data_dir>/admin.credentials (0600);
//   - derives each job attempt's secret from a key in <data_dir>/ca (HMAC-SHA256 of job and attempt),
//     so a restarted coordinator knows every running attempt's secret without storing any.
// Agent (role agent): on first start, with --join-token, fetches the CA over TLS, checks it against
// the token's fingerprint, sends a CSR to JoinCluster and keeps the key and certificate in
// <data_dir>/node (0700); later starts load them. It serves with that certificate, requires the
// coordinator's certificate from callers, and calls the coordinator with it (mutual TLS). A node
// certificate that has expired fails the start with a message naming its notAfter and how to join
// again; one in its renewal window (the last third of its validity) is renewed over mutual TLS with
// it (RenewNodeCertificate: a new key, a certificate for the same node id) before the port opens,
// and a thread checks hourly afterwards. The agent's gRPC port serves <data_dir>/node/serving.pem
// (key and chain in one file, replaced by a rename, so never read as a mismatched pair) through
// gRPC's FileWatcherCertificateProvider, which re-reads it every certificate_reload_interval; the
// agent's calls to the coordinator take a renewed certificate from node_certificate_generation()
// (DaemonServer rebuilds its channel). The HTTPS port (daemon/http) serves serving.pem too, read
// again when it changes (serving_certificate_file()), so new HTTPS connections get a renewed
// certificate within about a second.
// Role all: the coordinator issues its own node's certificate directly.
// insecure: plaintext everywhere, refused unless the listen address is loopback.

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "daemon/coordinator/identity_store.h"
#include "daemon/security/cluster_ca.h"
#include "worker/base/status.h"
#include "worker/base/tls.h"

namespace cohort::security {

// The first admin's name and credentials file (under the data dir).
inline constexpr const char* kFirstAdminName = "admin";
inline constexpr const char* kAdminCredentialsFile = "admin.credentials";
// The DNS name in node `node_id`'s certificate, and what the coordinator checks when it dials
// that agent: "<node id>.node.cohort", a namespace no node id can turn into the coordinator's name.
std::string node_tls_name(const std::string& node_id);

// Join tokens: "K1-<CA fingerprint, 64 hex>-<secret, 64 hex>".
inline constexpr const char* kJoinTokenPrefix = "K1-";
// How long the join's TLS handshake and JoinCluster call may take.
inline constexpr std::chrono::seconds kJoinTimeout{15};

struct DaemonSecurityOptions {
  bool coordinator = false;       // serves the coordinator (roles coordinator, all)
  bool agent = false;             // runs an agent (roles agent, all)
  std::string data_dir;           // required
  std::string listen_host;        // the host part of the listen address
  std::string node_id;            // the agent's node id
  std::string coordinator_address;  // agent role: where to join
  std::string join_token;         // agent role, first start: the token from `cohort node token`
  bool insecure = false;          // plaintext (loopback listen addresses only)
  // The wall clock expiries are judged by (null: the system clock); tests move it.
  std::function<std::chrono::system_clock::time_point()> clock;
  // Coordinator: how long the node certificates it signs are valid (tests shorten it).
  std::chrono::seconds node_certificate_validity = kLeafValidity;
  // Agent: how often a thread checks whether the node certificate is due for renewal (0: never;
  // the check at the start still runs).
  std::chrono::seconds renewal_check_interval{3600};
  // Agent: how often its gRPC port re-reads serving.pem (a renewed certificate is served from then).
  std::chrono::seconds certificate_reload_interval{60};
};

class DaemonSecurity {
 public:
  static StatusOr<std::unique_ptr<DaemonSecurity>> open(const DaemonSecurityOptions& options);
  ~DaemonSecurity();

  bool insecure() const { return options_.insecure; }
  // What the listening port serves with: TLS with this daemon's certificate and the Authenticator.
  std::shared_ptr<grpc::ServerCredentials> server_credentials() const;
  // A standby coordinator's refusal text, "" while it leads (AuthenticatorOptions::standby_refusal);
  // set before server_credentials(). Called on gRPC's threads.
  void set_standby_refusal(std::function<std::string()> refusal) { standby_refusal_ = std::move(refusal); }
  // How the agent calls its coordinator, and how the coordinator calls the agent `node_id`.
  tls::ChannelSecurity to_coordinator() const;
  tls::ChannelSecurity to_agent(const std::string& node_id) const;
  // The cluster CA certificate (PEM); empty when insecure.
  const std::string& ca_pem() const { return ca_pem_; }
  // The key and certificate this daemon serves with (the coordinator's, or the node's); the HTTPS
  // port (daemon/http) serves with them too. Empty when insecure.
  const KeyAndCertificate& serving_certificate() const { return own_; }
  // Agent-only TLS daemon: <data_dir>/node/serving.pem, the key and chain (leaf, then the cluster
  // CA) that a renewal replaces while cohortd runs; the HTTPS port serves from it. Empty on a
  // coordinator (its certificate is issued at each start and never replaced while it runs) and
  // when insecure.
  std::string serving_certificate_file() const;
  // Agent: the node certificate in use: serial, CN and validity (all zero when insecure).
  CertificateInfo node_certificate_info() const;
  // Agent: counts the renewals taken into use since the start; to_coordinator() changes with it.
  uint64_t node_certificate_generation() const;

  // Coordinator side (null / errors on an agent-only daemon):
  coordinator::IdentityStore* identities() const { return identities_.get(); }
  // The secret of a job attempt, handed to its ranks (COHORT_JOB_SECRET).
  std::string attempt_secret(const std::string& job_id, int attempt) const;
  // Whether `secret` is that attempt's secret (constant time).
  bool attempt_secret_valid(const std::string& job_id, int attempt, const std::string& secret) const;
  // Writes <data_dir>/admin.credentials for the first admin if this start created them.
  Status write_first_admin_credentials(const std::string& coordinator_address);
  // A credentials file's text for a user's token.
  std::string credentials_text(const std::string& coordinator_address, const std::string& token) const;
  // The join token text for a join token secret.
  std::string join_token_text(const std::string& secret) const;
  // Signs a joining node's CSR (JoinCluster) and records the certificate, using up the join token.
  // ALREADY_EXISTS when the node id holds a certificate that is neither revoked nor expired.
  StatusOr<std::string> sign_node(const std::string& node_id, const std::string& csr_pem,
                                  const std::string& join_token_secret);
  // A key and a recorded certificate for `node_id`, made here (the node of role all, tests).
  StatusOr<KeyAndCertificate> issue_node_certificate(const std::string& node_id);
  // RenewNodeCertificate: signs `csr_pem` for `node_id`, the CN of the caller's verified node
  // certificate (never the CSR's subject), and records it. The old certificate stays valid until
  // it expires (connections the agent opened before it took the new one into use keep it).
  // FAILED_PRECONDITION when the node holds no valid certificate any more (revoked meanwhile).
  StatusOr<std::string> renew_node(const std::string& node_id, const std::string& csr_pem);

  // Agent: renews the node certificate if it is in its renewal window (the last third of its
  // validity): a new key and CSR, RenewNodeCertificate over mutual TLS with the current
  // certificate, then node.key and node.crt replaced (each written in full under a temporary name,
  // then renamed; owner-only key). True when it renewed; false when not due (or not an agent-only,
  // TLS daemon). serving.pem is rewritten too: the gRPC and HTTPS ports serve the new certificate
  // from their next look at it; to_coordinator() has it at once.
  StatusOr<bool> renew_node_certificate_if_due();

 private:
  explicit DaemonSecurity(DaemonSecurityOptions options) : options_(std::move(options)) {}
  Status open_coordinator();
  Status open_agent();
  // The renewal check's thread (agent-only, TLS daemons).
  void renewal_loop();
  // Records a certificate this coordinator signed for `node_id`, with its notAfter.
  Status record_node_certificate(const std::string& node_id, const IssuedCertificate& issued);
  std::chrono::system_clock::time_point now() const {
    return options_.clock ? options_.clock() : std::chrono::system_clock::now();
  }

  const DaemonSecurityOptions options_;
  std::unique_ptr<ClusterCa> ca_;
  std::unique_ptr<coordinator::IdentityStore> identities_;
  std::string ca_pem_;
  std::string job_key_;                // HMAC key for attempt secrets (coordinator)
  std::function<std::string()> standby_refusal_;  // see set_standby_refusal

  KeyAndCertificate own_;              // what this daemon serves with (coordinator cert, or the node's)
  KeyAndCertificate node_;             // the agent's node certificate (calls to the coordinator)
  CertificateInfo node_info_;          // node_'s serial, CN and validity (agent)

  // Renewal (agent). node_ and node_info_ change after the start only under node_mu_.
  mutable std::mutex node_mu_;
  uint64_t node_generation_ = 0;       // guarded by node_mu_
  std::mutex renew_mu_;                // one renewal at a time; guards on_disk_info_
  CertificateInfo on_disk_info_;       // the certificate in <data_dir>/node/node.crt
  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stopping_ = false;              // guarded by thread_mu_
  std::thread renewal_thread_;
};

// Parses "K1-<fingerprint>-<secret>". INVALID_ARGUMENT saying what a join token looks like.
struct JoinToken {
  std::string ca_fingerprint;
  std::string secret;
};
StatusOr<JoinToken> parse_join_token(const std::string& text);

// The certificate chain a TLS server at `address` presents (PEM, leaf first), read with a plain
// OpenSSL handshake (ALPN h2) without trusting it yet: a joining node checks the CA in it against
// the join token's fingerprint.
StatusOr<std::vector<std::string>> fetch_server_chain(const std::string& address, std::chrono::milliseconds timeout);

}  // namespace cohort::security
