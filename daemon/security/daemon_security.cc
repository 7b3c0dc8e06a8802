#include "daemon/security/daemon_security.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <net/if.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <regex>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_credentials_options.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/security/authenticator.h"
#include "worker/base/credentials_file.h"
#include "worker/base/crypto.h"
#include "worker/base/leader_channel.h"

namespace cohort::security {
namespace {

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr v4{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

bool is_ip_literal(const std::string& host) {
  in_addr v4{};
  in6_addr v6{};
  return inet_pton(AF_INET, host.c_str(), &v4) == 1 || inet_pton(AF_INET6, host.c_str(), &v6) == 1;
}

// This host's names and addresses, for the coordinator's certificate: clients check the fixed name
// "cohort-coordinator", but other tools (curl, a Python scheduler without a name override) dial by
// address or host name.
void add_host_names(const std::string& listen_host, std::vector<std::string>* dns, std::vector<std::string>* ips) {
  std::set<std::string> seen_ips = {"127.0.0.1", "::1"};
  char hostname[256] = {};
  if (gethostname(hostname, sizeof(hostname) - 1) == 0 && hostname[0] != '\0') dns->push_back(hostname);
  dns->push_back("localhost");
  if (!listen_host.empty() && listen_host != "0.0.0.0" && listen_host != "::" && listen_host != "[::]") {
    if (is_ip_literal(listen_host)) seen_ips.insert(listen_host);
    else dns->push_back(listen_host);
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) == 0) {
    for (ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr) continue;
      char text[INET6_ADDRSTRLEN] = {};
      if (i->ifa_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof(text));
      else if (i->ifa_addr->sa_family == AF_INET6 && !(i->ifa_flags & IFF_LOOPBACK))
        continue;  // link-local v6 addresses carry a zone a certificate cannot name
      else
        continue;
      seen_ips.insert(text);
    }
    freeifaddrs(interfaces);
  }
  ips->assign(seen_ips.begin(), seen_ips.end());
}

Status make_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    return internal_error("cannot create {}: {}", dir, std::strerror(errno));
  struct stat info {};
  if (::lstat(dir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
    return failed_precondition_error("{} is not a directory (a symlink?); cohortd keeps keys there", dir);
  ::chmod(dir.c_str(), 0700);
  return ok_status();
}

bool file_exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

int64_t unix_seconds(std::chrono::system_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::seconds>(when.time_since_epoch()).count();
}

// A renewal writes node.key.new and node.crt.new in full, then renames them over node.key and
// node.crt, key first. A crash in between leaves a state this finishes at the next start: both
// .new files (rename both), only node.crt.new (its key is node.key already: rename it), or only
// node.key.new (its certificate never arrived: the old pair is intact, drop it).
Status finish_interrupted_renewal(const std::string& key_path, const std::string& cert_path) {
  const std::string new_key = key_path + ".new", new_cert = cert_path + ".new";
  const bool has_key = file_exists(new_key), has_cert = file_exists(new_cert);
  if (has_key && !has_cert) {
    ::unlink(new_key.c_str());
    return ok_status();
  }
  if (has_key && ::rename(new_key.c_str(), key_path.c_str()) != 0)
    return internal_error("cannot rename {} to {}: {}", new_key, key_path, std::strerror(errno));
  if (has_cert && ::rename(new_cert.c_str(), cert_path.c_str()) != 0)
    return internal_error("cannot rename {} to {}: {}", new_cert, cert_path, std::strerror(errno));
  if (has_cert) spdlog::info("finished writing the renewed node certificate {} (interrupted earlier)", cert_path);
  return ok_status();
}

// A coordinator listening on every interface is reached by its host name, not 0.0.0.0.
std::string dialable_address(const std::string& address) {
  for (const char* wildcard : {"0.0.0.0:", "[::]:"}) {
    if (address.rfind(wildcard, 0) == 0) {
      char hostname[256] = {};
      if (gethostname(hostname, sizeof(hostname) - 1) != 0 || hostname[0] == '\0') return address;
      return std::string(hostname) + address.substr(std::string(wildcard).size() - 1);
    }
  }
  return address;
}

}  // namespace

std::string node_tls_name(const std::string& node_id) { return node_id + ".node.cohort"; }

StatusOr<JoinToken> parse_join_token(const std::string& text) {
  static const std::regex kPattern("K1-([0-9a-f]{64})-([0-9a-f]{64})");
  std::smatch match;
  if (!std::regex_match(text, match, kPattern)) {
    return invalid_argument_error(
        "the join token is not valid: it looks like K1-<64 hex digits>-<64 hex digits>; an admin prints one with "
        "`cohort node token`");
  }
  return JoinToken{match[1], match[2]};
}

StatusOr<std::unique_ptr<DaemonSecurity>> DaemonSecurity::open(const DaemonSecurityOptions& options) {
  if (options.data_dir.empty()) return invalid_argument_error("data_dir is empty; cohortd keeps its keys there");
  std::unique_ptr<DaemonSecurity> security(new DaemonSecurity(options));
  if (options.insecure) {
    if (!is_loopback_host(options.listen_host)) {
      return invalid_argument_error(
          "insecure: true serves plaintext without authentication, which is allowed only on a loopback address; "
          "{:?} is not one. Listen on 127.0.0.1 for development, or drop insecure to serve TLS",
          options.listen_host);
    }
    spdlog::warn("insecure: true — plaintext gRPC without authentication on {}: every local process is an admin. "
                 "For development only.",
                 options.listen_host);
    if (options.coordinator) {
      COHORT_ASSIGN_OR_RETURN(security->identities_, coordinator::IdentityStore::open(options.data_dir));
    }
    security->job_key_ = "insecure";
    return security;
  }
  if (options.coordinator) COHORT_RETURN_IF_ERROR(security->open_coordinator());
  if (options.agent && !options.coordinator) COHORT_RETURN_IF_ERROR(security->open_agent());
  return security;
}

Status DaemonSecurity::open_coordinator() {
  const std::string ca_dir = options_.data_dir + "/ca";
  COHORT_ASSIGN_OR_RETURN(ClusterCa ca, ClusterCa::load_or_create(ca_dir));
  ca_ = std::make_unique<ClusterCa>(std::move(ca));
  ca_pem_ = ca_->certificate_pem();
  const std::string key_path = ca_dir + "/job-secret.key";
  if (!file_exists(key_path)) COHORT_RETURN_IF_ERROR(write_private_file(key_path, random_hex(32), 0600));
  COHORT_ASSIGN_OR_RETURN(job_key_, read_file(key_path));
  COHORT_ASSIGN_OR_RETURN(identities_, coordinator::IdentityStore::open(options_.data_dir));
  std::vector<std::string> dns = {tls::kCoordinatorName};
  std::vector<std::string> ips;
  add_host_names(options_.listen_host, &dns, &ips);
  // Role all: the agent's service is on this port too, and the coordinator dials it by node name.
  if (options_.agent && !options_.node_id.empty()) dns.push_back(node_tls_name(options_.node_id));
  COHORT_ASSIGN_OR_RETURN(own_, ca_->issue(tls::kCoordinatorName, dns, ips));
  if (options_.agent) {
    COHORT_ASSIGN_OR_RETURN(node_, issue_node_certificate(options_.node_id));
    COHORT_ASSIGN_OR_RETURN(node_info_, certificate_info(node_.certificate_pem));
  }
  return ok_status();
}

Status DaemonSecurity::open_agent() {
  COHORT_RETURN_IF_ERROR(coordinator::validate_node_id(options_.node_id));
  const std::string dir = options_.data_dir + "/node";
  COHORT_RETURN_IF_ERROR(make_private_dir(dir));
  const std::string key_path = dir + "/node.key", cert_path = dir + "/node.crt", ca_path = dir + "/ca.crt";
  if (!file_exists(cert_path)) {
    if (options_.join_token.empty()) {
      return failed_precondition_error(
          "this node has not joined a cluster yet ({} is missing): start it once with --join-token TOKEN (an admin "
          "prints one with `cohort node token`)",
          cert_path);
    }
    COHORT_ASSIGN_OR_RETURN(JoinToken token, parse_join_token(options_.join_token));
    // A highly available cluster lists every coordinator (issue 16): they share one CA, so the
    // first that answers shows it; JoinCluster then goes to the leader.
    COHORT_ASSIGN_OR_RETURN(std::vector<std::string> addresses, tls::parse_address_list(options_.coordinator_address));
    StatusOr<std::vector<std::string>> fetched = unavailable_error("no coordinator address");
    for (const std::string& address : addresses) {
      fetched = fetch_server_chain(address, kJoinTimeout);
      if (fetched.ok()) break;
    }
    COHORT_ASSIGN_OR_RETURN(std::vector<std::string> chain, std::move(fetched));
    std::string ca_pem;
    for (const std::string& pem : chain) {
      StatusOr<std::string> fingerprint = certificate_fingerprint(pem);
      if (fingerprint.ok() && constant_time_equal(*fingerprint, token.ca_fingerprint)) ca_pem = pem;
    }
    if (ca_pem.empty()) {
      return permission_denied_error(
          "the coordinator at {} does not present the CA the join token names (fingerprint {}...): wrong address, "
          "a token from another cluster, or someone in between; nothing was sent",
          options_.coordinator_address, token.ca_fingerprint.substr(0, 16));
    }
    COHORT_ASSIGN_OR_RETURN(KeyAndCsr request, make_key_and_csr(options_.node_id));
    tls::ChannelSecurity join;
    join.ca_pem = ca_pem;
    join.join_token = token.secret;
    tls::LeaderChannel leader(addresses, join);
    cohort::v1::JoinClusterRequest call;
    call.set_join_token(token.secret);
    call.set_node_id(options_.node_id);
    call.set_csr_pem(request.csr_pem);
    cohort::v1::JoinClusterResponse response;
    grpc::Status status = leader.unary<cohort::v1::Coordinator>(std::chrono::system_clock::now() + kJoinTimeout,
                                                                &cohort::v1::Coordinator::Stub::JoinCluster, call,
                                                                &response);
    if (!status.ok()) {
      return Status(static_cast<StatusCode>(status.error_code()),
                    fmt::format("joining the cluster at {} failed: {}", options_.coordinator_address,
                                status.error_message()));
    }
    COHORT_RETURN_IF_ERROR(write_private_file(key_path, request.key_pem, 0600));
    COHORT_RETURN_IF_ERROR(write_private_file(ca_path, ca_pem, 0644));
    COHORT_RETURN_IF_ERROR(write_private_file(cert_path, response.certificate_pem(), 0644));
    spdlog::info("node {} joined the cluster at {}; its certificate is in {}", options_.node_id,
                 options_.coordinator_address, dir);
  }
  COHORT_RETURN_IF_ERROR(finish_interrupted_renewal(key_path, cert_path));
  COHORT_ASSIGN_OR_RETURN(node_.key_pem, read_file(key_path));
  COHORT_ASSIGN_OR_RETURN(node_.certificate_pem, read_file(cert_path));
  COHORT_ASSIGN_OR_RETURN(ca_pem_, read_file(ca_path));
  COHORT_ASSIGN_OR_RETURN(CertificateInfo info, certificate_info(node_.certificate_pem));
  if (info.common_name != options_.node_id) {
    return failed_precondition_error(
        "{} is the certificate of node {:?}, but this agent's node id is {:?}: use --node-id {} or move {} away and "
        "join again",
        cert_path, info.common_name, options_.node_id, info.common_name, dir);
  }
  node_info_ = info;
  // Named here, at the start, rather than left to a TLS handshake failure in both directions.
  const int64_t now_unix = unix_seconds(now());
  if (now_unix >= info.not_after_unix) {
    return failed_precondition_error(
        "the node certificate {} expired at {} (its notAfter); the coordinator refuses it and it cannot be "
        "renewed any more. To join again: an admin makes a join token with `cohort node token` (and, if the "
        "coordinator still lists this node, `cohort node revoke {}`); then move {} away and start this agent once "
        "with --join-token TOKEN",
        cert_path, format_utc(info.not_after_unix), options_.node_id, dir);
  }
  on_disk_info_ = info;
  if (now_unix >= info.renew_after_unix()) {
    spdlog::warn("the node certificate {} expires at {} (notAfter), in {} days; renewing it", cert_path,
                 format_utc(info.not_after_unix), (info.not_after_unix - now_unix) / 86400);
    // Before the port opens: a renewed certificate (node_, node_info_) is the one this start serves
    // and calls with.
    StatusOr<bool> renewed = renew_node_certificate_if_due();
    if (!renewed.ok()) {
      // Still valid: the agent runs, and the hourly check tries again.
      spdlog::warn("renewing the node certificate {} failed: {}; it stays valid until {}, retrying every {} s",
                   cert_path, renewed.status().to_string(), format_utc(info.not_after_unix),
                   options_.renewal_check_interval.count());
    }
  }
  own_ = node_;
  // What the gRPC port serves (server_credentials()), rewritten at each start and renewal.
  COHORT_RETURN_IF_ERROR(write_private_file(dir + "/serving.pem", node_.key_pem + node_.certificate_pem + ca_pem_, 0600));
  if (options_.renewal_check_interval.count() > 0) renewal_thread_ = std::thread([this] { renewal_loop(); });
  return ok_status();
}

DaemonSecurity::~DaemonSecurity() {
  {
    std::lock_guard<std::mutex> lock(thread_mu_);
    stopping_ = true;
  }
  thread_cv_.notify_all();
  if (renewal_thread_.joinable()) renewal_thread_.join();
}

void DaemonSecurity::renewal_loop() {
  std::unique_lock<std::mutex> lock(thread_mu_);
  while (!thread_cv_.wait_for(lock, options_.renewal_check_interval, [this] { return stopping_; })) {
    lock.unlock();
    const std::string cert_path = options_.data_dir + "/node/node.crt";
    StatusOr<bool> renewed = renew_node_certificate_if_due();
    if (!renewed.ok()) {
      const CertificateInfo in_use = node_certificate_info();
      spdlog::error("renewing the node certificate {} failed: {}; the certificate this agent uses expires at {} "
                    "(in {} days), after which it can no longer reach its coordinator",
                    cert_path, renewed.status().to_string(), format_utc(in_use.not_after_unix),
                    (in_use.not_after_unix - unix_seconds(now())) / 86400);
    }
    lock.lock();
  }
}

StatusOr<bool> DaemonSecurity::renew_node_certificate_if_due() {
  if (options_.insecure || ca_ != nullptr || !options_.agent) return false;
  std::lock_guard<std::mutex> lock(renew_mu_);
  if (unix_seconds(now()) < on_disk_info_.renew_after_unix()) return false;
  const std::string dir = options_.data_dir + "/node";
  const std::string key_path = dir + "/node.key", cert_path = dir + "/node.crt";
  // The call is authenticated with the certificate in use (the one on disk).
  tls::ChannelSecurity security = to_coordinator();
  // A new key: a key that leaked stops working when its certificate expires.
  COHORT_ASSIGN_OR_RETURN(KeyAndCsr request, make_key_and_csr(options_.node_id));
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> addresses, tls::parse_address_list(options_.coordinator_address));
  tls::LeaderChannel leader(addresses, security);
  cohort::v1::RenewNodeCertificateRequest call;
  call.set_node_id(options_.node_id);
  call.set_csr_pem(request.csr_pem);
  cohort::v1::RenewNodeCertificateResponse response;
  grpc::Status status = leader.unary<cohort::v1::Coordinator>(std::chrono::system_clock::now() + kJoinTimeout,
                                                              &cohort::v1::Coordinator::Stub::RenewNodeCertificate,
                                                              call, &response);
  if (!status.ok()) {
    return Status(static_cast<StatusCode>(status.error_code()),
                  fmt::format("RenewNodeCertificate at {} failed: {}", options_.coordinator_address,
                              status.error_message()));
  }
  COHORT_ASSIGN_OR_RETURN(CertificateInfo info, certificate_info(response.certificate_pem()));
  if (info.common_name != options_.node_id || !certificate_matches_key(response.certificate_pem(), request.key_pem)) {
    return internal_error("the coordinator at {} answered RenewNodeCertificate with a certificate for {:?} that is "
                          "not for this node's new key; {} is unchanged",
                          options_.coordinator_address, info.common_name, cert_path);
  }
  COHORT_RETURN_IF_ERROR(write_private_file(key_path + ".new", request.key_pem, 0600));
  COHORT_RETURN_IF_ERROR(write_private_file(cert_path + ".new", response.certificate_pem(), 0644));
  COHORT_RETURN_IF_ERROR(finish_interrupted_renewal(key_path, cert_path));
  COHORT_RETURN_IF_ERROR(
      write_private_file(dir + "/serving.pem", request.key_pem + response.certificate_pem() + ca_pem_, 0600));
  spdlog::info("renewed the node certificate {}: serial {}, valid until {}. The gRPC port serves it within {} s, "
               "the HTTPS port (http_listen), if any, to its new connections within a second, and calls to the "
               "coordinator use it",
               cert_path, info.serial, format_utc(info.not_after_unix), options_.certificate_reload_interval.count());
  on_disk_info_ = info;
  std::lock_guard<std::mutex> in_use(node_mu_);
  node_.key_pem = request.key_pem;
  node_.certificate_pem = response.certificate_pem();
  node_info_ = info;
  ++node_generation_;
  return true;
}

