#pragma once

// The coordinator's web dashboard, served on its HTTPS port (http_listen) beside /metrics:
//
//   pages (no data in them, so no token: HttpAccess::kPublic)
//     /            → 302 to /jobs
//     /login       the login form: the user pastes their cohort token
//     /jobs        every job the user may see: state, owner, age, progress
//     /job?id=ID   one job: spec, placement, state events, live loss / accuracy / throughput curves,
//                  per-rank logs
//     /nodes       live nodes: slots, GPUs, lease (health)
//     /static/dashboard.js, /static/dashboard.css, /static/chart.js (Debian's libjs-chart.js)
//   JSON, each behind the bearer token (HttpAccess::kUser), cohort.v1 messages in proto JSON
//     /api/whoami, /api/jobs, /api/job?id=ID, /api/metrics?id=ID&after_seq=N,
//     /api/logs?id=ID&rank=R, /api/nodes
//
// Login: the page checks the token against /api/whoami and keeps it in the tab's sessionStorage;
// the scripts send it as `Authorization: Bearer` on every /api call, so the JSON endpoints use the
// same token check as /metrics and the gRPC port. A header (unlike a cookie) is never attached by
// the browser on its own, so another site cannot make requests with it (no CSRF); the token is
// never in a URL; it is gone when the tab closes. Every page sets a Content-Security-Policy that
// allows scripts from this server only, and the scripts write data with textContent, never as HTML.
//
// Visibility is decided here, on the server: a user sees their own jobs, an admin every job. A
// user asking for another user's job gets 404, as for a job that does not exist (existence is not
// disclosed). Nodes are visible to every user (as `cohort nodes`).
//
//   DashboardOptions options;
//   options.coordinator = [&] { return coordinator.get(); };
//   options.read_rank_log = [&](const coordinator::Job& job, int rank, int lines) { ... };
//   COHORT_RETURN_IF_ERROR(register_dashboard(*server, options));   // before server->start()
//
// Thread-safety: handlers run on the HTTP server's threads; they call the Coordinator's
// thread-safe methods, `coordinator` and `read_rank_log`, which must be thread-safe too.

#include <functional>
#include <string>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/http/http_server.h"
#include "worker/base/status.h"

namespace cohort::http {

// Debian's Chart.js (libjs-chart.js), the UMD build that defines window.Chart.
inline constexpr const char* kDefaultChartJsPath = "/usr/share/javascript/chart.js/chart.min.js";
// The last this many lines of each rank's output are shown on the job page.
inline constexpr int kDashboardLogTailLines = 200;
// The jobs page lists at most this many jobs, newest first.
inline constexpr size_t kDashboardMaxJobs = 500;
// The job page lists at most this many state events, newest last.
inline constexpr size_t kDashboardMaxEvents = 200;
// Metric points per /api/metrics answer; the page asks again from the last one it got.
inline constexpr size_t kDashboardMetricsPage = 2000;

// The newest attempt's output of one rank of `job`: its last `tail_lines` lines (stdout and
// stderr as written). NOT_FOUND / UNAVAILABLE when its node cannot answer. Must be thread-safe and
// bounded in time.
using RankLogReader =
    std::function<StatusOr<std::string>(const coordinator::Job& job, int rank, int tail_lines)>;

// The coordinator whose jobs and nodes are shown, while this daemon leads the cluster; null on a
// standby (high availability), whose /api endpoints then answer 503 naming the situation. Called
// on every request: thread-safe and quick. The coordinator returned outlives the request.
using CoordinatorSource = std::function<coordinator::Coordinator*()>;

struct DashboardOptions {
  CoordinatorSource coordinator;                    // required
  const coordinator::Clock* clock = nullptr;        // for node leases and job ages; not owned, required
  RankLogReader read_rank_log;                      // per-rank logs; empty: the page says they are off
  std::string chart_js_path = kDefaultChartJsPath;  // read once, here
};

// Registers the dashboard's pages and endpoints on `server` (before its start()). Chart.js is read
// from options.chart_js_path now: when it is missing the dashboard still works without curves,
// every page says which file is missing and how to install it, and a warning is logged.
// INVALID_ARGUMENT when the coordinator or clock is missing.
Status register_dashboard(HttpServer& server, const DashboardOptions& options);

}  // namespace cohort::http
