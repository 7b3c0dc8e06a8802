// cohortd's /metrics against the real tools (Debian's prometheus package): a `--role all`
// DaemonServer with http_listen on 127.0.0.1:0 runs a short job while a real Prometheus server,
// started here on a free port with a 1 s scrape interval, scrapes it over TLS (the cluster CA,
// server name cohort-coordinator) with a user's bearer token from a credentials file. Prometheus'
// HTTP API must then show up == 1 and the job among cohort_jobs{state="succeeded"}. `promtool
// check metrics` must pass on the page (also on one with a running job's training gauges), and the
// page refuses requests without a valid token.
// An agent (no users) serves the page only to the scrape token in its http_token_file.

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/agent/free_port.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kPrometheus = "/usr/bin/prometheus";
constexpr const char* kPromtool = "/usr/bin/promtool";
// A command job that reports training metrics (the BUILD rule's data), from the test's runfiles.
constexpr const char* kMetricsJobRunfile = "tests/observability/metrics_job";
// Every wait of this test ends well within this: a hang is a failure, not a stuck CI job.
constexpr auto kTimeout = std::chrono::seconds(30);
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr auto kStopGrace = std::chrono::seconds(5);
constexpr time_t kHttpTimeoutSeconds = 10;
// The worker: runs long enough (3 s) for Prometheus to scrape the job a few times while it runs,
// then succeeds.
constexpr const char* kWorkerScript = "sleep 3; exit 0";

void write_file(const std::string& path, const std::string& text, mode_t mode) {
  std::ofstream(path) << text;
  ASSERT_EQ(::chmod(path.c_str(), mode), 0) << path;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A child process with stdout and stderr in `log`, killed with the test (PR_SET_PDEATHSIG) and
// stopped (TERM, then KILL) by stop().
class ChildProcess {
 public:
  ChildProcess(const std::vector<std::string>& argv, const std::string& log,
               const std::string& stdin_path = "") {
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, 1);
      ::dup2(out, 2);
      if (!stdin_path.empty()) {
        const int in = ::open(stdin_path.c_str(), O_RDONLY);
        ::dup2(in, 0);
      }
      std::vector<char*> args;
      for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      std::perror(args[0]);
      ::_exit(127);
    }
  }
  ~ChildProcess() { stop(); }

  // Waits up to `timeout` for the exit; its status (as waitpid), or -1 if it is still running.
  int wait(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (pid_ > 0) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        return status;
      }
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    if (wait(kStopGrace) != -1) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = 0;
  }
  bool started() const { return pid_ > 0; }

 private:
  pid_t pid_ = -1;
};

class PrometheusScrapeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kPrometheus, X_OK), 0) << kPrometheus << " is missing: run deploy/install-deps.sh";
    ASSERT_EQ(::access(kPromtool, X_OK), 0) << kPromtool << " is missing: run deploy/install-deps.sh";
    DaemonServerOptions options;
    options.role = DaemonRole::kAll;
    options.listen = "127.0.0.1:0";
    options.http_listen = "127.0.0.1:0";
    options.data_dir = dir_.path() + "/data";
    options.tick_interval = std::chrono::milliseconds(50);
    options.node_id = "node-a";
    options.slots = 2;
    options.worker_command = {"/bin/sh", "-c", kWorkerScript};
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    ASSERT_GT(server_->http_port(), 0);
    coordinator_ = cohort::v1::Coordinator::NewStub(
        tls::make_channel(server_->address(), testing::admin_security(options.data_dir)));
    // What Prometheus holds: a (non-admin) user's token and the cluster CA, each in a file.
    StatusOr<std::string> token = server_->security().identities()->add_user("prometheus", /*admin=*/false);
    ASSERT_TRUE(token.ok()) << token.status().to_string();
    token_ = *token;
    token_file_ = dir_.path() + "/scrape.token";
    ca_file_ = dir_.path() + "/ca.crt";
    write_file(token_file_, token_, 0600);
    write_file(ca_file_, server_->security().ca_pem(), 0644);
  }
  void TearDown() override {
    prometheus_.reset();
    if (server_ != nullptr) server_->shutdown();
  }

  httplib::Result get_metrics(const httplib::Headers& headers) {
    httplib::SSLClient client("127.0.0.1", server_->http_port());
    client.set_ca_cert_path(ca_file_.c_str());
    client.enable_server_certificate_verification(true);
    client.set_connection_timeout(kHttpTimeoutSeconds);
    client.set_read_timeout(kHttpTimeoutSeconds);
    return client.Get("/metrics", headers);
  }

  std::string submit(const std::string& name) {
    cohort::v1::SubmitJobRequest request;
    *request.mutable_spec() = coordinator::testing::valid_spec(name, /*nodes=*/1, /*procs_per_node=*/1);
    request.set_wait_for_capacity(true);  // the agent may not have registered yet
    cohort::v1::SubmitJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTimeout);
    grpc::Status status = coordinator_->SubmitJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job_id();
  }

  cohort::v1::JobState job_state(const std::string& id) {
    cohort::v1::GetJobRequest request;
    request.set_job_id(id);
    cohort::v1::GetJobResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kTimeout);
    grpc::Status status = coordinator_->GetJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job().state();
  }

  // The value of an instant query's single sample in Prometheus, or "" while it has none.
  std::string query(int port, const std::string& promql) {
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(kHttpTimeoutSeconds);
    client.set_read_timeout(kHttpTimeoutSeconds);
    httplib::Result result =
        client.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
    if (!result || result->status != 200) return "";
    // {"status":"success","data":{"resultType":"vector","result":[{"metric":{...},"value":[T,"V"]}]}}
    static const std::regex kValue(R"re("value":\[[0-9.]+,"([^"]*)"\])re");
    std::smatch match;
    return std::regex_search(result->body, match, kValue) ? match[1].str() : "";
  }

  // Polls `promql` until its value is `expected`; the last value seen.
  std::string wait_for_query(int port, const std::string& promql, const std::string& expected) {
    const auto deadline = std::chrono::steady_clock::now() + kTimeout;
    std::string value;
    while (std::chrono::steady_clock::now() < deadline) {
      value = query(port, promql);
      if (value == expected) break;
      std::this_thread::sleep_for(kPoll);
    }
    return value;
  }

  TempDir dir_;
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> coordinator_;
  std::string token_;
  std::string token_file_;
  std::string ca_file_;
  std::unique_ptr<ChildProcess> prometheus_;
};

