// The dashboard's pages and JSON endpoints over a real HTTPS server on 127.0.0.1:0 (a cluster CA's
// certificate, bearer tokens) backed by a real Coordinator (SQLite in a temp dir, fake clock):
// pages are public and hold no data; every /api endpoint needs a token; a user sees only their own
// jobs (another user's job is 404, like an unknown one); an admin sees all; metrics come in
// pages after a seq; a missing Chart.js is reported, not fatal.

#include "daemon/http/dashboard.h"

#include <atomic>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/security/cluster_ca.h"

namespace cohort::http {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kAliceToken = "alice-token";
constexpr const char* kBobToken = "bob-token";
constexpr const char* kAdminToken = "admin-token";
constexpr time_t kClientTimeoutSeconds = 10;

std::optional<HttpCaller> verify(const std::string& token) {
  if (token == kAliceToken) return HttpCaller{"alice", false};
  if (token == kBobToken) return HttpCaller{"bob", false};
  if (token == kAdminToken) return HttpCaller{"root", true};
  return std::nullopt;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class DashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    coordinator::CoordinatorOptions coordinator_options;
    coordinator_options.data_dir = dir_.path() + "/data";
    auto coordinator = coordinator::Coordinator::open(coordinator_options, &clock_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    coordinator_ = std::move(*coordinator);

    StatusOr<security::ClusterCa> ca = security::ClusterCa::load_or_create(dir_.path() + "/ca");
    ASSERT_TRUE(ca.ok()) << ca.status().to_string();
    StatusOr<security::KeyAndCertificate> issued =
        ca->issue("cohort-coordinator", {"cohort-coordinator"}, {"127.0.0.1"});
    ASSERT_TRUE(issued.ok()) << issued.status().to_string();
    ca_file_ = dir_.path() + "/ca.pem";
    std::ofstream(ca_file_) << ca->certificate_pem();
    chart_file_ = dir_.path() + "/chart.min.js";
    std::ofstream(chart_file_) << "window.Chart = function() {};\n";

    HttpServerOptions options;
    options.listen = "127.0.0.1:0";
    options.key_pem = issued->key_pem;
    options.certificate_pem = issued->certificate_pem;
    options.verify_token = verify;
    StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::create(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    DashboardOptions dashboard;
    dashboard.coordinator = [this]() -> coordinator::Coordinator* {
      return leading_ ? coordinator_.get() : nullptr;
    };
    dashboard.clock = &clock_;
    dashboard.chart_js_path = chart_file_;
    dashboard.read_rank_log = [](const coordinator::Job& job, int rank, int lines) -> StatusOr<std::string> {
      return fmt::format("log of {} rank {} (last {} lines)\n", job.id, rank, lines);
    };
    ASSERT_TRUE(register_dashboard(*server_, dashboard).ok());
    ASSERT_TRUE(server_->start().ok());
  }

  httplib::Result get(const std::string& path, const std::string& token = "") {
    httplib::SSLClient client("127.0.0.1", server_->port());
    client.set_ca_cert_path(ca_file_.c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(kClientTimeoutSeconds);
    client.set_read_timeout(kClientTimeoutSeconds);
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client.Get(path, headers);
  }

  std::string submit(const std::string& name, const std::string& owner) {
    StatusOr<std::string> id = coordinator_->submit(coordinator::testing::valid_spec(name), owner);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    return id.value_or("");
  }

  TempDir dir_;
  coordinator::FakeClock clock_;
  std::unique_ptr<coordinator::Coordinator> coordinator_;
  std::atomic<bool> leading_{true};  // false: this daemon is a standby
  std::unique_ptr<HttpServer> server_;
  std::string ca_file_;
  std::string chart_file_;
};

TEST_F(DashboardTest, PagesArePublicAndCarryNoData) {
  const std::string id = submit("secret-name", "alice");
  for (const std::string& path : std::vector<std::string>{"/login", "/jobs", "/job?id=" + id, "/nodes"}) {
    httplib::Result page = get(path);
    ASSERT_TRUE(page) << path << ": " << httplib::to_string(page.error());
    EXPECT_EQ(page->status, 200) << path;
    EXPECT_EQ(page->get_header_value("Content-Type"), "text/html; charset=utf-8");
    EXPECT_TRUE(contains(page->get_header_value("Content-Security-Policy"), "script-src 'self'"));
    EXPECT_FALSE(contains(page->body, "secret-name")) << path;
    EXPECT_TRUE(contains(page->body, "/static/dashboard.js")) << path;
  }
  httplib::Result root = get("/");
  ASSERT_TRUE(root);
  EXPECT_EQ(root->status, 302);
  EXPECT_EQ(root->get_header_value("Location"), "/jobs");
  httplib::Result script = get("/static/dashboard.js");
  ASSERT_TRUE(script);
  EXPECT_EQ(script->status, 200);
  EXPECT_TRUE(contains(script->body, "sessionStorage")) << "the token lives in the tab's sessionStorage";
  httplib::Result chart = get("/static/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->body, "window.Chart = function() {};\n");
}

TEST_F(DashboardTest, EveryApiNeedsAToken) {
  const std::string id = submit("mlp", "alice");
  for (const std::string& path :
       std::vector<std::string>{"/api/whoami", "/api/jobs", "/api/job?id=" + id, "/api/metrics?id=" + id,
                                "/api/logs?id=" + id, "/api/nodes"}) {
    httplib::Result none = get(path);
    ASSERT_TRUE(none) << path;
    EXPECT_EQ(none->status, 401) << path;
    EXPECT_FALSE(contains(none->body, id)) << path;
    httplib::Result wrong = get(path, "not-a-token");
    ASSERT_TRUE(wrong) << path;
    EXPECT_EQ(wrong->status, 401) << path;
  }
  httplib::Result me = get("/api/whoami", kAliceToken);
  ASSERT_TRUE(me);
  EXPECT_EQ(me->status, 200);
  EXPECT_EQ(me->body, R"({"name":"alice","admin":false})");
}

TEST_F(DashboardTest, UsersSeeOnlyTheirOwnJobsAndAdminsSeeAll) {
  const std::string alices = submit("alices", "alice");
  const std::string bobs = submit("bobs", "bob");

  httplib::Result alice = get("/api/jobs", kAliceToken);
  ASSERT_TRUE(alice);
  ASSERT_EQ(alice->status, 200);
  EXPECT_TRUE(contains(alice->body, "\"id\":\"" + alices + "\"")) << alice->body;
  EXPECT_FALSE(contains(alice->body, bobs)) << alice->body;
  EXPECT_TRUE(contains(alice->body, "\"state\":\"PENDING\"")) << alice->body;
  EXPECT_TRUE(contains(alice->body, "\"owner\":\"alice\"")) << alice->body;

  httplib::Result admin = get("/api/jobs", kAdminToken);
  ASSERT_TRUE(admin);
  EXPECT_TRUE(contains(admin->body, alices) && contains(admin->body, bobs)) << admin->body;

  // Another user's job reads like an unknown one, on every job endpoint.
  for (const std::string& path : std::vector<std::string>{
           "/api/job?id=" + alices, "/api/metrics?id=" + alices, "/api/logs?id=" + alices + "&rank=0"}) {
    httplib::Result other = get(path, kBobToken);
    ASSERT_TRUE(other) << path;
    EXPECT_EQ(other->status, 404) << path;
    EXPECT_EQ(other->body, "{\"error\":\"no job \\\"" + alices + "\\\"\"}") << path;
    httplib::Result unknown = get("/api/job?id=nope-9", kBobToken);
    ASSERT_TRUE(unknown);
    EXPECT_EQ(unknown->status, 404);
  }
  httplib::Result own = get("/api/job?id=" + alices, kAliceToken);
  ASSERT_TRUE(own);
  EXPECT_EQ(own->status, 200);
  EXPECT_TRUE(contains(own->body, "\"name\":\"alices\"")) << own->body;  // the spec
  EXPECT_TRUE(contains(own->body, "\"events\":[{")) << own->body;        // the submission event
  EXPECT_EQ(get("/api/job?id=" + alices, kAdminToken)->status, 200);
}

TEST_F(DashboardTest, MetricsComeAfterASeqAndLogsPerRank) {
  coordinator::NodeInfo node;
  node.node_id = "node-a";
  node.address = "node-a:7071";
  node.hostname = "node-a";
  node.slots = 2;
  ASSERT_TRUE(coordinator_->register_node(node).ok());
  const std::string id = submit("mlp", "alice");
  ASSERT_EQ(coordinator_->tick().launches.size(), 1u);
  ASSERT_TRUE(coordinator_->report_tasks_started("node-a", id, 1).ok());
  for (int step = 1; step <= 3; ++step) {
    clock_.advance(coordinator::Duration(1000));
    ASSERT_TRUE(
        coordinator_->report_metrics(id, 1, coordinator::Metrics{step * 10, 0, 1.0 / step, 0.5, 100, 0, 0, 0, 0,
                                                                 1.5 * step, 0.125 * step})
            .ok());
  }
  httplib::Result all = get("/api/metrics?id=" + id, kAliceToken);
  ASSERT_TRUE(all);
  ASSERT_EQ(all->status, 200);
  EXPECT_TRUE(contains(all->body, "\"more\":false")) << all->body;
  EXPECT_TRUE(contains(all->body, "\"step\":\"30\"")) << all->body;
  // The communication wait rides along in every point (the job page plots comm_wait_ratio).
  EXPECT_TRUE(contains(all->body, "\"comm_wait_s\":4.5")) << all->body;
  EXPECT_TRUE(contains(all->body, "\"comm_wait_ratio\":0.375")) << all->body;
  size_t points = 0;
  for (size_t at = all->body.find("\"seq\""); at != std::string::npos; at = all->body.find("\"seq\"", at + 1))
    ++points;
  EXPECT_EQ(points, 3u) << all->body;

  StatusOr<std::vector<coordinator::MetricsRecord>> history = coordinator_->metrics_history(id, 0, 0);
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 3u);
  httplib::Result rest =
      get("/api/metrics?id=" + id + "&after_seq=" + std::to_string((*history)[1].seq), kAliceToken);
  ASSERT_TRUE(rest);
  EXPECT_TRUE(contains(rest->body, "\"step\":\"30\"")) << rest->body;
  EXPECT_FALSE(contains(rest->body, "\"step\":\"20\"")) << rest->body;
  EXPECT_EQ(get("/api/metrics?id=" + id + "&after_seq=-1", kAliceToken)->status, 400);

  httplib::Result log = get("/api/logs?id=" + id + "&rank=0", kAliceToken);
  ASSERT_TRUE(log);
  EXPECT_EQ(log->status, 200);
  EXPECT_TRUE(contains(log->body, "log of " + id + " rank 0 (last 200 lines)")) << log->body;
  EXPECT_EQ(get("/api/logs?id=" + id + "&rank=7", kAliceToken)->status, 400);

  httplib::Result nodes = get("/api/nodes", kBobToken);
  ASSERT_TRUE(nodes);
  EXPECT_EQ(nodes->status, 200);
  EXPECT_TRUE(contains(nodes->body, "\"node_id\":\"node-a\"")) << nodes->body;
  EXPECT_TRUE(contains(nodes->body, "\"slots\":2")) << nodes->body;
}

TEST_F(DashboardTest, AStandbyServesPagesButNoData) {
  submit("mlp", "alice");
  leading_ = false;
  for (const std::string& path : std::vector<std::string>{"/api/jobs", "/api/job?id=mlp-1", "/api/nodes"}) {
    httplib::Result answer = get(path, kAdminToken);
    ASSERT_TRUE(answer) << path;
    EXPECT_EQ(answer->status, 503) << path;
    EXPECT_TRUE(contains(answer->body, "standby coordinator")) << answer->body;
  }
  EXPECT_EQ(get("/jobs")->status, 200);
  leading_ = true;
  EXPECT_EQ(get("/api/jobs", kAdminToken)->status, 200);
}

TEST(DashboardChartTest, MissingChartJsIsReportedNotFatal) {
  TempDir dir;
  coordinator::FakeClock clock;
  coordinator::CoordinatorOptions coordinator_options;
  coordinator_options.data_dir = dir.path();
  auto coordinator = coordinator::Coordinator::open(coordinator_options, &clock);
  ASSERT_TRUE(coordinator.ok());
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  options.plaintext = true;  // loopback only; this test is about the missing file
  auto server = HttpServer::create(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  DashboardOptions dashboard;
  dashboard.coordinator = [&coordinator] { return coordinator->get(); };
  dashboard.clock = &clock;
  dashboard.chart_js_path = dir.path() + "/no-chart.js";
  ASSERT_TRUE(register_dashboard(**server, dashboard).ok());
  ASSERT_TRUE((*server)->start().ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(kClientTimeoutSeconds);
  httplib::Result chart = client.Get("/static/chart.js");
  ASSERT_TRUE(chart);
  EXPECT_EQ(chart->status, 200);
  EXPECT_TRUE(contains(chart->body, "cohortChartMissing")) << chart->body;
  EXPECT_TRUE(contains(chart->body, "no-chart.js is missing on the coordinator")) << chart->body;
  EXPECT_TRUE(contains(chart->body, "apt-get install libjs-chart.js")) << chart->body;

  DashboardOptions incomplete;
  EXPECT_FALSE(register_dashboard(**server, incomplete).ok());
}

}  // namespace
}  // namespace cohort::http