std::string DaemonSecurity::serving_certificate_file() const {
  // The same test as server_credentials(): only an agent-only daemon serves from serving.pem.
  if (options_.insecure || ca_ != nullptr) return "";
  return options_.data_dir + "/node/serving.pem";
}

std::shared_ptr<grpc::ServerCredentials> DaemonSecurity::server_credentials() const {
  if (options_.insecure) return grpc::InsecureServerCredentials();
  // Client certificates are optional at the handshake (users present tokens instead) but verified
  // against the cluster CA when presented; the Authenticator then decides per method, so a call
  // without credentials gets UNAUTHENTICATED rather than a failed handshake.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  if (ca_ == nullptr) {
    // An agent: the same check against the CA (node/ca.crt), with a node certificate that a renewal
    // replaces while the port is open. serving.pem holds the key and the chain, so the watcher never
    // reads a key with another certificate.
    const std::string dir = options_.data_dir + "/node";
    auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        dir + "/serving.pem", dir + "/serving.pem", dir + "/ca.crt",
        static_cast<unsigned int>(std::max<int64_t>(1, options_.certificate_reload_interval.count())));
    grpc::experimental::TlsServerCredentialsOptions tls(provider);
    tls.watch_root_certs();
    tls.watch_identity_key_cert_pairs();
    tls.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    credentials = grpc::experimental::TlsServerCredentials(tls);
  } else {
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = ca_pem_;
    // The chain includes the CA, so a joining node can read it and check it against its token.
    ssl.pem_key_cert_pairs.push_back({own_.key_pem, own_.certificate_pem + ca_pem_});
    credentials = grpc::SslServerCredentials(ssl);
  }
  AuthenticatorOptions auth;
  auth.identities = identities_.get();
  auth.standby_refusal = standby_refusal_;
  credentials->SetAuthMetadataProcessor(std::make_shared<Authenticator>(auth));
  return credentials;
}