TEST_F(PrometheusScrapeTest, PageNeedsAValidBearerToken) {
  httplib::Result none = get_metrics({});
  ASSERT_TRUE(none) << httplib::to_string(none.error());
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(none->get_header_value("WWW-Authenticate"), "Bearer realm=\"cohort\"");
  EXPECT_EQ(none->body.find("cohort_jobs"), std::string::npos);
  httplib::Result wrong = get_metrics({{"Authorization", "Bearer " + std::string(64, '0')}});
  ASSERT_TRUE(wrong);
  EXPECT_TRUE(wrong->status == 401 || wrong->status == 403) << wrong->status;
  EXPECT_EQ(wrong->body.find("cohort_jobs"), std::string::npos);
  // A revoked user's token stops working at once.
  StatusOr<std::string> other = server_->security().identities()->add_user("gone", false);
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(server_->security().identities()->revoke_user("gone").ok());
  httplib::Result revoked = get_metrics({{"Authorization", "Bearer " + *other}});
  ASSERT_TRUE(revoked);
  EXPECT_EQ(revoked->status, 401);
  httplib::Result ok = get_metrics({{"Authorization", "Bearer " + token_}});
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_EQ(ok->get_header_value("Content-Type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_NE(ok->body.find("cohort_jobs{state=\"pending\"} 0"), std::string::npos) << ok->body;
}

TEST_F(PrometheusScrapeTest, PromtoolAcceptsThePage) {
  // Some traffic first, so every family (RPC histograms, rendezvous-free counters) has samples.
  const std::string id = submit("lint");
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (job_state(id) != cohort::v1::SUCCEEDED && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(kPoll);
  httplib::Result page = get_metrics({{"Authorization", "Bearer " + token_}});
  ASSERT_TRUE(page);
  ASSERT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("cohort_grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"SubmitJob\""),
            std::string::npos)
      << page->body;
  EXPECT_NE(page->body.find("cohort_task_exits_total{reason=\"succeeded\"} 1"), std::string::npos)
      << page->body;
  const std::string page_file = dir_.path() + "/metrics.txt";
  const std::string log = dir_.path() + "/promtool.log";
  write_file(page_file, page->body, 0644);
  ChildProcess promtool({kPromtool, "check", "metrics"}, log, page_file);
  const int status = promtool.wait(kTimeout);
  ASSERT_NE(status, -1) << "promtool did not finish within " << kTimeout.count() << " s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "promtool check metrics failed:\n"
                                                             << read_all(log) << "\npage:\n"
                                                             << page->body;
}

// The training gauges exist only while a job runs and has reported: lint a page that has them.
TEST_F(PrometheusScrapeTest, PromtoolAcceptsARunningJobsTrainingGauges) {
  cohort::v1::SubmitJobRequest request;
  cohort::v1::JobSpec* spec = request.mutable_spec();
  spec->set_name("gauges");
  spec->set_nodes(1);
  spec->set_procs_per_node(1);
  // Reports every 500 ms for longer than this test waits; the server's shutdown stops it.
  for (const std::string& arg : {std::filesystem::absolute(kMetricsJobRunfile).string(), std::string("--steps"),
                                 std::string("120"), std::string("--interval-ms"), std::string("500")})
    spec->add_command(arg);
  request.set_wait_for_capacity(true);
  cohort::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kTimeout);
  grpc::Status submitted = coordinator_->SubmitJob(&context, request, &response);
  ASSERT_TRUE(submitted.ok()) << submitted.error_message();
  const std::string label = "{job=\"" + response.job_id() + "\"}";

  std::string body;
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (std::chrono::steady_clock::now() < deadline) {
    httplib::Result page = get_metrics({{"Authorization", "Bearer " + token_}});
    ASSERT_TRUE(page);
    body = page->body;
    if (body.find("cohort_job_loss" + label) != std::string::npos) break;
    std::this_thread::sleep_for(kPoll);
  }
  for (const char* family : {"cohort_job_step", "cohort_job_loss", "cohort_job_accuracy",
                             "cohort_job_samples_per_second", "cohort_job_comm_wait_seconds_total",
                             "cohort_job_comm_wait_ratio"}) {
    EXPECT_NE(body.find(family + label + " "), std::string::npos) << family << " of the running job:\n" << body;
  }
  const std::string page_file = dir_.path() + "/running.txt";
  const std::string log = dir_.path() + "/promtool-running.log";
  write_file(page_file, body, 0644);
  ChildProcess promtool({kPromtool, "check", "metrics"}, log, page_file);
  const int status = promtool.wait(kTimeout);
  ASSERT_NE(status, -1) << "promtool did not finish within " << kTimeout.count() << " s";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "promtool check metrics failed:\n"
                                                             << read_all(log) << "\npage:\n"
                                                             << body;
}

