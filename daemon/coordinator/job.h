#pragma once

// Job and JobEvent: the coordinator's record of one job and the entries of its event log. Plain
// value types; the spec stays in its wire form (cohort::v1::JobSpec, a protobuf message and no
// gRPC type) because it is a deep tree the coordinator only validates, stores and hands on.

#include <cstdint>
#include <optional>
#include <string>

#include "cohort/v1/job.pb.h"
#include "daemon/coordinator/job_state_machine.h"
#include "daemon/coordinator/placement.h"

namespace cohort::coordinator {

// Training progress, as a worker reports it.
struct Metrics {
  int64_t step = 0;          // optimizer steps so far
  int epoch = 0;             // current epoch, 0-based
  double loss = 0;           // latest training loss
  double accuracy = 0;       // latest evaluation accuracy in [0, 1]
  double samples_per_s = 0;  // throughput over all ranks
  int rank = 0;              // the reporting rank
  // What the reporter knows of the whole run, for the CLI's progress bar and ETA (0: unknown).
  int64_t total_steps = 0;       // optimizer steps the run takes
  int total_epochs = 0;          // epochs the run takes
  int64_t samples_per_step = 0;  // samples one step consumes over all ranks
  // Communication wait of the reporting rank (0: unknown). Every field is stored with each report
  // (JobStore::append_metrics) and in the job's last metrics, so the history shows them after a restart.
  double comm_wait_s = 0;      // seconds blocked in collectives this attempt, cumulative
  double comm_wait_ratio = 0;  // share of wall time blocked in collectives since its last report
};

struct Job {
  std::string id;                       // "<name>-<seq>"
  std::string owner;                    // the submitting user; only they or an admin act on it
  int64_t seq = 0;                      // submission number: FIFO order and id suffix
  cohort::v1::JobSpec spec;             // as submitted (validated)
  JobStateMachine machine;              // state, attempt, reason
  Placement placement;                  // the current (or last) attempt's
  int64_t submit_unix_ms = 0;           // when submitted
  int64_t start_unix_ms = 0;            // when the latest attempt started RUNNING (0: never)
  int64_t end_unix_ms = 0;              // when it reached a final state (0: not yet)
  std::optional<Metrics> last_metrics;  // the newest report (kept across restarts)
  std::string waiting_for;              // while PENDING: what placement waits for (not persisted)

  JobState state() const { return machine.state(); }
  int attempt() const { return machine.attempt(); }
};

struct JobEvent {
  enum class Kind { kStateChange, kMetrics };

  int64_t seq = 0;  // coordinator-wide, increasing: watchers resume after the last one seen
  std::string job_id;
  int64_t unix_ms = 0;
  Kind kind = Kind::kStateChange;
  JobTransition change;  // kStateChange (from == to == PENDING for the submission)
  Metrics metrics;       // kMetrics
};

}  // namespace cohort::coordinator