CertificateInfo DaemonSecurity::node_certificate_info() const {
  std::lock_guard<std::mutex> lock(node_mu_);
  return node_info_;
}

uint64_t DaemonSecurity::node_certificate_generation() const {
  std::lock_guard<std::mutex> lock(node_mu_);
  return node_generation_;
}

tls::ChannelSecurity DaemonSecurity::to_coordinator() const {
  std::lock_guard<std::mutex> lock(node_mu_);
  tls::ChannelSecurity security;
  security.insecure = options_.insecure;
  security.ca_pem = ca_pem_;
  security.certificate_pem = node_.certificate_pem;
  security.key_pem = node_.key_pem;
  return security;
}

tls::ChannelSecurity DaemonSecurity::to_agent(const std::string& node_id) const {
  tls::ChannelSecurity security;
  security.insecure = options_.insecure;
  security.ca_pem = ca_pem_;
  security.target_name = node_tls_name(node_id);
  security.certificate_pem = own_.certificate_pem;
  security.key_pem = own_.key_pem;
  return security;
}

std::string DaemonSecurity::attempt_secret(const std::string& job_id, int attempt) const {
  return hmac_sha256_hex(job_key_, fmt::format("{}\n{}", job_id, attempt));
}

bool DaemonSecurity::attempt_secret_valid(const std::string& job_id, int attempt, const std::string& secret) const {
  if (options_.insecure) return true;
  return constant_time_equal(attempt_secret(job_id, attempt), secret);
}