TEST_F(PrometheusScrapeTest, RealPrometheusScrapesAShortJob) {
  StatusOr<int> port = agent::pick_free_port("127.0.0.1");
  ASSERT_TRUE(port.ok()) << port.status().to_string();
  const std::string config = dir_.path() + "/prometheus.yml";
  write_file(config,
             "global:\n"
             "  scrape_interval: 1s\n"
             "  scrape_timeout: 1s\n"
             "scrape_configs:\n"
             "  - job_name: cohort\n"
             "    scheme: https\n"
             "    authorization:\n"
             "      type: Bearer\n"
             "      credentials_file: " +
                 token_file_ +
                 "\n"
                 "    tls_config:\n"
                 "      ca_file: " +
                 ca_file_ +
                 "\n"
                 "      server_name: cohort-coordinator\n"
                 "    static_configs:\n"
                 "      - targets: ['127.0.0.1:" +
                 std::to_string(server_->http_port()) + "']\n",
             0644);
  const std::string log = dir_.path() + "/prometheus.log";
  prometheus_ = std::make_unique<ChildProcess>(
      std::vector<std::string>{kPrometheus, "--config.file=" + config,
                               "--storage.tsdb.path=" + dir_.path() + "/tsdb",
                               "--web.listen-address=127.0.0.1:" + std::to_string(*port), "--log.level=warn"},
      log);
  ASSERT_TRUE(prometheus_->started());

  // Prometheus is up and scraping before the job starts, so it sees the job run (3 s, scraped
  // every second).
  EXPECT_EQ(wait_for_query(*port, "up{job=\"cohort\"}", "1"), "1") << "Prometheus' log:\n" << read_all(log);
  const std::string id = submit("scraped");
  EXPECT_EQ(wait_for_query(*port, "cohort_jobs{job=\"cohort\",state=\"running\"}", "1"), "1")
      << "Prometheus never saw the job running; its log:\n"
      << read_all(log);
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (job_state(id) != cohort::v1::SUCCEEDED && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(kPoll);
  ASSERT_EQ(job_state(id), cohort::v1::SUCCEEDED);

  EXPECT_EQ(wait_for_query(*port, "cohort_jobs{job=\"cohort\",state=\"succeeded\"}", "1"), "1")
      << "Prometheus' log:\n"
      << read_all(log);
  EXPECT_EQ(wait_for_query(*port, "cohort_task_exits_total{reason=\"succeeded\"}", "1"), "1");
  EXPECT_EQ(wait_for_query(*port, "up{job=\"cohort\"}", "1"), "1");
}

TEST(PrometheusInsecureTest, InsecureDaemonServesPlainHttpWithoutTokens) {
  TempDir dir;
  DaemonServerOptions options;
  options.role = DaemonRole::kCoordinator;
  options.listen = "127.0.0.1:0";
  options.http_listen = "127.0.0.1:0";
  options.data_dir = dir.path();
  options.insecure = true;  // this test's subject: insecure mode serves plain HTTP on loopback
  auto server = DaemonServer::start(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  httplib::Client client("127.0.0.1", (*server)->http_port());
  client.set_read_timeout(kHttpTimeoutSeconds);
  httplib::Result page = client.Get("/metrics");
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("cohort_job_queue_length 0"), std::string::npos) << page->body;
  (*server)->shutdown();

  // Not on a routable address.
  TempDir dir2;
  options.data_dir = dir2.path();
  options.http_listen = "0.0.0.0:0";
  auto refused = DaemonServer::start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("loopback"), std::string::npos) << refused.status().to_string();
}

