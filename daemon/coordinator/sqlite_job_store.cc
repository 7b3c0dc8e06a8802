#include "daemon/coordinator/sqlite_job_store.h"

#include <charconv>
#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

namespace cohort::coordinator {

namespace {

// Schema migrations: kMigrations[v] takes a database from version v to v + 1. Append only — a
// released step never changes, so every data directory walks the same path to the newest schema.
constexpr const char* kMigrations[] = {
    // v0 → v1: jobs, their placements, and state-change events.
    R"sql(
      CREATE TABLE jobs (
        id                    TEXT PRIMARY KEY,
        seq                   INTEGER NOT NULL UNIQUE,   -- submission order
        spec                  BLOB NOT NULL,             -- cohort.v1.JobSpec wire bytes
        state                 TEXT NOT NULL,             -- job_state_name()
        reason                TEXT NOT NULL,
        attempt               INTEGER NOT NULL,
        submit_unix_ms        INTEGER NOT NULL,
        start_unix_ms         INTEGER NOT NULL,
        end_unix_ms           INTEGER NOT NULL,
        metrics_step          INTEGER,                   -- NULL: no metrics reported yet
        metrics_epoch         INTEGER,
        metrics_loss          REAL,
        metrics_accuracy      REAL,
        metrics_samples_per_s REAL,
        metrics_rank          INTEGER
      );
      CREATE TABLE placements (
        job_id     TEXT NOT NULL REFERENCES jobs(id),
        node_rank  INTEGER NOT NULL,
        node_id    TEXT NOT NULL,
        address    TEXT NOT NULL,
        first_rank INTEGER NOT NULL,
        num_ranks  INTEGER NOT NULL,
        gpus       TEXT NOT NULL,                        -- "0,1,2": GPU indexes, comma separated
        PRIMARY KEY (job_id, node_rank)
      );
      CREATE TABLE events (
        seq        INTEGER PRIMARY KEY,
        job_id     TEXT NOT NULL REFERENCES jobs(id),
        unix_ms    INTEGER NOT NULL,
        from_state TEXT NOT NULL,
        to_state   TEXT NOT NULL,
        attempt    INTEGER NOT NULL,
        reason     TEXT NOT NULL
      );
      CREATE INDEX events_by_job ON events (job_id, seq);
    )sql",
    // v1 → v2: each job's owner (jobs recorded before users existed belong to nobody: admins only).
    R"sql(
      ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';
    )sql",
    // v2 → v3: every metrics report (JobStore::kMaxMetricsPerJob rows per job at most).
    R"sql(
      CREATE TABLE metrics (
        job_id        TEXT NOT NULL REFERENCES jobs(id),
        seq           INTEGER NOT NULL,                  -- the event seq that published it
        attempt       INTEGER NOT NULL,
        unix_ms       INTEGER NOT NULL,
        step          INTEGER NOT NULL,
        epoch         INTEGER NOT NULL,
        loss          REAL NOT NULL,
        accuracy      REAL NOT NULL,
        samples_per_s REAL NOT NULL,
        rank          INTEGER NOT NULL,
        PRIMARY KEY (job_id, seq)
      );
    )sql",
    // v3 → v4: the highest job and event seq of jobs deleted after their retention period, so a
    // restarted coordinator never hands out a deleted job's id (or an event seq) again.
    R"sql(
      CREATE TABLE retired_seqs (
        name  TEXT PRIMARY KEY,                          -- 'job' or 'event'
        value INTEGER NOT NULL
      );
    )sql",
    // v4 → v5: the rest of each report (Metrics): the run totals and the reporting rank's
    // communication wait, in the history and in the job's last metrics. Rows stored before read 0
    // (unknown), as a worker that does not measure them reports.
    R"sql(
      ALTER TABLE metrics ADD COLUMN total_steps INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE metrics ADD COLUMN total_epochs INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE metrics ADD COLUMN samples_per_step INTEGER NOT NULL DEFAULT 0;
      ALTER TABLE metrics ADD COLUMN comm_wait_s REAL NOT NULL DEFAULT 0;
      ALTER TABLE metrics ADD COLUMN comm_wait_ratio REAL NOT NULL DEFAULT 0;
      ALTER TABLE jobs ADD COLUMN metrics_total_steps INTEGER;
      ALTER TABLE jobs ADD COLUMN metrics_total_epochs INTEGER;
      ALTER TABLE jobs ADD COLUMN metrics_samples_per_step INTEGER;
      ALTER TABLE jobs ADD COLUMN metrics_comm_wait_s REAL;
      ALTER TABLE jobs ADD COLUMN metrics_comm_wait_ratio REAL;
    )sql",
};
static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == JobStore::kSchemaVersion,
              "one migration per schema version");

