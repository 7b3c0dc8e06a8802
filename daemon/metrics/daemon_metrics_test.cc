// DaemonMetrics' page: RPC counters and histograms, rendezvous / store operations, task exits, and
// a real Coordinator's state through CoordinatorCollector (jobs by state, the queue and its head's
// wait on a fake clock, nodes and slots, a running job's last report).

#include "daemon/metrics/daemon_metrics.h"

#include <sstream>

#include <gtest/gtest.h>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/metrics/coordinator_collector.h"

namespace cohort::metrics {
namespace {

// The value of the sample written exactly `series` ("name{labels}"); NaN when absent.
double sample(const std::string& page, const std::string& series) {
  std::istringstream lines(page);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(series + " ", 0) == 0) return std::stod(line.substr(series.size() + 1));
  }
  ADD_FAILURE() << "no sample " << series << " in:\n" << page;
  return std::nan("");
}

TEST(DaemonMetricsTest, CountsRpcsByMethodAndCodeWithLatency) {
  DaemonMetrics metrics;
  metrics.record_rpc("/cohort.v1.Coordinator/SubmitJob", "OK", std::chrono::milliseconds(3));
  metrics.record_rpc("/cohort.v1.Coordinator/SubmitJob", "OK", std::chrono::milliseconds(30));
  metrics.record_rpc("/cohort.v1.Coordinator/GetJob", "NOT_FOUND", std::chrono::milliseconds(1));
  const std::string page = metrics.text();
  EXPECT_EQ(sample(page,
                   "cohort_grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"SubmitJob\","
                   "grpc_service=\"cohort.v1.Coordinator\"}"),
            2);
  EXPECT_EQ(sample(page,
                   "cohort_grpc_server_handled_total{grpc_code=\"NOT_FOUND\",grpc_method=\"GetJob\","
                   "grpc_service=\"cohort.v1.Coordinator\"}"),
            1);
  EXPECT_EQ(sample(page,
                   "cohort_grpc_server_handling_seconds_count{grpc_method=\"SubmitJob\","
                   "grpc_service=\"cohort.v1.Coordinator\"}"),
            2);
  EXPECT_EQ(sample(page,
                   "cohort_grpc_server_handling_seconds_bucket{grpc_method=\"SubmitJob\","
                   "grpc_service=\"cohort.v1.Coordinator\",le=\"0.005\"}"),
            1);
  EXPECT_NE(page.find("# TYPE cohort_grpc_server_handling_seconds histogram"), std::string::npos);
  // Only rendezvous calls count as rendezvous operations.
  EXPECT_EQ(page.find("cohort_rendezvous_operations_total{"), std::string::npos) << page;
}

TEST(DaemonMetricsTest, SplitsRendezvousFromStoreOperations) {
  DaemonMetrics metrics;
  metrics.record_rpc("/cohort.v1.Rendezvous/Join", "OK", std::chrono::milliseconds(1));
  metrics.record_rpc("/cohort.v1.Rendezvous/Set", "OK", std::chrono::milliseconds(1));
  metrics.record_rpc("/cohort.v1.Rendezvous/Wait", "DEADLINE_EXCEEDED", std::chrono::seconds(2));
  const std::string page = metrics.text();
  EXPECT_EQ(
      sample(page, "cohort_rendezvous_operations_total{code=\"OK\",kind=\"rendezvous\",operation=\"Join\"}"),
      1);
  EXPECT_EQ(sample(page, "cohort_rendezvous_operations_total{code=\"OK\",kind=\"store\",operation=\"Set\"}"),
            1);
  EXPECT_EQ(sample(page,
                   "cohort_rendezvous_operations_total{code=\"DEADLINE_EXCEEDED\",kind=\"store\","
                   "operation=\"Wait\"}"),
            1);
}

TEST(DaemonMetricsTest, CountsTaskExitsByReasonFromZero) {
  EXPECT_EQ(task_exit_reason(0, 0, false), TaskExitReason::kSucceeded);
  EXPECT_EQ(task_exit_reason(3, 0, false), TaskExitReason::kFailed);
  EXPECT_EQ(task_exit_reason(0, 9, false), TaskExitReason::kKilled);
  EXPECT_EQ(task_exit_reason(0, 15, true), TaskExitReason::kStopped);
  DaemonMetrics metrics;
  EXPECT_EQ(sample(metrics.text(), "cohort_task_exits_total{reason=\"failed\"}"), 0);
  metrics.record_task_exit(TaskExitReason::kFailed);
  metrics.record_task_exit(TaskExitReason::kFailed);
  metrics.record_task_exit(TaskExitReason::kStopped);
  const std::string page = metrics.text();
  EXPECT_EQ(sample(page, "cohort_task_exits_total{reason=\"failed\"}"), 2);
  EXPECT_EQ(sample(page, "cohort_task_exits_total{reason=\"stopped\"}"), 1);
  EXPECT_EQ(sample(page, "cohort_task_exits_total{reason=\"succeeded\"}"), 0);
}

