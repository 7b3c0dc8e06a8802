#include "worker/train/report_metrics.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "worker/train/metrics_reporter.h"
#include "worker/train/recording_coordinator.h"

namespace cohort {
namespace {

using train::testing::RecordingServer;

// The environment cohortd's agent gives a rank, pointing at `server` (plaintext: no CA).
void set_job_environment(const RecordingServer& server, const char* rank) {
  setenv("COHORT_COORDINATOR", server.address().c_str(), 1);
  setenv("COHORT_JOB_ID", "train-7", 1);
  setenv("COHORT_ATTEMPT", "3", 1);
  setenv("RANK", rank, 1);
  unsetenv("COHORT_CA_CERTIFICATE");
}

class ReportMetricsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    train::reset_report_metrics_for_testing();
    for (const char* name : {"COHORT_COORDINATOR", "COHORT_JOB_ID", "COHORT_ATTEMPT", "RANK"}) unsetenv(name);
  }
};

TEST_F(ReportMetricsTest, RankZeroReachesTheCoordinatorWithTheJobAndAttempt) {
  RecordingServer server;
  ASSERT_GT(server.port, 0);
  set_job_environment(server, "0");
  train::reset_report_metrics_for_testing();
  ASSERT_TRUE(metrics_reporting_enabled());

  const auto start = std::chrono::steady_clock::now();
  for (int64_t step = 1; step <= 1000; ++step) report_metrics({{"loss", 1.0 / step}}, step);
  // A thousand calls do not wait on the network (each only queues).
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  report_metrics({{"loss", 0.25}, {"accuracy", 0.75}, {"epoch", 0}}, 1000, /*epoch_end=*/true);
  ASSERT_TRUE(flush_metrics(std::chrono::seconds(10)));

  std::vector<v1::ReportMetricsRequest> requests = server.service.recorded();
  ASSERT_FALSE(requests.empty());
  // Rate-limited: far fewer sends than calls; the epoch end is the last and is never dropped.
  EXPECT_LT(requests.size(), 10u);
  for (const auto& request : requests) {
    EXPECT_EQ(request.job_id(), "train-7");
    EXPECT_EQ(request.attempt(), 3);
    EXPECT_EQ(request.metrics().rank(), 0);
  }
  const v1::Metrics& last = requests.back().metrics();
  EXPECT_EQ(last.step(), 1000);
  EXPECT_DOUBLE_EQ(last.loss(), 0.25);
  EXPECT_DOUBLE_EQ(last.accuracy(), 0.75);
}

TEST_F(ReportMetricsTest, OtherRanksSendNothing) {
  RecordingServer server;
  ASSERT_GT(server.port, 0);
  set_job_environment(server, "1");
  train::reset_report_metrics_for_testing();
  EXPECT_FALSE(metrics_reporting_enabled());
  report_metrics({{"loss", 0.5}}, 1, /*epoch_end=*/true);
  EXPECT_TRUE(flush_metrics(std::chrono::seconds(1)));
  EXPECT_TRUE(server.service.recorded().empty());
}

TEST_F(ReportMetricsTest, WithoutCohortdItIsANoOp) {
  unsetenv("COHORT_COORDINATOR");
  setenv("COHORT_JOB_ID", "train-7", 1);
  train::reset_report_metrics_for_testing();
  EXPECT_FALSE(metrics_reporting_enabled());
  const auto start = std::chrono::steady_clock::now();
  report_metrics({{"loss", 0.5}}, 1, /*epoch_end=*/true);
  EXPECT_TRUE(flush_metrics(std::chrono::seconds(5)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(100));
}

// Held reports go out at exit without a flush_metrics() call: a child process
// (report_metrics_exit_helper) reports twice and returns from main.
TEST_F(ReportMetricsTest, HeldReportsAreSentAtExit) {
  RecordingServer server;
  ASSERT_GT(server.port, 0);
  set_job_environment(server, "0");
  const char* helper = std::getenv("REPORT_METRICS_EXIT_HELPER");
  ASSERT_NE(helper, nullptr) << "the BUILD rule sets REPORT_METRICS_EXIT_HELPER";
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(helper, helper, static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  std::vector<v1::ReportMetricsRequest> requests = server.service.recorded();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests.back().metrics().step(), 2);  // the held one
  EXPECT_DOUBLE_EQ(requests.back().metrics().loss(), 1.0);
}

// A flush on one thread while the reporter is dropped on another (a test's reset here; the atexit
// handler in a program whose other thread flushes): the flush holds its own reference, so the
// reporter outlives it. The coordinator is a socket that accepts connections but never answers,
// so the send (and the flush waiting for it) lasts until the RPC deadline.
TEST_F(ReportMetricsTest, AFlushInFlightSurvivesTheReporterBeingDropped) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  ASSERT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string coordinator = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  setenv("COHORT_COORDINATOR", coordinator.c_str(), 1);
  setenv("COHORT_JOB_ID", "train-7", 1);
  setenv("RANK", "0", 1);
  train::reset_report_metrics_for_testing();
  ASSERT_TRUE(metrics_reporting_enabled());
  report_metrics({{"loss", 0.5}}, 1, /*epoch_end=*/true);

  const auto start = std::chrono::steady_clock::now();
  std::thread flusher([] { flush_metrics(std::chrono::seconds(20)); });
  // Let the flush take its reference and start waiting (if it has not yet, the reset below only
  // makes it a no-op: the test cannot fail spuriously).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  train::reset_report_metrics_for_testing();  // drops the process's reference mid-flush
  flusher.join();
  // The flush ended with the send (RPC deadline), not its own 20 s limit.
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            train::kDefaultMetricsRpcTimeout + std::chrono::seconds(5));
  close(listener);
}

}  // namespace
}  // namespace cohort