std::string join_ints(const std::vector<int>& values) {
  std::string out;
  for (int value : values) {
    if (!out.empty()) out += ',';
    out += std::to_string(value);
  }
  return out;
}

StatusOr<std::vector<int>> split_ints(const std::string& text) {
  std::vector<int> values;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    int value = 0;
    auto [next, ec] = std::from_chars(p, end, value);
    if (ec != std::errc() || (next < end && *next != ',')) {
      return data_loss_error("stored GPU list '{}' is not comma-separated integers", text);
    }
    values.push_back(value);
    p = next < end ? next + 1 : next;
  }
  return values;
}

}  // namespace

StatusOr<std::unique_ptr<SqliteJobStore>> SqliteJobStore::open(const std::string& data_dir) {
  std::error_code ec;
  std::filesystem::create_directories(data_dir, ec);
  if (ec) {
    return permission_denied_error(
        "cannot create data directory '{}': {}; check the path and its permissions", data_dir, ec.message());
  }
  const std::string path = (std::filesystem::path(data_dir) / kDatabaseFile).string();
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<SqliteDb> db, SqliteDb::open(path));
  // A failing second opener should give up quickly, with the "another coordinator?" advice.
  COHORT_SQLITE_CHECK(db->handle(), sqlite3_busy_timeout(db->handle(), 1000));
  // EXCLUSIVE: one coordinator per data directory (the lock is held from the first write until
  // close). WAL + FULL: a committed job survives a crash or power loss, at one fsync per write.
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA locking_mode = EXCLUSIVE"));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA journal_mode = WAL"));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA synchronous = FULL"));
  COHORT_RETURN_IF_ERROR(db->exec("PRAGMA foreign_keys = ON"));
  std::unique_ptr<SqliteJobStore> store(new SqliteJobStore(std::move(db)));
  COHORT_RETURN_IF_ERROR(store->migrate().with_context(path));
  return store;
}

Status SqliteJobStore::migrate() {
  COHORT_ASSIGN_OR_RETURN(int64_t version, db_->query_int("PRAGMA user_version"));
  if (version > kSchemaVersion) {
    return failed_precondition_error(
        "the job database has schema version {} but this cohortd knows only up to {}; run a newer cohortd",
        version, kSchemaVersion);
  }
  for (int64_t v = version; v < kSchemaVersion; ++v) {
    COHORT_RETURN_IF_ERROR(db_->transaction([&]() -> Status {
      COHORT_RETURN_IF_ERROR(db_->exec(kMigrations[v]));
      // PRAGMA takes no bound parameters; the value is our own integer.
      return db_->exec(fmt::format("PRAGMA user_version = {}", v + 1));
    }));
  }
  return ok_status();
}

