#include "worker/train/metrics_reporter.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <utility>
#include <string>
#include <thread>
#include <vector>

#include "worker/train/recording_coordinator.h"

namespace cohort::train {
namespace {

using testing::RecordingCoordinator;
using testing::RecordingServer;

v1::Metrics at_step(int64_t step) {
  v1::Metrics metrics;
  metrics.set_step(step);
  return metrics;
}

TEST(MetricsReporterTest, DeliversEpochEndsAndRateLimitsTheRest) {
  RecordingServer recording;
  ASSERT_GT(recording.port, 0);
  RecordingCoordinator& service = recording.service;

  MetricsReporterOptions options;
  options.coordinator = "127.0.0.1:" + std::to_string(recording.port);
  options.job_id = "mnist-3";
  options.attempt = 2;
  options.min_interval = std::chrono::seconds(60);  // only the first mid-epoch report gets through
  {
    MetricsReporter reporter(options);
    for (int step = 1; step <= 10; ++step) reporter.report(at_step(step), /*epoch_end=*/false);
    reporter.report(at_step(10), /*epoch_end=*/true);
    reporter.report(at_step(20), /*epoch_end=*/true);
  }  // the destructor sends what is queued
  recording.server->Shutdown();

  std::lock_guard<std::mutex> lock(service.mutex);
  std::vector<int64_t> steps;
  for (const auto& request : service.requests) {
    EXPECT_EQ(request.job_id(), "mnist-3");
    EXPECT_EQ(request.attempt(), 2);
    steps.push_back(request.metrics().step());
  }
  // Step 1 may be superseded by the epoch end that follows it before the thread sends it.
  if (steps.size() == 3) {
    EXPECT_EQ(steps, (std::vector<int64_t>{1, 10, 20}));
  } else {
    EXPECT_EQ(steps, (std::vector<int64_t>{10, 20}));
  }
}

// Within the interval the newest report replaces the held one and is sent once it passes; none is
// dropped in favour of an older one.
TEST(MetricsReporterTest, TheNewestRateLimitedReportWins) {
  RecordingServer recording;
  ASSERT_GT(recording.port, 0);
  RecordingCoordinator& service = recording.service;

  MetricsReporterOptions options;
  options.coordinator = "127.0.0.1:" + std::to_string(recording.port);
  options.job_id = "mnist-4";
  options.min_interval = std::chrono::milliseconds(300);
  {
    MetricsReporter reporter(options);
    reporter.report(at_step(1), /*epoch_end=*/false);
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (reporter.sent() < 1 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    for (int step = 2; step <= 5; ++step) reporter.report(at_step(step), /*epoch_end=*/false);
    // Sent after the interval, not only by the destructor.
    while (reporter.sent() < 2 && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(reporter.sent(), 2);
  }
  recording.server->Shutdown();

  std::lock_guard<std::mutex> lock(service.mutex);
  std::vector<int64_t> steps;
  for (const auto& request : service.requests) steps.push_back(request.metrics().step());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 5}));
}

TEST(MetricsReporterTest, AnUnreachableCoordinatorIsNotFatalAndDoesNotHoldUpExit) {
  MetricsReporterOptions options;
  options.coordinator = "127.0.0.1:1";  // nothing listens on port 1
  options.job_id = "job-1";
  options.rpc_timeout = std::chrono::milliseconds(300);
  auto start = std::chrono::steady_clock::now();
  int64_t failed = 0;
  {
    MetricsReporter reporter(options);
    for (int epoch = 0; epoch < 20; ++epoch) reporter.report(at_step(epoch), /*epoch_end=*/true);
    // Let the first call fail, then the destructor drops the rest.
    while (reporter.failed() == 0 && std::chrono::steady_clock::now() - start < std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    failed = reporter.failed();
    EXPECT_EQ(reporter.sent(), 0);
  }
  EXPECT_GE(failed, 1);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// flush() sends a report the rate limit holds back now, not after the interval.
TEST(MetricsReporterTest, FlushWaivesTheRateLimit) {
  RecordingServer recording;
  ASSERT_GT(recording.port, 0);
  MetricsReporterOptions options;
  options.coordinator = recording.address();
  options.job_id = "mnist-5";
  options.min_interval = std::chrono::seconds(60);
  MetricsReporter reporter(options);
  EXPECT_TRUE(reporter.flush(std::chrono::milliseconds(10)));  // nothing held: at once
  reporter.report(at_step(1), /*epoch_end=*/false);
  ASSERT_TRUE(reporter.flush(std::chrono::seconds(5)));
  reporter.report(at_step(2), /*epoch_end=*/false);  // within the 60 s interval
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(reporter.flush(std::chrono::seconds(5)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(reporter.sent(), 2);
  std::vector<int64_t> steps;
  for (const auto& request : recording.service.recorded()) steps.push_back(request.metrics().step());
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 2}));
}

TEST(MetricsReporterTest, FlushGivesUpAtItsTimeoutWhenTheCoordinatorIsUnreachable) {
  MetricsReporterOptions options;
  options.coordinator = "127.0.0.1:1";  // nothing listens on port 1
  options.job_id = "job-2";
  options.rpc_timeout = std::chrono::milliseconds(2000);
  MetricsReporter reporter(options);
  for (int epoch = 0; epoch < 5; ++epoch) reporter.report(at_step(epoch), /*epoch_end=*/true);
  const auto start = std::chrono::steady_clock::now();
  reporter.flush(std::chrono::milliseconds(300));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
}

TEST(MetricsReporterTest, ValuesMapOntoTheMetricsFields) {
  std::vector<std::string> unknown;
  v1::Metrics metrics = metrics_from_values(
      {{"loss", 0.5}, {"accuracy", 0.875}, {"epoch", 2}, {"samples_per_s", 1000}, {"total_steps", 300},
       {"total_epochs", 3}, {"samples_per_step", 256}, {"comm_wait_s", 4.5}, {"comm_wait_ratio", 0.25},
       {"learning_rate", 0.1}},
      42, 0, &unknown);
  EXPECT_EQ(metrics.step(), 42);
  EXPECT_EQ(metrics.rank(), 0);
  EXPECT_DOUBLE_EQ(metrics.loss(), 0.5);
  EXPECT_DOUBLE_EQ(metrics.accuracy(), 0.875);
  EXPECT_EQ(metrics.epoch(), 2);
  EXPECT_DOUBLE_EQ(metrics.samples_per_s(), 1000);
  EXPECT_EQ(metrics.total_steps(), 300);
  EXPECT_EQ(metrics.total_epochs(), 3);
  EXPECT_EQ(metrics.samples_per_step(), 256);
  EXPECT_DOUBLE_EQ(metrics.comm_wait_s(), 4.5);
  EXPECT_DOUBLE_EQ(metrics.comm_wait_ratio(), 0.25);
  EXPECT_EQ(unknown, (std::vector<std::string>{"learning_rate"}));
  // A user's NaN or huge value does not overflow an integer field.
  v1::Metrics odd = metrics_from_values({{"epoch", std::nan("")}, {"total_steps", 1e300}}, 1, 0, nullptr);
  EXPECT_EQ(odd.epoch(), 0);
  EXPECT_EQ(odd.total_steps(), INT64_MAX);
}

TEST(MetricsReporterTest, FromEnvironmentNeedsCoordinatorAndJob) {
  unsetenv("COHORT_COORDINATOR");
  setenv("COHORT_JOB_ID", "job-1", 1);
  EXPECT_EQ(MetricsReporter::from_environment(), nullptr);
  setenv("COHORT_COORDINATOR", "127.0.0.1:1", 1);
  EXPECT_NE(MetricsReporter::from_environment(), nullptr);
}

}  // namespace
}  // namespace cohort::train