std::string DaemonSecurity::credentials_text(const std::string& coordinator_address, const std::string& token) const {
  return format_credentials(Credentials{dialable_address(coordinator_address), ca_pem_, token});
}

std::string DaemonSecurity::join_token_text(const std::string& secret) const {
  return fmt::format("{}{}-{}", kJoinTokenPrefix, ca_ != nullptr ? ca_->fingerprint() : "", secret);
}

Status DaemonSecurity::write_first_admin_credentials(const std::string& coordinator_address) {
  // Only once the address is known (after the port is bound), so a start that fails to bind does
  // not leave an admin whose token nobody holds.
  if (identities_ == nullptr || options_.insecure || identities_->has_admin()) return ok_status();
  COHORT_ASSIGN_OR_RETURN(std::string token, identities_->add_user(kFirstAdminName, /*admin=*/true));
  const std::string path = options_.data_dir + "/" + kAdminCredentialsFile;
  Status written = write_private_file(path, credentials_text(coordinator_address, token), 0600);
  if (!written.ok()) {
    // No one could ever use this admin's token: take it back so the next start makes a new one.
    identities_->revoke_user(kFirstAdminName).ignore_error();
    return written.with_context("the first admin's credentials");
  }
  spdlog::info("created the cluster's first admin; credentials in {} (use: cohort --credentials {} ...)", path, path);
  return ok_status();
}

