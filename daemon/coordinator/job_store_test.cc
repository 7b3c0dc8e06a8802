#include "daemon/coordinator/job_store.h"

#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"

namespace cohort::coordinator {
namespace {

using testing::TempDir;
using testing::valid_spec;

Job make_job(const std::string& name, int64_t seq) {
  Job job;
  job.seq = seq;
  job.id = name + "-" + std::to_string(seq);
  job.spec = valid_spec(name, 2, 2);
  job.spec.mutable_restart_policy()->set_max_restarts(3);
  job.machine = JobStateMachine(3);
  job.submit_unix_ms = 1000 + seq;
  return job;
}

JobEvent event_for(const Job& job, int64_t seq, JobTransition change) {
  JobEvent event;
  event.seq = seq;
  event.job_id = job.id;
  event.unix_ms = 5000 + seq;
  event.change = std::move(change);
  return event;
}

Placement two_nodes() {
  Placement placement;
  placement.nodes.push_back(NodeAssignment{"node-a", "10.0.0.1:7071", 0, 0, 2, {0, 1}});
  placement.nodes.push_back(NodeAssignment{"node-b", "10.0.0.2:7071", 1, 2, 2, {}});
  return placement;
}

TEST(JobStoreTest, OpenCreatesTheDataDirectoryAndTheDatabase) {
  TempDir dir;
  const std::string data_dir = dir.path() + "/nested/data";
  auto store = JobStore::open(data_dir);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  EXPECT_TRUE(std::filesystem::exists(data_dir + "/" + JobStore::kDatabaseFile));
  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_TRUE(snapshot->events.empty());
}

TEST(JobStoreTest, ReopeningAfterCloseKeepsEveryJobAndEvent) {
  TempDir dir;
  Job pending = make_job("queued", 1);
  Job running = make_job("train", 2);
  running.machine = *JobStateMachine::restore(JobState::kRunning, 2, "all 4 rank(s) started", 3);
  running.placement = two_nodes();
  running.start_unix_ms = 4242;
  running.last_metrics = Metrics{120, 3, 0.25, 0.875, 1500.5, 0, 400, 5, 64, 12.5, 0.125};
  Job failed = make_job("broken", 3);
  failed.machine =
      *JobStateMachine::restore(JobState::kFailed, 1, "rank 3 on node node-b exited with code 1", 3);
  failed.end_unix_ms = 9999;
  {
    auto store = JobStore::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE(
        (*store)
            ->save(pending, event_for(pending, 1, {JobState::kPending, JobState::kPending, 1, "submitted"}))
            .ok());
    ASSERT_TRUE((*store)->upsert_job(running).ok());
    ASSERT_TRUE(
        (*store)
            ->append_event(event_for(running, 2, {JobState::kPlaced, JobState::kRunning, 2, "started"}))
            .ok());
    ASSERT_TRUE((*store)->upsert_job(failed).ok());
  }  // closed

  auto reopened = JobStore::open(dir.path());
  ASSERT_TRUE(reopened.ok()) << reopened.status().to_string();
  auto snapshot = (*reopened)->load_all();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  ASSERT_EQ(snapshot->jobs.size(), 3u);

  const Job& a = snapshot->jobs[0];
  EXPECT_EQ(a.id, "queued-1");
  EXPECT_EQ(a.state(), JobState::kPending);
  EXPECT_EQ(a.attempt(), 1);
  EXPECT_EQ(a.submit_unix_ms, 1001);
  EXPECT_TRUE(a.placement.empty());
  EXPECT_FALSE(a.last_metrics.has_value());
  EXPECT_EQ(a.spec.SerializeAsString(), pending.spec.SerializeAsString());

  const Job& b = snapshot->jobs[1];
  EXPECT_EQ(b.id, "train-2");
  EXPECT_EQ(b.state(), JobState::kRunning);
  EXPECT_EQ(b.attempt(), 2);
  EXPECT_EQ(b.machine.reason(), "all 4 rank(s) started");
  EXPECT_EQ(b.machine.max_restarts(), 3);
  EXPECT_EQ(b.start_unix_ms, 4242);
  ASSERT_EQ(b.placement.nodes.size(), 2u);
  EXPECT_EQ(b.placement.nodes[0].node_id, "node-a");
  EXPECT_EQ(b.placement.nodes[0].address, "10.0.0.1:7071");
  EXPECT_EQ(b.placement.nodes[0].gpus, (std::vector<int>{0, 1}));
  EXPECT_EQ(b.placement.nodes[1].first_rank, 2);
  EXPECT_EQ(b.placement.nodes[1].num_ranks, 2);
  EXPECT_TRUE(b.placement.nodes[1].gpus.empty());
  ASSERT_TRUE(b.last_metrics.has_value());
  EXPECT_EQ(b.last_metrics->step, 120);
  EXPECT_EQ(b.last_metrics->epoch, 3);
  EXPECT_DOUBLE_EQ(b.last_metrics->accuracy, 0.875);
  EXPECT_DOUBLE_EQ(b.last_metrics->samples_per_s, 1500.5);
  EXPECT_EQ(b.last_metrics->total_steps, 400);
  EXPECT_EQ(b.last_metrics->total_epochs, 5);
  EXPECT_EQ(b.last_metrics->samples_per_step, 64);
  EXPECT_DOUBLE_EQ(b.last_metrics->comm_wait_s, 12.5);
  EXPECT_DOUBLE_EQ(b.last_metrics->comm_wait_ratio, 0.125);

  const Job& c = snapshot->jobs[2];
  EXPECT_EQ(c.state(), JobState::kFailed);
  EXPECT_EQ(c.machine.reason(), "rank 3 on node node-b exited with code 1");
  EXPECT_EQ(c.end_unix_ms, 9999);

  ASSERT_EQ(snapshot->events.size(), 2u);
  EXPECT_EQ(snapshot->events[0].seq, 1);
  EXPECT_EQ(snapshot->events[0].change.reason, "submitted");
  EXPECT_EQ(snapshot->events[1].job_id, "train-2");
  EXPECT_EQ(snapshot->events[1].change.from, JobState::kPlaced);
  EXPECT_EQ(snapshot->events[1].change.to, JobState::kRunning);
  EXPECT_EQ(snapshot->events[1].change.attempt, 2);
  EXPECT_EQ(snapshot->events[1].unix_ms, 5002);
}

TEST(JobStoreTest, UpsertReplacesTheRecordAndItsPlacement) {
  TempDir dir;
  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  Job job = make_job("job", 1);
  job.placement = two_nodes();
  ASSERT_TRUE((*store)->upsert_job(job).ok());
  // A restarted attempt on one node, with different state and no metrics.
  job.machine = *JobStateMachine::restore(JobState::kPlaced, 2, "placed on node-c", 3);
  job.placement.nodes = {NodeAssignment{"node-c", "c:1", 0, 0, 4, {}}};
  ASSERT_TRUE((*store)->upsert_job(job).ok());

  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].state(), JobState::kPlaced);
  EXPECT_EQ(snapshot->jobs[0].attempt(), 2);
  ASSERT_EQ(snapshot->jobs[0].placement.nodes.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].placement.nodes[0].node_id, "node-c");
}