Status SqliteJobStore::write_job(const Job& job) {
  std::string spec_bytes;
  if (!job.spec.SerializeToString(&spec_bytes)) {
    return internal_error("job '{}': cannot serialize its spec", job.id);
  }
  // Metrics columns are NULL until the first report.
  std::optional<int64_t> step, epoch, rank, total_steps, total_epochs, samples_per_step;
  std::optional<double> loss, accuracy, samples_per_s, comm_wait_s, comm_wait_ratio;
  if (job.last_metrics) {
    const Metrics& m = *job.last_metrics;
    step = m.step;
    epoch = m.epoch;
    rank = m.rank;
    loss = m.loss;
    accuracy = m.accuracy;
    samples_per_s = m.samples_per_s;
    total_steps = m.total_steps;
    total_epochs = m.total_epochs;
    samples_per_step = m.samples_per_step;
    comm_wait_s = m.comm_wait_s;
    comm_wait_ratio = m.comm_wait_ratio;
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement upsert, db_->prepare(R"sql(
      INSERT INTO jobs (id, seq, spec, state, reason, attempt, submit_unix_ms, start_unix_ms, end_unix_ms,
                        metrics_step, metrics_epoch, metrics_loss, metrics_accuracy, metrics_samples_per_s,
                        metrics_rank, owner, metrics_total_steps, metrics_total_epochs,
                        metrics_samples_per_step, metrics_comm_wait_s, metrics_comm_wait_ratio)
      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)
      ON CONFLICT (id) DO UPDATE SET
        spec = excluded.spec, state = excluded.state, reason = excluded.reason,
        attempt = excluded.attempt, start_unix_ms = excluded.start_unix_ms,
        end_unix_ms = excluded.end_unix_ms, metrics_step = excluded.metrics_step,
        metrics_epoch = excluded.metrics_epoch, metrics_loss = excluded.metrics_loss,
        metrics_accuracy = excluded.metrics_accuracy,
        metrics_samples_per_s = excluded.metrics_samples_per_s, metrics_rank = excluded.metrics_rank,
        metrics_total_steps = excluded.metrics_total_steps,
        metrics_total_epochs = excluded.metrics_total_epochs,
        metrics_samples_per_step = excluded.metrics_samples_per_step,
        metrics_comm_wait_s = excluded.metrics_comm_wait_s,
        metrics_comm_wait_ratio = excluded.metrics_comm_wait_ratio)sql"));
  COHORT_RETURN_IF_ERROR(upsert.bind(job.id, job.seq, SqliteBlob{spec_bytes},
                                     std::string(job_state_name(job.state())), job.machine.reason(),
                                     job.attempt(), job.submit_unix_ms, job.start_unix_ms, job.end_unix_ms,
                                     step, epoch, loss, accuracy, samples_per_s, rank, job.owner, total_steps,
                                     total_epochs, samples_per_step, comm_wait_s, comm_wait_ratio));
  COHORT_RETURN_IF_ERROR(upsert.run());

  // The placement is replaced whole: a restarted attempt may run on different nodes.
  COHORT_ASSIGN_OR_RETURN(SqliteStatement clear, db_->prepare("DELETE FROM placements WHERE job_id = ?1"));
  COHORT_RETURN_IF_ERROR(clear.bind(job.id));
  COHORT_RETURN_IF_ERROR(clear.run());
  COHORT_ASSIGN_OR_RETURN(SqliteStatement insert, db_->prepare(R"sql(
      INSERT INTO placements (job_id, node_rank, node_id, address, first_rank, num_ranks, gpus)
      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7))sql"));
  for (const NodeAssignment& node : job.placement.nodes) {
    COHORT_RETURN_IF_ERROR(insert.bind(job.id, node.node_rank, node.node_id, node.address, node.first_rank,
                                       node.num_ranks, join_ints(node.gpus)));
    COHORT_RETURN_IF_ERROR(insert.run());
    COHORT_RETURN_IF_ERROR(insert.reset());
  }
  return ok_status();
}

