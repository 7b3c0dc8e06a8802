#include "worker/base/tls.h"

#include <cstdlib>
#include <map>
#include <utility>

namespace cohort::tls {
namespace {

// Adds fixed metadata to every call on a channel (bearer token, job secret, join token).
class FixedMetadata final : public grpc::MetadataCredentialsPlugin {
 public:
  explicit FixedMetadata(std::multimap<std::string, std::string> metadata) : metadata_(std::move(metadata)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref /*service_url*/, grpc::string_ref /*method_name*/,
                           const grpc::AuthContext& /*channel_auth_context*/,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    for (const auto& [key, value] : metadata_) metadata->emplace(key, value);
    return grpc::Status::OK;
  }

 private:
  const std::multimap<std::string, std::string> metadata_;
};

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

}  // namespace

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ChannelSecurity& security) {
  return make_channel(address, security, grpc::ChannelArguments());
}

std::shared_ptr<grpc::Channel> make_channel(const std::string& address, const ChannelSecurity& security,
                                            grpc::ChannelArguments args) {
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(kKeepaliveTime.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, static_cast<int>(kKeepaliveTimeout.count()));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  // No gRPC retries (transparent ones included): gRPC 1.51's retry filter reads the call's
  // grpc-status from trailers without checking that there is one, and a peer that dies mid-call can
  // end a stream without it; the process then aborts (absl optional<grpc_status_code> assertion,
  // grpc/grpc#34683; the HA chaos test's cleanup, which kills etcd and cohortd together, hit it).
  // Without the filter such a call fails with UNKNOWN instead. Cohort's callers handle failed calls
  // themselves (EtcdClient fails over between members, LeaderChannel between coordinators, the
  // agent heartbeats again), so the transparent retries lost with it are not needed.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (security.insecure) return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = security.ca_pem;
  ssl.pem_cert_chain = security.certificate_pem;
  ssl.pem_private_key = security.key_pem;
  args.SetSslTargetNameOverride(security.target_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  std::multimap<std::string, std::string> metadata;
  if (!security.bearer_token.empty()) metadata.emplace("authorization", "Bearer " + security.bearer_token);
  if (!security.job_secret.empty()) metadata.emplace(kJobSecretMetadata, security.job_secret);
  if (!security.join_token.empty()) metadata.emplace(kJoinTokenMetadata, security.join_token);
  if (!metadata.empty()) {
    credentials = grpc::CompositeChannelCredentials(
        credentials, grpc::MetadataCredentialsFromPlugin(std::make_unique<FixedMetadata>(std::move(metadata))));
  }
  return grpc::CreateCustomChannel(address, credentials, args);
}

ChannelSecurity worker_security_from_environment() {
  ChannelSecurity security;
  security.ca_pem = env_or_empty(kCaCertificateEnv);
  security.insecure = security.ca_pem.empty();
  security.job_secret = env_or_empty(kJobSecretEnv);
  return security;
}

}  // namespace cohort::tls