TEST(JobStoreTest, MetricsEventsAreNotStored) {
  TempDir dir;
  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  Job job = make_job("job", 1);
  ASSERT_TRUE((*store)->upsert_job(job).ok());
  JobEvent metrics;
  metrics.seq = 7;
  metrics.job_id = job.id;
  metrics.kind = JobEvent::Kind::kMetrics;
  EXPECT_EQ((*store)->append_event(metrics).code(), StatusCode::kInvalidArgument);
}

// A report with every field set, the communication wait growing with the step (a distinct value
// per report, so a column read from the wrong row or not stored at all shows).
MetricsRecord report(int64_t seq, int attempt, int64_t step) {
  Metrics m{step, 1, 1.0 / static_cast<double>(step), 0.5, 250.0, 0};
  m.total_steps = 1000;
  m.total_epochs = 4;
  m.samples_per_step = 32;
  m.comm_wait_s = 0.25 * static_cast<double>(step);
  m.comm_wait_ratio = 1.0 / static_cast<double>(step + 1);
  return MetricsRecord{seq, attempt, 7000 + seq, m};
}

// Turns the database in `dir` back into schema v4 (before the run totals and the communication
// wait were stored), keeping its rows, as a cohortd of that release left it.
void downgrade_to_schema_v4(const std::string& dir) {
  sqlite3* db = nullptr;
  const std::string path = dir + "/" + JobStore::kDatabaseFile;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  for (const char* column : {"total_steps", "total_epochs", "samples_per_step", "comm_wait_s", "comm_wait_ratio"}) {
    for (const std::string& sql : {std::string("ALTER TABLE metrics DROP COLUMN ") + column,
                                   std::string("ALTER TABLE jobs DROP COLUMN metrics_") + column}) {
      ASSERT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr), SQLITE_OK) << sql << ": " << sqlite3_errmsg(db);
    }
  }
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 4", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
}