StatusOr<std::string> DaemonSecurity::sign_node(const std::string& node_id, const std::string& csr_pem,
                                                const std::string& join_token_secret) {
  if (ca_ == nullptr) return failed_precondition_error("this daemon is not a coordinator; it cannot sign nodes");
  COHORT_RETURN_IF_ERROR(coordinator::validate_node_id(node_id));
  // A second join for a live node would let a token holder take over its launches and secrets.
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now().time_since_epoch()).count();
  if (identities_->node_has_valid_certificate(node_id, now_ms)) {
    return already_exists_error(
        "node {} already joined; if this is a reinstalled node, an admin revokes the old certificate first with "
        "`cohort node revoke {}` and makes a new join token",
        node_id, node_id);
  }
  COHORT_RETURN_IF_ERROR(identities_->consume_join_token(join_token_secret, now_ms));
  COHORT_ASSIGN_OR_RETURN(IssuedCertificate issued, ca_->sign_csr(csr_pem, node_id, {node_tls_name(node_id)}, {},
                                                                  options_.node_certificate_validity));
  COHORT_RETURN_IF_ERROR(record_node_certificate(node_id, issued));
  return issued.certificate_pem;
}

StatusOr<KeyAndCertificate> DaemonSecurity::issue_node_certificate(const std::string& node_id) {
  if (ca_ == nullptr) return failed_precondition_error("this daemon is not a coordinator; it cannot sign nodes");
  COHORT_RETURN_IF_ERROR(coordinator::validate_node_id(node_id));
  COHORT_ASSIGN_OR_RETURN(KeyAndCertificate issued,
                          ca_->issue(node_id, {node_tls_name(node_id)}, {}, options_.node_certificate_validity));
  COHORT_RETURN_IF_ERROR(record_node_certificate(node_id, IssuedCertificate{issued.certificate_pem, issued.serial}));
  return issued;
}

