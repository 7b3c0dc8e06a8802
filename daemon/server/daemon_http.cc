#include "daemon/server/daemon_http.h"

#include <sys/stat.h>

#include <optional>

#include <grpcpp/grpcpp.h>

#include "cohort/v1/agent.grpc.pb.h"
#include "daemon/http/dashboard.h"
#include "daemon/security/cluster_ca.h"
#include "worker/base/crypto.h"
#include "worker/base/tls.h"

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

// The dashboard's log reader: the last `tail_lines` lines of `rank` of the job's newest attempt,
// from the agent of the node it runs (ran) on, over the coordinator's client certificate.
http::RankLogReader agent_log_reader(const security::DaemonSecurity* security) {
  return [security](const coordinator::Job& job, int rank, int tail_lines) -> StatusOr<std::string> {
    const coordinator::NodeAssignment* node = nullptr;
    for (const coordinator::NodeAssignment& candidate : job.placement.nodes) {
      if (rank >= candidate.first_rank && rank < candidate.first_rank + candidate.num_ranks)
        node = &candidate;
    }
    if (node == nullptr)
      return failed_precondition_error("job {} has no rank {} placed on a node yet", job.id, rank);
    auto agent =
        cohort::v1::Agent::NewStub(tls::make_channel(node->address, security->to_agent(node->node_id)));
    cohort::v1::StreamLogsRequest request;
    request.set_job_id(job.id);
    request.set_rank(rank);
    request.set_tail_lines(tail_lines);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kDashboardLogReadTimeout);
    std::unique_ptr<grpc::ClientReader<cohort::v1::LogChunk>> reader = agent->StreamLogs(&context, request);
    std::string text;
    cohort::v1::LogChunk chunk;
    while (reader->Read(&chunk)) text += chunk.data();
    grpc::Status status = reader->Finish();
    if (!status.ok()) {
      return unavailable_error("rank {}'s log from node {} ({}): {}", rank, node->node_id, node->address,
                               status.error_message());
    }
    return text;
  };
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
    // The same chain the gRPC port presents: the leaf, then the cluster CA. An agent serves the
    // file a renewal replaces (key and chain in one file), read again when it changes.
    http_options.key_pem = security->serving_certificate().key_pem;
    http_options.certificate_pem = security->serving_certificate().certificate_pem + security->ca_pem();
    http_options.key_file = http_options.certificate_file = security->serving_certificate_file();
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
  if (options.coordinator) {
    http::DashboardOptions dashboard;
    dashboard.coordinator = options.coordinator;
    dashboard.clock = options.clock;
    // Insecure mode has no certificates to reach agents with; the logs pane says so.
    if (!security->insecure()) dashboard.read_rank_log = agent_log_reader(security);
    COHORT_RETURN_IF_ERROR(http::register_dashboard(*server, dashboard));
  }
  return server;
}

}  // namespace cohort::daemon