TEST(JobStoreTest, EveryMetricsReportIsKeptAcrossAReopen) {
  TempDir dir;
  Job job = make_job("curve", 1);
  {
    auto store = JobStore::open(dir.path());
    ASSERT_TRUE(store.ok()) << store.status().to_string();
    ASSERT_TRUE((*store)->upsert_job(job).ok());
    for (int64_t i = 1; i <= 5; ++i) ASSERT_TRUE((*store)->append_metrics(job.id, report(10 + i, 1, i * 10)).ok());
    ASSERT_TRUE((*store)->append_metrics(job.id, report(30, 2, 5)).ok());
  }
  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto all = (*store)->load_metrics(job.id);
  ASSERT_TRUE(all.ok()) << all.status().to_string();
  ASSERT_EQ(all->size(), 6u);
  EXPECT_EQ((*all)[0].seq, 11);
  EXPECT_EQ((*all)[0].attempt, 1);
  EXPECT_EQ((*all)[0].unix_ms, 7011);
  EXPECT_EQ((*all)[0].metrics.step, 10);
  EXPECT_DOUBLE_EQ((*all)[0].metrics.loss, 0.1);
  EXPECT_DOUBLE_EQ((*all)[0].metrics.samples_per_s, 250.0);
  EXPECT_EQ((*all)[0].metrics.total_steps, 1000);
  EXPECT_EQ((*all)[0].metrics.total_epochs, 4);
  EXPECT_EQ((*all)[0].metrics.samples_per_step, 32);
  // Every report keeps its own communication wait.
  for (const MetricsRecord& record : *all) {
    EXPECT_DOUBLE_EQ(record.metrics.comm_wait_s, 0.25 * static_cast<double>(record.metrics.step)) << record.seq;
    EXPECT_DOUBLE_EQ(record.metrics.comm_wait_ratio, 1.0 / static_cast<double>(record.metrics.step + 1))
        << record.seq;
  }
  EXPECT_EQ((*all)[5].attempt, 2);

  auto after = (*store)->load_metrics(job.id, 13);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 3u);
  EXPECT_EQ((*after)[0].seq, 14);
  auto second = (*store)->load_metrics(job.id, 0, 2);
  ASSERT_TRUE(second.ok());
  ASSERT_EQ(second->size(), 1u);
  EXPECT_EQ((*second)[0].seq, 30);
  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->max_metrics_seq, 30);
  auto none = (*store)->load_metrics("unknown-9");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

TEST(JobStoreTest, AFullMetricsHistoryIsThinnedKeepingItsEnds) {
  TempDir dir;
  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  Job job = make_job("long", 1);
  ASSERT_TRUE((*store)->upsert_job(job).ok());
  constexpr int64_t kCap = 8;
  for (int64_t seq = 1; seq <= kCap; ++seq) ASSERT_TRUE((*store)->append_metrics(job.id, report(seq, 1, seq), kCap).ok());
  auto full = (*store)->load_metrics(job.id);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->size(), static_cast<size_t>(kCap));
  // The ninth report overflows: every second row goes, except the first and the newest.
  ASSERT_TRUE((*store)->append_metrics(job.id, report(kCap + 1, 1, kCap + 1), kCap).ok());
  auto thinned = (*store)->load_metrics(job.id);
  ASSERT_TRUE(thinned.ok());
  std::vector<int64_t> seqs;
  for (const MetricsRecord& record : *thinned) seqs.push_back(record.seq);
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 3, 5, 7, 9}));
  EXPECT_LE(thinned->size(), static_cast<size_t>(kCap));
}

TEST(JobStoreTest, AVersion2DatabaseIsMigratedAndKeepsItsJobs) {
  TempDir dir;
  Job job = make_job("old", 1);
  {
    auto store = JobStore::open(dir.path());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->upsert_job(job).ok());
  }
  // Make it look like a database written by an older release (schema 2: no metrics table, no
  // retired_seqs, no stored communication wait).
  ASSERT_NO_FATAL_FAILURE(downgrade_to_schema_v4(dir.path()));
  sqlite3* db = nullptr;
  const std::string path = dir.path() + "/" + JobStore::kDatabaseFile;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "DROP TABLE metrics; DROP TABLE retired_seqs; PRAGMA user_version = 2", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(snapshot->max_metrics_seq, 0);
  ASSERT_TRUE((*store)->append_metrics(job.id, report(4, 1, 40)).ok());
  auto series = (*store)->load_metrics(job.id);
  ASSERT_TRUE(series.ok());
  EXPECT_EQ(series->size(), 1u);
}