TEST(PrometheusTokenFileTest, ScrapeTokenFileMustBePrivate) {
  TempDir dir;
  const std::string token_file = dir.path() + "/scrape.token";
  write_file(token_file, "s3cret\n", 0644);
  DaemonServerOptions options;
  options.role = DaemonRole::kCoordinator;
  options.listen = "127.0.0.1:0";
  options.http_listen = "127.0.0.1:0";
  options.http_token_file = token_file;
  options.data_dir = dir.path() + "/data";
  auto refused = DaemonServer::start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("chmod 600"), std::string::npos) << refused.status().to_string();

  // Private: the scrape token is accepted besides users' tokens.
  ASSERT_EQ(::chmod(token_file.c_str(), 0600), 0);
  options.data_dir = dir.path() + "/data2";
  auto server = DaemonServer::start(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  const std::string ca_file = dir.path() + "/ca.crt";
  write_file(ca_file, (*server)->security().ca_pem(), 0644);
  httplib::SSLClient client("127.0.0.1", (*server)->http_port());
  client.set_ca_cert_path(ca_file.c_str());
  client.enable_server_certificate_verification(true);
  client.set_read_timeout(kHttpTimeoutSeconds);
  httplib::Result page = client.Get("/metrics", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  (*server)->shutdown();
}

TEST(PrometheusAgentTest, AgentAcceptsOnlyItsScrapeToken) {
  TempDir dir;
  DaemonServerOptions coordinator_options;
  coordinator_options.role = DaemonRole::kCoordinator;
  coordinator_options.listen = "127.0.0.1:0";
  coordinator_options.data_dir = dir.path() + "/coordinator";
  auto coordinator = DaemonServer::start(coordinator_options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
  auto admin = cohort::v1::Coordinator::NewStub(
      tls::make_channel((*coordinator)->address(), testing::admin_security(coordinator_options.data_dir)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kTimeout);
  cohort::v1::CreateJoinTokenResponse join;
  grpc::Status made = admin->CreateJoinToken(&context, {}, &join);
  ASSERT_TRUE(made.ok()) << made.error_message();

  // An agent has no users: without a scrape token file its HTTPS port would refuse everyone.
  DaemonServerOptions options;
  options.role = DaemonRole::kAgent;
  options.listen = "127.0.0.1:0";
  options.http_listen = "127.0.0.1:0";
  options.data_dir = dir.path() + "/agent";
  options.node_id = "node-a";
  options.coordinator_address = (*coordinator)->address();
  options.join_token = join.token();
  options.worker_command = {"/bin/true"};
  auto refused = DaemonServer::start(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("http_token_file"), std::string::npos)
      << refused.status().to_string();

  // The node joined above; this start loads its certificate and serves with it.
  options.http_token_file = dir.path() + "/scrape.token";
  write_file(options.http_token_file, "agent-scrape-token\n", 0600);
  auto agent = DaemonServer::start(options);
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  const std::string ca_file = dir.path() + "/ca.crt";
  write_file(ca_file, (*coordinator)->security().ca_pem(), 0644);
  StatusOr<std::string> user = (*coordinator)->security().identities()->add_user("alice", false);
  ASSERT_TRUE(user.ok());
  // The agent's certificate names the node, not an address: dial that name on 127.0.0.1.
  const std::string name = security::node_tls_name("node-a");
  httplib::SSLClient client(name, (*agent)->http_port());
  client.set_hostname_addr_map({{name, "127.0.0.1"}});
  client.set_ca_cert_path(ca_file.c_str());
  client.enable_server_certificate_verification(true);
  client.set_read_timeout(kHttpTimeoutSeconds);
  httplib::Result page = client.Get("/metrics", {{"Authorization", "Bearer agent-scrape-token"}});
  ASSERT_TRUE(page) << httplib::to_string(page.error());
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->body.find("cohort_task_exits_total{reason=\"succeeded\"} 0"), std::string::npos)
      << page->body;
  EXPECT_EQ(page->body.find("cohort_jobs{"), std::string::npos) << "an agent has no jobs gauges";
  // Whether its tasks run in cgroups of their own (1) or process groups only (0: no writable
  // cgroup v2, as for a non-root run): shown either way, so an operator can alert on 0.
  const bool contained = page->body.find("\ncohort_agent_task_containment 1") != std::string::npos;
  EXPECT_TRUE(contained || page->body.find("\ncohort_agent_task_containment 0") != std::string::npos)
      << page->body;
  httplib::Result user_token = client.Get("/metrics", {{"Authorization", "Bearer " + *user}});
  ASSERT_TRUE(user_token);
  EXPECT_EQ(user_token->status, 401);
  (*agent)->shutdown();
  (*coordinator)->shutdown();
}

}  // namespace
}  // namespace cohort::daemon
