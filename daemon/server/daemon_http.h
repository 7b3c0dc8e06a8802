#pragma once

// cohortd's HTTPS port (http_listen) wired to the daemon: TLS with the certificate the gRPC port
// serves with, bearer tokens checked against the coordinator's users, /metrics, and on a
// coordinator the web dashboard (daemon/http/dashboard.h), whose per-rank logs are read from the
// agents over gRPC (Agent.StreamLogs, as `cohort logs` reads them through the coordinator).
//
// Tokens accepted:
//   - coordinator (roles coordinator, all): any cohort user's token, from the IdentityStore, as the
//     gRPC Authenticator checks it (`cohort user add prometheus` makes one for a scraper);
//   - any role: the token in http_token_file, when set. An agent has no user database, so this is
//     how it is scraped: the operator puts one scrape token on every node (mode 0600) and in
//     Prometheus' `authorization.credentials_file`.
// An agent with http_listen but no http_token_file in secure mode is a configuration error.
// Insecure mode: plain HTTP without tokens, loopback addresses only (as the gRPC port).
//
//   DaemonHttpOptions options{listen, token_file, &security, &metrics};
//   COHORT_ASSIGN_OR_RETURN(auto http, create_daemon_http(options));   // binds
//   COHORT_RETURN_IF_ERROR(http->start());

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/http/http_server.h"
#include "daemon/metrics/daemon_metrics.h"
#include "daemon/security/daemon_security.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// The longest token http_token_file may hold (cohort's tokens are 64 hex digits).
inline constexpr size_t kMaxHttpTokenBytes = 4096;
// How long the dashboard waits for an agent's answer when it shows a rank's log.
inline constexpr std::chrono::seconds kDashboardLogReadTimeout{5};

struct DaemonHttpOptions {
  std::string listen;                                  // http_listen: HOST:PORT (port 0: any free one)
  std::string token_file;                              // http_token_file: a scrape token; empty: none
  const security::DaemonSecurity* security = nullptr;  // TLS material and users; not owned
  const metrics::DaemonMetrics* metrics = nullptr;     // what /metrics shows; not owned
  // On a coordinator: the dashboard's jobs and nodes while this daemon leads (null on a standby);
  // empty on an agent: no dashboard. See http::CoordinatorSource.
  std::function<coordinator::Coordinator*()> coordinator;
  const coordinator::Clock* clock = nullptr;  // the coordinator's clock; not owned
};

// The daemon's HTTPS server with /metrics registered, bound but not started. INVALID_ARGUMENT
// naming the setting for a bad address or token file; UNAVAILABLE when the port cannot be bound.
// `security` and `metrics` must outlive the server.
StatusOr<std::unique_ptr<http::HttpServer>> create_daemon_http(const DaemonHttpOptions& options);

}  // namespace cohort::daemon