Status DaemonSecurity::record_node_certificate(const std::string& node_id, const IssuedCertificate& issued) {
  // With its notAfter, so an expired certificate stops holding the node id (node_has_valid_certificate).
  COHORT_ASSIGN_OR_RETURN(CertificateInfo info, certificate_info(issued.certificate_pem));
  return identities_->add_node_certificate(issued.serial, node_id, info.not_after_unix * 1000);
}

StatusOr<std::string> DaemonSecurity::renew_node(const std::string& node_id, const std::string& csr_pem) {
  if (ca_ == nullptr) return failed_precondition_error("this daemon is not a coordinator; it cannot sign nodes");
  COHORT_RETURN_IF_ERROR(coordinator::validate_node_id(node_id));
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(now().time_since_epoch()).count();
  // The Authenticator admitted the caller's certificate; a revocation since then must not be undone.
  if (!identities_->node_has_valid_certificate(node_id, now_ms)) {
    return failed_precondition_error(
        "node {} holds no valid certificate any more (revoked); it must join again with a new join token", node_id);
  }
  COHORT_ASSIGN_OR_RETURN(IssuedCertificate issued, ca_->sign_csr(csr_pem, node_id, {node_tls_name(node_id)}, {},
                                                                  options_.node_certificate_validity));
  COHORT_RETURN_IF_ERROR(record_node_certificate(node_id, issued));
  COHORT_ASSIGN_OR_RETURN(CertificateInfo info, certificate_info(issued.certificate_pem));
  spdlog::info("node {} renewed its certificate: serial {}, valid until {}", node_id, info.serial,
               format_utc(info.not_after_unix));
  return issued.certificate_pem;
}

