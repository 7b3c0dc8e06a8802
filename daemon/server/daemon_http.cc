#include "daemon/server/daemon_http.h"

#include <sys/stat.h>

#include <optional>

#include "daemon/security/cluster_ca.h"
#include "worker/base/crypto.h"

namespace cohort::daemon {
namespace {

// The scrape token from `path`: one line, surrounding whitespace dropped, not readable by others.
StatusOr<std::string> read_token_file(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return not_found_error("http_token_file {}: cannot read it; write the scrape token there (mode 0600)",
                           path);
  }
  if ((info.st_mode & 077) != 0) {
    return invalid_argument_error(
        "http_token_file {} is readable by other users (mode {:o}); a bearer token must be private: chmod "
        "600 {}",
        path, info.st_mode & 0777, path);
  }
  COHORT_ASSIGN_OR_RETURN(std::string text, security::read_file(path));
  const size_t begin = text.find_first_not_of(" \t\r\n");
  const size_t end = text.find_last_not_of(" \t\r\n");
  std::string token = begin == std::string::npos ? "" : text.substr(begin, end - begin + 1);
  if (token.empty() || token.size() > kMaxHttpTokenBytes ||
      token.find_first_of(" \t\r\n") != std::string::npos) {
    return invalid_argument_error("http_token_file {} must hold one token (1..{} bytes, no spaces)", path,
                                  kMaxHttpTokenBytes);
  }
  return token;
}

}  // namespace

StatusOr<std::unique_ptr<http::HttpServer>> create_daemon_http(const DaemonHttpOptions& options) {
  if (options.security == nullptr || options.metrics == nullptr)
    return invalid_argument_error(
        "create_daemon_http needs the daemon's security and metrics (a daemon bug)");
  const security::DaemonSecurity* security = options.security;
  http::HttpServerOptions http_options;
  http_options.listen = options.listen;
  http_options.plaintext = security->insecure();
  if (!http_options.plaintext) {
    std::string scrape_token;
    if (!options.token_file.empty()) {
      COHORT_ASSIGN_OR_RETURN(scrape_token, read_token_file(options.token_file));
    }
    const coordinator::IdentityStore* identities = security->identities();
    if (identities == nullptr && scrape_token.empty()) {
      return invalid_argument_error(
          "http_listen {} on an agent needs http_token_file: an agent has no user database, so the token "
          "Prometheus presents must be configured (the same file as its credentials_file, mode 0600)",
          options.listen);
    }
    // The same chain the gRPC port presents: the leaf, then the cluster CA.
    http_options.key_pem = security->serving_certificate().key_pem;
    http_options.certificate_pem = security->serving_certificate().certificate_pem + security->ca_pem();
    http_options.verify_token = [identities,
                                 scrape_token](const std::string& token) -> std::optional<http::HttpCaller> {
      if (!scrape_token.empty() && constant_time_equal(token, scrape_token))
        return http::HttpCaller{"scrape-token", false};
      if (identities != nullptr) {
        if (std::optional<coordinator::User> user = identities->user_by_token(token))
          return http::HttpCaller{user->name, user->admin};
      }
      return std::nullopt;
    };
  }
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<http::HttpServer> server,
                          http::HttpServer::create(std::move(http_options)));
  const metrics::DaemonMetrics* daemon_metrics = options.metrics;
  // Any authenticated caller: the page holds counts, job ids and training progress, no specs or logs.
  server->handle_get("/metrics", http::HttpAccess::kUser, [daemon_metrics](const http::HttpRequest&) {
    return http::HttpResponse{200, metrics::kPrometheusContentType, daemon_metrics->text()};
  });
  return server;
}

}  // namespace cohort::daemon