TEST(JobStoreTest, AVersion4DatabaseKeepsItsSeriesAndStoresTheCommWaitFromNowOn) {
  TempDir dir;
  Job job = make_job("before", 1);
  job.last_metrics = report(1, 1, 10).metrics;
  {
    auto store = JobStore::open(dir.path());
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->upsert_job(job).ok());
    ASSERT_TRUE((*store)->append_metrics(job.id, report(1, 1, 10)).ok());
  }
  ASSERT_NO_FATAL_FAILURE(downgrade_to_schema_v4(dir.path()));

  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  // What schema v4 kept is intact; what it did not keep reads 0 (unknown).
  ASSERT_TRUE(snapshot->jobs[0].last_metrics.has_value());
  EXPECT_EQ(snapshot->jobs[0].last_metrics->step, 10);
  EXPECT_DOUBLE_EQ(snapshot->jobs[0].last_metrics->comm_wait_s, 0);
  ASSERT_TRUE((*store)->append_metrics(job.id, report(2, 1, 20)).ok());
  job.last_metrics = report(2, 1, 20).metrics;
  ASSERT_TRUE((*store)->upsert_job(job).ok());
  auto series = (*store)->load_metrics(job.id);
  ASSERT_TRUE(series.ok()) << series.status().to_string();
  ASSERT_EQ(series->size(), 2u);
  EXPECT_EQ((*series)[0].metrics.step, 10);
  EXPECT_DOUBLE_EQ((*series)[0].metrics.loss, 0.1);
  EXPECT_DOUBLE_EQ((*series)[0].metrics.comm_wait_s, 0);
  EXPECT_DOUBLE_EQ((*series)[0].metrics.comm_wait_ratio, 0);
  EXPECT_DOUBLE_EQ((*series)[1].metrics.comm_wait_s, 5.0);
  EXPECT_DOUBLE_EQ((*series)[1].metrics.comm_wait_ratio, 1.0 / 21);
  EXPECT_EQ((*series)[1].metrics.total_steps, 1000);
  auto reloaded = (*store)->load_all();
  ASSERT_TRUE(reloaded.ok());
  EXPECT_DOUBLE_EQ(reloaded->jobs[0].last_metrics->comm_wait_s, 5.0);
}

TEST(JobStoreTest, AFailedSaveWritesNeitherTheJobNorTheEvent) {
  TempDir dir;
  auto store = JobStore::open(dir.path());
  ASSERT_TRUE(store.ok());
  Job job = make_job("job", 1);
  JobEvent first = event_for(job, 1, {JobState::kPending, JobState::kPending, 1, "submitted"});
  ASSERT_TRUE((*store)->save(job, first).ok());
  // The same event seq again violates the primary key: the job update must roll back too.
  job.machine = *JobStateMachine::restore(JobState::kCancelled, 1, "cancelled", 3);
  Status status = (*store)->save(job, first);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("sqlite3_step"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("job_store.cc"), std::string::npos) << status.message();
  auto snapshot = (*store)->load_all();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_EQ(snapshot->jobs[0].state(), JobState::kPending);
  EXPECT_EQ(snapshot->events.size(), 1u);
}

TEST(JobStoreTest, ADatabaseFromANewerCohortdIsRefused) {
  TempDir dir;
  { ASSERT_TRUE(JobStore::open(dir.path()).ok()); }
  sqlite3* db = nullptr;
  const std::string path = dir.path() + "/" + JobStore::kDatabaseFile;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version = 99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);

  auto store = JobStore::open(dir.path());
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(store.status().message().find("schema version 99"), std::string::npos)
      << store.status().message();
}

TEST(JobStoreTest, AnUnusableDataDirectoryIsAnErrorThatNamesIt) {
  TempDir dir;
  const std::string file = dir.path() + "/not-a-dir";
  std::ofstream(file) << "x";
  auto store = JobStore::open(file + "/data");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("not-a-dir"), std::string::npos) << store.status().message();
}

}  // namespace
}  // namespace cohort::coordinator