StatusOr<std::vector<std::string>> fetch_server_chain(const std::string& address, std::chrono::milliseconds timeout) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return invalid_argument_error("coordinator address {:?} is not HOST:PORT", address);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  const std::string port = address.substr(colon + 1);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); rc != 0)
    return unavailable_error("cannot resolve the coordinator {}: {}", address, gai_strerror(rc));
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{static_cast<time_t>(timeout.count() / 1000), static_cast<suseconds_t>((timeout.count() % 1000) * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return unavailable_error("cannot connect to the coordinator at {}: {}", address, std::strerror(errno));
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
  std::unique_ptr<SSL, decltype(&SSL_free)> ssl(ctx ? SSL_new(ctx.get()) : nullptr, SSL_free);
  if (!ssl) {
    ::close(fd);
    return internal_error("cannot set up a TLS client (SSL_CTX_new / SSL_new failed)");
  }
  static const unsigned char kAlpn[] = {2, 'h', '2'};
  SSL_set_alpn_protos(ssl.get(), kAlpn, sizeof(kAlpn));
  // Not verified here on purpose: the caller pins the CA by the join token's fingerprint.
  SSL_set_verify(ssl.get(), SSL_VERIFY_NONE, nullptr);
  SSL_set_fd(ssl.get(), fd);
  const int connected = SSL_connect(ssl.get());
  std::vector<std::string> chain;
  if (connected == 1) {
    STACK_OF(X509)* certs = SSL_get_peer_cert_chain(ssl.get());
    for (int i = 0; certs != nullptr && i < sk_X509_num(certs); ++i) {
      std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
      PEM_write_bio_X509(bio.get(), sk_X509_value(certs, i));
      char* data = nullptr;
      const long size = BIO_get_mem_data(bio.get(), &data);
      chain.emplace_back(data, static_cast<size_t>(size));
    }
    SSL_shutdown(ssl.get());
  }
  ::close(fd);
  if (connected != 1) {
    char error[256] = {};
    ERR_error_string_n(ERR_get_error(), error, sizeof(error));
    return unavailable_error("TLS handshake with the coordinator at {} failed ({}): is it a cohortd serving TLS?",
                             address, error);
  }
  return chain;
}

}  // namespace cohort::security
