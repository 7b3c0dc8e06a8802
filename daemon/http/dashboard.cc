#include "daemon/http/dashboard.h"

#include <algorithm>
#include <charconv>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <spdlog/spdlog.h>

#include "cohort/v1/coordinator.pb.h"
#include "daemon/http/dashboard_assets.h"
#include "daemon/service/coordinator_proto.h"

namespace cohort::http {
namespace {

constexpr const char* kJsonType = "application/json; charset=utf-8";
constexpr const char* kHtmlType = "text/html; charset=utf-8";
constexpr const char* kJsType = "text/javascript; charset=utf-8";
constexpr const char* kCssType = "text/css; charset=utf-8";
// Scripts, styles and requests from this server only; no inline script, no framing.
constexpr const char* kContentSecurityPolicy =
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

std::string to_json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;  // the names `cohort ... -o json` prints
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return "null";
  return json;
}

std::string json_string(const std::string& text) {
  google::protobuf::Value value;
  value.set_string_value(text);
  return to_json(value);
}

HttpResponse page(int status, const char* type, std::string body, bool cacheable = false) {
  HttpResponse response{status, type, std::move(body)};
  response.headers.emplace("Content-Security-Policy", kContentSecurityPolicy);
  response.headers.emplace("X-Content-Type-Options", "nosniff");
  response.headers.emplace("Referrer-Policy", "no-referrer");
  response.headers.emplace("Cache-Control", cacheable ? "max-age=300" : "no-store");
  return response;
}

HttpResponse json(std::string body) { return page(200, kJsonType, std::move(body)); }

HttpResponse json_error(int status, const std::string& message) {
  return page(status, kJsonType, "{\"error\":" + json_string(message) + "}");
}

// The one value of query parameter `name`, or "".
std::string param(const HttpRequest& request, const std::string& name) {
  auto it = request.params.find(name);
  return it == request.params.end() ? "" : it->second;
}

// A non-negative integer parameter; `fallback` when absent; nullopt when malformed.
std::optional<int64_t> int_param(const HttpRequest& request, const std::string& name, int64_t fallback) {
  const std::string text = param(request, name);
  if (text.empty()) return fallback;
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < 0) return std::nullopt;
  return value;
}

bool may_see(const HttpCaller& caller, const coordinator::Job& job) {
  return caller.admin || (!caller.name.empty() && job.owner == caller.name);
}

