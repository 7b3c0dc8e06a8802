// The Coordinator when its job store cannot be written (issue 16), with a real failure: the data
// directory is a small tmpfs, mounted in a private mount namespace of this test process (so it
// vanishes with the process), that the test fills to the last page and empties again. A write
// that does not fit fails in SQLite with "database or disk is full", as on a production disk.
//
// Checked: every refused change leaves memory as it was (and as stored: a reopened coordinator
// sees the same); refused task exits are taken once the store writes again; a node lost while the
// store fails is acted on after it recovers; an attempt whose launch failure report was refused
// fails at its start deadline; store_status() and the retry interval.
//
// Needs root to mount; skipped (saying why) where mount(2) is refused.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/coordinator/coordinator.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"

namespace cohort::coordinator {
namespace {

using std::chrono::seconds;
using testing::TempDir;
using testing::valid_spec;

constexpr Duration kLease = seconds(15);
constexpr Duration kRetry = seconds(1);
// Room for the database and its write-ahead log, and little else.
constexpr const char* kTmpfsSize = "size=2m";

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

class StoreFailureTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Before any thread exists: unshare(CLONE_NEWNS) needs an unshared file-system context.
    if (unshare(CLONE_NEWNS) != 0) {
      skip_reason_ = std::string("unshare(CLONE_NEWNS): ") + strerror(errno);
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      skip_reason_ = std::string("making / private: ") + strerror(errno);
    }
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << "needs root for a private tmpfs; refused: " << skip_reason_;
    if (mount("tmpfs", disk_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, kTmpfsSize) != 0)
      GTEST_SKIP() << "mount -t tmpfs refused (" << strerror(errno) << "); run as root to test a full disk";
    mounted_ = true;
    open();
  }

  void TearDown() override {
    coordinator_.reset();
    if (mounted_) umount2(disk_.path().c_str(), MNT_DETACH);
  }

  void open() {
    coordinator_.reset();
    CoordinatorOptions options;
    options.data_dir = disk_.path() + "/data";
    options.node_lease = kLease;
    options.store_retry_interval = kRetry;
    auto coordinator = Coordinator::open(options, &clock_);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().to_string();
    coordinator_ = std::move(*coordinator);
  }