Status SqliteJobStore::write_event(const JobEvent& event) {
  if (event.kind != JobEvent::Kind::kStateChange) {
    return invalid_argument_error("event {} of job '{}' is a metrics event; only state changes are stored",
                                  event.seq, event.job_id);
  }
  COHORT_ASSIGN_OR_RETURN(SqliteStatement insert, db_->prepare(R"sql(
      INSERT INTO events (seq, job_id, unix_ms, from_state, to_state, attempt, reason)
      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7))sql"));
  COHORT_RETURN_IF_ERROR(
      insert.bind(event.seq, event.job_id, event.unix_ms, std::string(job_state_name(event.change.from)),
                  std::string(job_state_name(event.change.to)), event.change.attempt, event.change.reason));
  return insert.run();
}

Status SqliteJobStore::upsert_job(const Job& job) {
  return db_->transaction([&] { return write_job(job); });
}

Status SqliteJobStore::append_event(const JobEvent& event) {
  return db_->transaction([&] { return write_event(event); });
}

Status SqliteJobStore::save(const Job& job, const JobEvent& event) {
  return db_->transaction([&]() -> Status {
    COHORT_RETURN_IF_ERROR(write_job(job));
    return write_event(event);
  });
}

Status SqliteJobStore::append_metrics(const std::string& job_id, const MetricsRecord& record, int64_t max_rows) {
  return db_->transaction([&]() -> Status {
    COHORT_ASSIGN_OR_RETURN(SqliteStatement insert, db_->prepare(R"sql(
        INSERT INTO metrics (job_id, seq, attempt, unix_ms, step, epoch, loss, accuracy, samples_per_s, rank,
                             total_steps, total_epochs, samples_per_step, comm_wait_s, comm_wait_ratio)
        VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15))sql"));
    const Metrics& m = record.metrics;
    COHORT_RETURN_IF_ERROR(insert.bind(job_id, record.seq, record.attempt, record.unix_ms, m.step, m.epoch,
                                       m.loss, m.accuracy, m.samples_per_s, m.rank, m.total_steps,
                                       m.total_epochs, m.samples_per_step, m.comm_wait_s, m.comm_wait_ratio));
    COHORT_RETURN_IF_ERROR(insert.run());
    COHORT_ASSIGN_OR_RETURN(SqliteStatement count,
                            db_->prepare("SELECT COUNT(*) FROM metrics WHERE job_id = ?1"));
    COHORT_RETURN_IF_ERROR(count.bind(job_id));
    COHORT_ASSIGN_OR_RETURN(bool row, count.step());
    if (!row || count.column_int64(0) <= max_rows) return ok_status();
    // Thinning (kMaxMetricsPerJob): drop every second row by seq, keeping the first and the newest.
    COHORT_ASSIGN_OR_RETURN(SqliteStatement thin, db_->prepare(R"sql(
        DELETE FROM metrics WHERE job_id = ?1 AND seq IN (
          SELECT seq FROM (SELECT seq, ROW_NUMBER() OVER (ORDER BY seq) AS n FROM metrics WHERE job_id = ?1)
          WHERE n % 2 = 0 AND seq < (SELECT MAX(seq) FROM metrics WHERE job_id = ?1)))sql"));
    COHORT_RETURN_IF_ERROR(thin.bind(job_id));
    return thin.run();
  });
}

StatusOr<std::vector<MetricsRecord>> SqliteJobStore::load_metrics(const std::string& job_id, int64_t after_seq,
                                                            int attempt) const {
  COHORT_ASSIGN_OR_RETURN(SqliteStatement select, db_->prepare(R"sql(
      SELECT seq, attempt, unix_ms, step, epoch, loss, accuracy, samples_per_s, rank,
             total_steps, total_epochs, samples_per_step, comm_wait_s, comm_wait_ratio
      FROM metrics WHERE job_id = ?1 AND seq > ?2 AND (?3 = 0 OR attempt = ?3) ORDER BY seq)sql"));
  COHORT_RETURN_IF_ERROR(select.bind(job_id, after_seq, attempt));
  std::vector<MetricsRecord> out;
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    MetricsRecord record;
    record.seq = select.column_int64(0);
    record.attempt = static_cast<int>(select.column_int64(1));
    record.unix_ms = select.column_int64(2);
    record.metrics.step = select.column_int64(3);
    record.metrics.epoch = static_cast<int>(select.column_int64(4));
    record.metrics.loss = select.column_double(5);
    record.metrics.accuracy = select.column_double(6);
    record.metrics.samples_per_s = select.column_double(7);
    record.metrics.rank = static_cast<int>(select.column_int64(8));
    record.metrics.total_steps = select.column_int64(9);
    record.metrics.total_epochs = static_cast<int>(select.column_int64(10));
    record.metrics.samples_per_step = select.column_int64(11);
    record.metrics.comm_wait_s = select.column_double(12);
    record.metrics.comm_wait_ratio = select.column_double(13);
    out.push_back(record);
  }
  return out;
}

StatusOr<Placement> SqliteJobStore::load_placement(const std::string& job_id) const {
  COHORT_ASSIGN_OR_RETURN(SqliteStatement select, db_->prepare(R"sql(
      SELECT node_rank, node_id, address, first_rank, num_ranks, gpus
      FROM placements WHERE job_id = ?1 ORDER BY node_rank)sql"));
  COHORT_RETURN_IF_ERROR(select.bind(job_id));
  Placement placement;
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    NodeAssignment node;
    node.node_rank = static_cast<int>(select.column_int64(0));
    node.node_id = select.column_text(1);
    node.address = select.column_text(2);
    node.first_rank = static_cast<int>(select.column_int64(3));
    node.num_ranks = static_cast<int>(select.column_int64(4));
    COHORT_ASSIGN_OR_RETURN(node.gpus, split_ints(select.column_text(5)));
    placement.nodes.push_back(std::move(node));
  }
  return placement;
}

StatusOr<JobStore::Snapshot> SqliteJobStore::load_all() const {
  Snapshot snapshot;
  COHORT_ASSIGN_OR_RETURN(SqliteStatement jobs, db_->prepare(R"sql(
      SELECT id, seq, spec, state, reason, attempt, submit_unix_ms, start_unix_ms, end_unix_ms,
             metrics_step, metrics_epoch, metrics_loss, metrics_accuracy, metrics_samples_per_s, metrics_rank,
             owner, metrics_total_steps, metrics_total_epochs, metrics_samples_per_step, metrics_comm_wait_s,
             metrics_comm_wait_ratio
      FROM jobs ORDER BY seq)sql"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, jobs.step());
    if (!row) break;
    Job job;
    job.id = jobs.column_text(0);
    job.seq = jobs.column_int64(1);
    job.owner = jobs.column_text(15);
    if (!job.spec.ParseFromString(jobs.column_blob(2))) {
      return data_loss_error("job '{}': its stored spec does not parse as cohort.v1.JobSpec", job.id);
    }
    auto state = parse_job_state(jobs.column_text(3));
    if (!state.ok()) return data_loss_error("job '{}': {}", job.id, state.status().message());
    auto machine = JobStateMachine::restore(*state, static_cast<int>(jobs.column_int64(5)),
                                            jobs.column_text(4), job.spec.restart_policy().max_restarts());
    if (!machine.ok()) return data_loss_error("job '{}': {}", job.id, machine.status().message());
    job.machine = *machine;
    job.submit_unix_ms = jobs.column_int64(6);
    job.start_unix_ms = jobs.column_int64(7);
    job.end_unix_ms = jobs.column_int64(8);
    if (!jobs.column_is_null(9)) {
      Metrics m;
      m.step = jobs.column_int64(9);
      m.epoch = static_cast<int>(jobs.column_int64(10));
      m.loss = jobs.column_double(11);
      m.accuracy = jobs.column_double(12);
      m.samples_per_s = jobs.column_double(13);
      m.rank = static_cast<int>(jobs.column_int64(14));
      // NULL in a job whose last report was stored before schema v5: column_* reads 0 (unknown).
      m.total_steps = jobs.column_int64(16);
      m.total_epochs = static_cast<int>(jobs.column_int64(17));
      m.samples_per_step = jobs.column_int64(18);
      m.comm_wait_s = jobs.column_double(19);
      m.comm_wait_ratio = jobs.column_double(20);
      job.last_metrics = m;
    }
    COHORT_ASSIGN_OR_RETURN(job.placement, load_placement(job.id));
    snapshot.jobs.push_back(std::move(job));
  }

  COHORT_ASSIGN_OR_RETURN(SqliteStatement events, db_->prepare(R"sql(
      SELECT seq, job_id, unix_ms, from_state, to_state, attempt, reason FROM events ORDER BY seq)sql"));
  while (true) {
    COHORT_ASSIGN_OR_RETURN(bool row, events.step());
    if (!row) break;
    JobEvent event;
    event.seq = events.column_int64(0);
    event.job_id = events.column_text(1);
    event.unix_ms = events.column_int64(2);
    event.kind = JobEvent::Kind::kStateChange;
    auto from = parse_job_state(events.column_text(3));
    auto to = parse_job_state(events.column_text(4));
    if (!from.ok() || !to.ok()) {
      return data_loss_error("event {}: {}", event.seq, (from.ok() ? to.status() : from.status()).message());
    }
    event.change = JobTransition{*from, *to, static_cast<int>(events.column_int64(5)), events.column_text(6)};
    snapshot.events.push_back(std::move(event));
  }
  COHORT_ASSIGN_OR_RETURN(snapshot.max_metrics_seq, db_->query_int("SELECT COALESCE(MAX(seq), 0) FROM metrics"));
  COHORT_ASSIGN_OR_RETURN(snapshot.retired_job_seq,
                          db_->query_int("SELECT COALESCE(MAX(value), 0) FROM retired_seqs WHERE name = 'job'"));
  COHORT_ASSIGN_OR_RETURN(snapshot.retired_event_seq,
                          db_->query_int("SELECT COALESCE(MAX(value), 0) FROM retired_seqs WHERE name = 'event'"));
  return snapshot;
}

Status SqliteJobStore::delete_job(const std::string& job_id) {
  return db_->transaction([&]() -> Status {
    // Remember the highest seqs first: they must outlive the rows (see retired_seqs).
    for (const char* retire_sql : {
             R"sql(INSERT INTO retired_seqs (name, value)
                   SELECT 'job', seq FROM jobs WHERE id = ?1
                   ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value))sql",
             R"sql(INSERT INTO retired_seqs (name, value)
                   SELECT 'event', m FROM (SELECT MAX(seq) AS m FROM (
                       SELECT seq FROM events WHERE job_id = ?1 UNION ALL SELECT seq FROM metrics WHERE job_id = ?1))
                   WHERE m IS NOT NULL
                   ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value))sql"}) {
      COHORT_ASSIGN_OR_RETURN(SqliteStatement retire, db_->prepare(retire_sql));
      COHORT_RETURN_IF_ERROR(retire.bind(job_id));
      COHORT_RETURN_IF_ERROR(retire.run());
    }
    for (const char* table : {"metrics", "events", "placements"}) {
      COHORT_ASSIGN_OR_RETURN(SqliteStatement clear,
                              db_->prepare(fmt::format("DELETE FROM {} WHERE job_id = ?1", table)));
      COHORT_RETURN_IF_ERROR(clear.bind(job_id));
      COHORT_RETURN_IF_ERROR(clear.run());
    }
    COHORT_ASSIGN_OR_RETURN(SqliteStatement remove, db_->prepare("DELETE FROM jobs WHERE id = ?1"));
    COHORT_RETURN_IF_ERROR(remove.bind(job_id));
    return remove.run();
  });
}

}  // namespace cohort::coordinator