TEST(DaemonMetricsTest, ShowsTheNodeCertificateExpiryOnceSet) {
  DaemonMetrics metrics;
  EXPECT_EQ(metrics.text().find("cohort_node_certificate_expiry_timestamp_seconds "), std::string::npos);
  metrics.set_node_certificate_expiry(1'795'000'000);
  metrics.set_node_certificate_expiry(1'800'000'000);  // renewed
  EXPECT_EQ(sample(metrics.text(), "cohort_node_certificate_expiry_timestamp_seconds"), 1'800'000'000.0);
}

TEST(DaemonMetricsTest, ShowsWhetherTheAgentContainsItsTasksOnceSet) {
  DaemonMetrics metrics;
  EXPECT_EQ(metrics.text().find("cohort_agent_task_containment "), std::string::npos);
  metrics.set_task_containment(false);
  EXPECT_EQ(sample(metrics.text(), "cohort_agent_task_containment"), 0.0);
  metrics.set_task_containment(true);
  EXPECT_EQ(sample(metrics.text(), "cohort_agent_task_containment"), 1.0);
}

TEST(CoordinatorCollectorTest, ShowsJobsQueueNodesAndRunningJobsMetrics) {
  coordinator::testing::TempDir dir;
  coordinator::FakeClock clock;
  coordinator::CoordinatorOptions options;
  options.data_dir = dir.path();
  auto opened = coordinator::Coordinator::open(options, &clock);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  std::unique_ptr<coordinator::Coordinator> coord = std::move(*opened);

  coordinator::NodeInfo node;
  node.node_id = "node-a";
  node.address = "node-a:7071";
  node.hostname = "node-a";
  node.slots = 2;
  ASSERT_TRUE(coord->register_node(node).ok());

  // One job takes one of the two slots and runs; a second, needing both, waits in the queue.
  auto running = coord->submit(coordinator::testing::valid_spec("small", 1, 1));
  ASSERT_TRUE(running.ok()) << running.status().to_string();
  coord->tick();
  auto job = coord->get_job(*running);
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(coord->report_tasks_started("node-a", *running, job->attempt()).ok());
  coordinator::Metrics report;
  report.step = 7;
  report.loss = 0.25;
  report.accuracy = 0.5;
  report.samples_per_s = 1000;
  report.comm_wait_s = 12.5;
  report.comm_wait_ratio = 0.125;
  ASSERT_TRUE(coord->report_metrics(*running, job->attempt(), report).ok());
  auto waiting = coord->submit(coordinator::testing::valid_spec("big", 1, 2));
  ASSERT_TRUE(waiting.ok()) << waiting.status().to_string();
  coord->tick();
  clock.advance(std::chrono::seconds(5));

  DaemonMetrics metrics;
  metrics.add_collectable(std::make_shared<CoordinatorCollector>(coord.get(), &clock));
  const std::string page = metrics.text();
  EXPECT_EQ(sample(page, "cohort_jobs{state=\"running\"}"), 1);
  EXPECT_EQ(sample(page, "cohort_jobs{state=\"pending\"}"), 1);
  EXPECT_EQ(sample(page, "cohort_jobs{state=\"succeeded\"}"), 0);
  EXPECT_EQ(sample(page, "cohort_job_queue_length"), 1);
  EXPECT_EQ(sample(page, "cohort_job_queue_head_wait_seconds"), 5);
  EXPECT_EQ(sample(page, "cohort_nodes{state=\"ready\"}"), 1);
  EXPECT_EQ(sample(page, "cohort_slots"), 2);
  EXPECT_EQ(sample(page, "cohort_free_slots"), 1);
  EXPECT_EQ(sample(page, "cohort_node_free_slots{node=\"node-a\"}"), 1);
  const std::string label = "{job=\"" + *running + "\"}";
  EXPECT_EQ(sample(page, "cohort_job_step" + label), 7);
  EXPECT_EQ(sample(page, "cohort_job_loss" + label), 0.25);
  EXPECT_EQ(sample(page, "cohort_job_accuracy" + label), 0.5);
  EXPECT_EQ(sample(page, "cohort_job_samples_per_second" + label), 1000);
  EXPECT_EQ(sample(page, "cohort_job_comm_wait_seconds_total" + label), 12.5);
  EXPECT_EQ(sample(page, "cohort_job_comm_wait_ratio" + label), 0.125);
  EXPECT_NE(page.find("# TYPE cohort_job_comm_wait_seconds_total counter"), std::string::npos) << page;
  EXPECT_EQ(page.find("job=\"" + *waiting + "\""), std::string::npos)
      << "only running jobs have training gauges";
  coord->shutdown();
}

}  // namespace
}  // namespace cohort::metrics