  // Fills the file system to its last byte.
  void fill() {
    int fd = ::open((disk_.path() + "/filler").c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << strerror(errno);
    const std::string block(64 * 1024, 'x');
    for (size_t size = block.size(); size > 0; size /= 2) {
      while (write(fd, block.data(), size) > 0) {
      }
    }
    close(fd);
  }
  void free_space() { ASSERT_EQ(unlink((disk_.path() + "/filler").c_str()), 0); }

  // After space returns, the next tick past the retry interval finds the store writable.
  AgentOrders recover() {
    free_space();
    clock_.advance(kRetry);
    AgentOrders orders = coordinator_->tick();
    EXPECT_TRUE(coordinator_->store_status().ok()) << coordinator_->store_status().to_string();
    return orders;
  }

  void add_node(const std::string& id, int slots) {
    NodeInfo info;
    info.node_id = id;
    info.address = id + ":7071";
    info.hostname = id;
    info.slots = slots;
    auto orders = coordinator_->register_node(info);
    ASSERT_TRUE(orders.ok()) << orders.status().to_string();
  }

  // A job of `nodes` x 1 rank, placed and RUNNING.
  std::string running_job(int nodes, int max_restarts) {
    cohort::v1::JobSpec spec = valid_spec();
    spec.set_nodes(nodes);
    spec.set_procs_per_node(1);
    spec.mutable_restart_policy()->set_max_restarts(max_restarts);
    auto id = coordinator_->submit(spec);
    EXPECT_TRUE(id.ok()) << id.status().to_string();
    AgentOrders orders = coordinator_->tick();
    EXPECT_EQ(orders.launches.size(), static_cast<size_t>(nodes));
    for (const LaunchOrder& launch : orders.launches)
      EXPECT_TRUE(coordinator_->report_tasks_started(launch.node.node_id, launch.job_id, launch.attempt).ok());
    EXPECT_EQ(state(*id), JobState::kRunning);
    return id.value_or("");
  }

  JobState state(const std::string& id) {
    auto job = coordinator_->get_job(id);
    EXPECT_TRUE(job.ok()) << job.status().to_string();
    return job.ok() ? job->state() : JobState::kPending;
  }

  void expect_refused(const Status& status, const std::string& what) {
    EXPECT_EQ(status.code(), StatusCode::kUnavailable) << what << ": " << status.to_string();
    EXPECT_TRUE(contains(status.message(), "job store")) << what << ": " << status.to_string();
  }

  static inline std::string skip_reason_;
  TempDir disk_;
  bool mounted_ = false;
  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(StoreFailureTest, ARefusedSubmitLeavesNoJobAndTheStoreIsRetriedUntilItWrites) {
  auto first = coordinator_->submit(valid_spec());
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  fill();
  // A write may still fit in the last page the log file has; soon one does not.
  std::vector<std::string> accepted = {*first};
  StatusOr<std::string> refused = coordinator_->submit(valid_spec());
  for (int tries = 0; refused.ok() && tries < 50; ++tries) {
    accepted.push_back(*refused);
    refused = coordinator_->submit(valid_spec());
  }
  ASSERT_FALSE(refused.ok()) << "50 submits fit on a full disk";
  expect_refused(refused.status(), "submit on a full disk");
  EXPECT_TRUE(contains(refused.status().message(), "full")) << refused.status().to_string();
  EXPECT_EQ(coordinator_->list_jobs().size(), accepted.size());
  expect_refused(coordinator_->store_status(), "store_status");

  // Within the retry interval nothing is tried: refused without a write.
  expect_refused(coordinator_->submit(valid_spec()).status(), "submit while failing");
  // Still full after the interval: the retry (it rewrites a stored record) may fit in what the
  // log file already holds and end the refusals, but a submit still does not fit: refused either
  // way, and the coordinator is back to refusing.
  clock_.advance(kRetry);
  coordinator_->tick();
  expect_refused(coordinator_->submit(valid_spec()).status(), "submit after a retry on a full disk");
  expect_refused(coordinator_->store_status(), "after a retry on a full disk");

  // Space returns, but nothing is tried before the interval has passed.
  free_space();
  coordinator_->tick();
  expect_refused(coordinator_->store_status(), "before the retry interval");
  clock_.advance(kRetry);
  coordinator_->tick();
  ASSERT_TRUE(coordinator_->store_status().ok()) << coordinator_->store_status().to_string();
  auto second = coordinator_->submit(valid_spec());
  ASSERT_TRUE(second.ok()) << second.status().to_string();

  accepted.push_back(*second);
  // What is stored is exactly what was accepted.
  open();
  std::vector<std::string> stored;
  for (const Job& job : coordinator_->list_jobs()) stored.push_back(job.id);
  EXPECT_EQ(stored, accepted);
}

TEST_F(StoreFailureTest, ARefusedCancelChangesNothingAndNothingIsPlacedMeanwhile) {
  add_node("node-a", 2);
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_procs_per_node(1);
  auto id = coordinator_->submit(spec);
  ASSERT_TRUE(id.ok());
  fill();
  expect_refused(coordinator_->cancel(*id, "test").status(), "cancel on a full disk");
  EXPECT_EQ(state(*id), JobState::kPending);
  // The queued job is not placed while the store cannot record it.
  AgentOrders orders = coordinator_->tick();
  EXPECT_TRUE(orders.launches.empty());
  EXPECT_EQ(state(*id), JobState::kPending);
  open();  // the stored record agrees (reopening frees nothing: the filler stays)
  EXPECT_EQ(state(*id), JobState::kPending);
}

TEST_F(StoreFailureTest, AJobPlacedWhileTheStoreFailsIsPlacedOnceItWrites) {
  add_node("node-a", 2);
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_procs_per_node(1);
  auto id = coordinator_->submit(spec);
  ASSERT_TRUE(id.ok());
  fill();
  // The PLACED transition is the failed write: the reservation is undone and the job stays queued.
  AgentOrders orders = coordinator_->tick();
  EXPECT_TRUE(orders.launches.empty());
  expect_refused(coordinator_->store_status(), "after the failed placement");
  EXPECT_EQ(state(*id), JobState::kPending);
  EXPECT_EQ(coordinator_->list_nodes().at(0).free_slots, 2);
  orders = recover();
  ASSERT_EQ(orders.launches.size(), 1u);
  EXPECT_EQ(state(*id), JobState::kPlaced);
}

TEST_F(StoreFailureTest, ARefusedTaskExitIsTakenWhenTheAgentReportsItAgainAfterRecovery) {
  add_node("node-a", 2);
  add_node("node-b", 2);
  const std::string id = running_job(2, /*max_restarts=*/0);
  fill();
  auto refused = coordinator_->report_task_exit(TaskExit{"node-a", id, 1, 0, 3});
  ASSERT_FALSE(refused.ok());
  expect_refused(refused.status(), "task exit on a full disk");
  EXPECT_EQ(state(id), JobState::kRunning);
  // The agent retries; still refused while the store fails.
  expect_refused(coordinator_->report_task_exit(TaskExit{"node-a", id, 1, 0, 3}).status(), "retried exit");
  // Heartbeats go on (they write nothing), so the nodes are not lost meanwhile.
  EXPECT_TRUE(coordinator_->heartbeat("node-a").ok());

  recover();
  auto taken = coordinator_->report_task_exit(TaskExit{"node-a", id, 1, 0, 3});
  ASSERT_TRUE(taken.ok()) << taken.status().to_string();
  EXPECT_EQ(state(id), JobState::kFailed);
  auto job = coordinator_->get_job(id);
  EXPECT_TRUE(contains(job->machine.reason(), "rank 0 on node node-a exited with code 3")) << job->machine.reason();
  ASSERT_EQ(taken->stops.size(), 1u);  // rank 1 on node-b
  EXPECT_EQ(taken->stops[0].node_id, "node-b");
  open();
  EXPECT_EQ(state(id), JobState::kFailed);
}

TEST_F(StoreFailureTest, ALaunchFailureRefusedWhileTheStoreFailsEndsTheAttemptAtItsStartDeadline) {
  add_node("node-a", 1);
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_nodes(1);
  spec.set_procs_per_node(1);
  auto id = coordinator_->submit(spec);
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  ASSERT_EQ(coordinator_->tick().launches.size(), 1u);
  fill();
  // The launch failed; its report is refused, and the server does not send it again.
  expect_refused(coordinator_->report_launch_failure("node-a", *id, 1, "cannot exec /bin/nope").status(),
                 "launch failure on a full disk");
  recover();
  EXPECT_EQ(state(*id), JobState::kPlaced);
  // Until the start deadline it may still start; the nodes heartbeat meanwhile.
  for (Duration passed(0); passed + seconds(5) < kDefaultStartTimeout; passed += seconds(5)) {
    clock_.advance(seconds(5));
    ASSERT_TRUE(coordinator_->heartbeat("node-a").ok());
    coordinator_->tick();
  }
  EXPECT_EQ(state(*id), JobState::kPlaced);
  clock_.advance(seconds(5));
  AgentOrders orders = coordinator_->tick();
  EXPECT_EQ(state(*id), JobState::kFailed);
  auto job = coordinator_->get_job(*id);
  EXPECT_TRUE(contains(job->machine.reason(), "node(s) node-a did not report attempt 1's tasks started"))
      << job->machine.reason();
  ASSERT_EQ(orders.stops.size(), 1u);  // in case it started after all
  EXPECT_EQ(orders.stops[0].node_id, "node-a");
  ASSERT_EQ(coordinator_->list_nodes().size(), 1u);
  EXPECT_EQ(coordinator_->list_nodes()[0].free_slots, 1) << "its slot is free again";
}

TEST_F(StoreFailureTest, ANodeLostWhileTheStoreFailsFailsItsAttemptOnceTheStoreWrites) {
  add_node("node-a", 1);
  add_node("node-b", 1);
  const std::string id = running_job(2, /*max_restarts=*/1);
  EXPECT_TRUE(coordinator_->heartbeat("node-a").ok());
  // node-b goes silent for a lease while the disk is full: its loss cannot be recorded yet.
  clock_.advance(kLease / 2);
  EXPECT_TRUE(coordinator_->heartbeat("node-a").ok());
  clock_.advance(kLease / 2 + seconds(1));
  EXPECT_TRUE(coordinator_->heartbeat("node-a").ok());
  fill();
  AgentOrders orders = coordinator_->tick();
  EXPECT_TRUE(orders.stops.empty());
  expect_refused(coordinator_->store_status(), "after the failed loss");
  EXPECT_EQ(state(id), JobState::kRunning);

  orders = recover();
  // The attempt failed naming node-b, its rank on node-a is stopped, and the restart (pending:
  // node-b's slot left with it) waits.
  EXPECT_EQ(state(id), JobState::kPending);
  auto job = coordinator_->get_job(id);
  EXPECT_TRUE(contains(job->machine.reason(), "node-b")) << job->machine.reason();
  ASSERT_EQ(orders.stops.size(), 1u);
  EXPECT_EQ(orders.stops[0].node_id, "node-a");
  open();
  EXPECT_EQ(state(id), JobState::kPending);
}

TEST_F(StoreFailureTest, ARefusedMetricsReportIsNeitherStoredNorPublished) {
  add_node("node-a", 1);
  const std::string id = running_job(1, 0);
  Metrics metrics;
  metrics.step = 5;
  ASSERT_TRUE(coordinator_->report_metrics(id, 1, metrics).ok());
  fill();
  metrics.step = 6;
  expect_refused(coordinator_->report_metrics(id, 1, metrics), "metrics on a full disk");
  auto job = coordinator_->get_job(id);
  ASSERT_TRUE(job->last_metrics.has_value());
  EXPECT_EQ(job->last_metrics->step, 5);
  auto history = coordinator_->metrics_history(id, 0, 0);
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 1u);
  EXPECT_EQ(history->at(0).metrics.step, 5);
}

}  // namespace
}  // namespace cohort::coordinator