class Dashboard {
 public:
  explicit Dashboard(const DashboardOptions& options) : options_(options) {
    std::ifstream in(options.chart_js_path, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (in && !text.str().empty()) {
      chart_js_ = text.str();
    } else {
      spdlog::warn(
          "the dashboard's charts need {} (Debian's libjs-chart.js), which cannot be read; pages show "
          "no curves until it is installed: apt-get install libjs-chart.js",
          options.chart_js_path);
    }
  }

  // Registers every route; each handler holds `self`, so the dashboard lives as long as the server.
  static void register_on(HttpServer& server, const std::shared_ptr<const Dashboard>& self) {
    server.handle_get("/", HttpAccess::kPublic, [](const HttpRequest&) {
      HttpResponse response = page(302, "text/plain; charset=utf-8", "see /jobs\n");
      response.headers.emplace("Location", "/jobs");
      return response;
    });
    for (const char* path : {"/login", "/jobs", "/job", "/nodes"}) {
      server.handle_get(path, HttpAccess::kPublic,
                        [](const HttpRequest&) { return page(200, kHtmlType, dashboard_page_html()); });
    }
    server.handle_get("/static/dashboard.js", HttpAccess::kPublic,
                      [](const HttpRequest&) { return page(200, kJsType, dashboard_js(), true); });
    server.handle_get("/static/dashboard.css", HttpAccess::kPublic,
                      [](const HttpRequest&) { return page(200, kCssType, dashboard_css(), true); });
    server.handle_get("/static/chart.js", HttpAccess::kPublic, [self](const HttpRequest&) {
      if (self->chart_js_.empty()) {
        // A script that tells the page why there are no charts (read by dashboard.js).
        return page(200, kJsType,
                    "window.cohortChartMissing = " +
                        json_string(self->options_.chart_js_path +
                                    " is missing on the coordinator: install Debian's libjs-chart.js "
                                    "(apt-get install libjs-chart.js) to see the curves") +
                        ";\n");
      }
      return page(200, kJsType, self->chart_js_, true);
    });

    server.handle_get("/api/whoami", HttpAccess::kUser, [](const HttpRequest& request) {
      return json(fmt::format("{{\"name\":{},\"admin\":{}}}", json_string(request.caller.name),
                              request.caller.admin ? "true" : "false"));
    });
    server.handle_get("/api/jobs", HttpAccess::kUser, [self](const HttpRequest& r) { return self->jobs(r); });
    server.handle_get("/api/job", HttpAccess::kUser, [self](const HttpRequest& r) { return self->job(r); });
    server.handle_get("/api/metrics", HttpAccess::kUser,
                      [self](const HttpRequest& r) { return self->metrics(r); });
    server.handle_get("/api/logs", HttpAccess::kUser, [self](const HttpRequest& r) { return self->logs(r); });
    server.handle_get("/api/nodes", HttpAccess::kUser,
                      [self](const HttpRequest& r) { return self->nodes(r); });
  }

  // The endpoints (called by register_on's handlers).

  // The job named by ?id=, if this caller may see it; otherwise the 404 to answer.
  // The coordinator while this daemon leads; UNAVAILABLE (503) on a standby.
  StatusOr<coordinator::Coordinator*> leader() const {
    coordinator::Coordinator* coordinator = options_.coordinator();
    if (coordinator == nullptr) {
      return unavailable_error(
          "this cohortd is a standby coordinator: open the dashboard of the coordinator that leads (cohort "
          "nodes and the CLI name it)");
    }
    return coordinator;
  }

  StatusOr<coordinator::Job> visible_job(const HttpRequest& request,
                                         const coordinator::Coordinator& source) const {
    const std::string id = param(request, "id");
    if (id.empty()) return invalid_argument_error("give the job as ?id=JOB");
    StatusOr<coordinator::Job> job = source.get_job(id);
    // Another user's job reads exactly like an unknown one.
    if (!job.ok() || !may_see(request.caller, *job)) return not_found_error("no job {:?}", id);
    return job;
  }

  static HttpResponse error_response(const Status& status) {
    const int code = status.code() == StatusCode::kNotFound      ? 404
                     : status.code() == StatusCode::kUnavailable ? 503
                                                                 : 400;
    return json_error(code, std::string(status.message()));
  }

  HttpResponse jobs(const HttpRequest& request) const {
    StatusOr<coordinator::Coordinator*> leading = leader();
    if (!leading.ok()) return error_response(leading.status());
    std::vector<coordinator::Job> all = (*leading)->list_jobs();
    std::string body = fmt::format("{{\"now_unix_ms\":{},\"jobs\":[", options_.clock->unix_millis());
    size_t shown = 0;
    for (auto it = all.rbegin(); it != all.rend() && shown < kDashboardMaxJobs; ++it) {
      if (!may_see(request.caller, *it)) continue;
      cohort::v1::JobRecord record;
      daemon::to_proto(*it, &record);
      record.clear_spec();  // the list needs the name only; specs can be large
      record.mutable_spec()->set_name(it->spec.name());
      body += (shown++ == 0 ? "" : ",") + to_json(record);
    }
    return json(body + "]}");
  }

  HttpResponse job(const HttpRequest& request) const {
    StatusOr<coordinator::Coordinator*> leading = leader();
    if (!leading.ok()) return error_response(leading.status());
    StatusOr<coordinator::Job> job = visible_job(request, **leading);
    if (!job.ok()) return error_response(job.status());
    cohort::v1::JobRecord record;
    daemon::to_proto(*job, &record);
    std::string events = "[";
    StatusOr<std::vector<coordinator::JobEvent>> all =
        (*leading)->events(job->id, /*after_seq=*/0, coordinator::Duration(0));
    if (all.ok()) {
      std::vector<const coordinator::JobEvent*> changes;
      for (const coordinator::JobEvent& event : *all) {
        if (event.kind == coordinator::JobEvent::Kind::kStateChange) changes.push_back(&event);
      }
      const size_t first = changes.size() > kDashboardMaxEvents ? changes.size() - kDashboardMaxEvents : 0;
      for (size_t i = first; i < changes.size(); ++i) {
        cohort::v1::JobEvent event;
        daemon::to_proto(*changes[i], &event);
        events += (i == first ? "" : ",") + to_json(event);
      }
    }
    events += "]";
    return json(fmt::format("{{\"now_unix_ms\":{},\"logs_available\":{},\"job\":{},\"events\":{}}}",
                            options_.clock->unix_millis(), options_.read_rank_log ? "true" : "false",
                            to_json(record), events));
  }

  HttpResponse metrics(const HttpRequest& request) const {
    StatusOr<coordinator::Coordinator*> leading = leader();
    if (!leading.ok()) return error_response(leading.status());
    StatusOr<coordinator::Job> job = visible_job(request, **leading);
    if (!job.ok()) return error_response(job.status());
    std::optional<int64_t> after_seq = int_param(request, "after_seq", 0);
    if (!after_seq) return json_error(400, "after_seq must be a non-negative integer");
    StatusOr<std::vector<coordinator::MetricsRecord>> history =
        (*leading)->metrics_history(job->id, *after_seq, /*attempt=*/0);
    if (!history.ok()) return error_response(history.status());
    cohort::v1::GetMetricsResponse response;
    for (const coordinator::MetricsRecord& record : *history) {
      if (static_cast<size_t>(response.points_size()) >= kDashboardMetricsPage) break;
      cohort::v1::MetricsPoint* point = response.add_points();
      point->set_seq(record.seq);
      point->set_attempt(record.attempt);
      point->mutable_time()->set_seconds(record.unix_ms / 1000);
      point->mutable_time()->set_nanos(static_cast<int32_t>(record.unix_ms % 1000) * 1000000);
      daemon::to_proto(record.metrics, point->mutable_metrics());
    }
    const bool more = history->size() > static_cast<size_t>(response.points_size());
    return json(fmt::format("{{\"more\":{},\"metrics\":{}}}", more ? "true" : "false", to_json(response)));
  }

  HttpResponse logs(const HttpRequest& request) const {
    StatusOr<coordinator::Coordinator*> leading = leader();
    if (!leading.ok()) return error_response(leading.status());
    StatusOr<coordinator::Job> job = visible_job(request, **leading);
    if (!job.ok()) return error_response(job.status());
    if (!options_.read_rank_log) return json_error(404, "this coordinator does not serve logs");
    std::optional<int64_t> rank = int_param(request, "rank", 0);
    if (!rank || *rank >= std::max(1, job->placement.world_size()))
      return json_error(400, fmt::format("rank must be 0..{}", std::max(1, job->placement.world_size()) - 1));
    StatusOr<std::string> text =
        options_.read_rank_log(*job, static_cast<int>(*rank), kDashboardLogTailLines);
    if (!text.ok()) {
      return json(fmt::format("{{\"rank\":{},\"text\":\"\",\"error\":{}}}", *rank,
                              json_string(std::string(text.status().message()))));
    }
    return json(fmt::format("{{\"rank\":{},\"text\":{}}}", *rank, json_string(*text)));
  }

  HttpResponse nodes(const HttpRequest&) const {
    StatusOr<coordinator::Coordinator*> leading = leader();
    if (!leading.ok()) return error_response(leading.status());
    cohort::v1::ListNodesResponse response;
    const coordinator::TimePoint now = options_.clock->now();
    for (const coordinator::NodeStatus& node : (*leading)->list_nodes())
      daemon::to_proto(node, now, response.add_nodes());
    return json(
        fmt::format("{{\"lease_ms\":{},\"nodes\":{}}}", (*leading)->node_lease().count(), to_json(response)));
  }

 private:
  const DashboardOptions options_;
  std::string chart_js_;  // empty when the file is missing
};

}  // namespace

Status register_dashboard(HttpServer& server, const DashboardOptions& options) {
  if (!options.coordinator || options.clock == nullptr)
    return invalid_argument_error("the dashboard needs the coordinator and its clock (a daemon bug)");
  Dashboard::register_on(server, std::make_shared<const Dashboard>(options));
  return ok_status();
}

}  // namespace cohort::http
