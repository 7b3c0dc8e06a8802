#pragma once

// Log retention on an agent, in time and in space.
//
// Time: a finished job's rank logs (<log_dir>/<job_id>/, every attempt) are
// kept for the retention period (daemon config job_retention, the same period the coordinator
// keeps the job's records for), counted from the last write to any of the job's files on this node,
// then the whole directory is deleted. Jobs with a task still running here are never touched.
//
// The same retention applies to the jobs' own directories (<data_dir>/jobs/<job_id>: COHORT_JOB_DIR,
// the ranks' working directory, where relative checkpoints and scratch land): without it every
// job's files would stay on the filesystem that also holds coordinator.db and the logs until the
// disk filled. remove_expired_job_dirs() deletes them as remove_expired_job_logs() deletes logs.
// Both remove without following a link (remove_tree_at below): a job directory belongs to the
// job's user, who can plant or swap in a link at any moment.
//
// The agent's TaskSupervisor calls both every kLogRetentionSweepInterval with its clock's wall
// time; tests call them with any time they like.
//
//   LogRetentionOptions options{"/var/lib/cohort/logs", std::chrono::hours(24 * 7)};
//   StatusOr<std::vector<std::string>> removed =
//       remove_expired_job_logs(options, clock->unix_millis(), supervisor.running_jobs());
//
// Space: the rank logs of one job on a node, every attempt together, stay within the agent's
// max_log_bytes_per_job. An attempt's ranks share what the job's older attempts leave of the cap
// (LogCaptureOptions::max_file_bytes rotates each rank's file within its share), and before an
// attempt starts, reserve_attempt_logs() removes older attempts' files, oldest output first, until
// they keep at most half the cap: a job that restarts many times keeps the newest attempts'
// output, never restarts x cap. A first attempt has the whole cap.
//
//   COHORT_ASSIGN_OR_RETURN(AttemptLogBudget budget,
//                           reserve_attempt_logs("/var/lib/cohort/logs", "mlp-3", 4, 1 << 30));
//   per_rank_cap = budget.attempt_bytes / ranks_here;

#include <chrono>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// How often an agent looks for expired job logs: retention periods are hours or days, and each
// sweep walks the log directory.
inline constexpr std::chrono::minutes kLogRetentionSweepInterval{1};
// The default retention period: 7 days, as the coordinator keeps a finished job's records
// (coordinator::kDefaultJobRetention); daemon config job_retention sets both.
inline constexpr std::chrono::milliseconds kDefaultLogRetention = std::chrono::hours(24 * 7);

struct LogRetentionOptions {
  std::string log_dir;                  // holds one directory per job id
  std::chrono::milliseconds retention;  // a job's directory is kept this long after its last write
};

// Deletes every <log_dir>/<job_id> directory (named like a job id, not a link) whose newest file
// was last modified more than options.retention before `now_unix_ms`, except those in `running`.
// Returns the job ids removed, ascending. Entries that are not job directories are left alone. A
// directory that cannot be removed is logged and skipped (tried again at the next sweep).
// NOT_FOUND-free: a missing log_dir removes nothing. Blocking (disk).
StatusOr<std::vector<std::string>> remove_expired_job_logs(const LogRetentionOptions& options,
                                                           int64_t now_unix_ms,
                                                           const std::set<std::string>& running);

// The same for the jobs' own directories: every <options.log_dir>/<job_id> (here the job
// directory root, <data_dir>/jobs) quiet for options.retention and not in `running` is removed with
// everything below it, links never followed (a link inside is removed, its target stays). A
// directory or file the job's user owns is taken over first where needed (fchown to the agent,
// fchmod 0700 of the directory through its descriptor) so an agent without CAP_DAC_OVERRIDE can
// empty it. Returns the job ids removed, ascending; a directory that cannot be removed is logged
// and tried again at the next sweep. Blocking (disk).
StatusOr<std::vector<std::string>> remove_expired_job_dirs(const LogRetentionOptions& options, int64_t now_unix_ms,
                                                           const std::set<std::string>& running);

// Removes `name` in the open directory `parent_fd` and, when it is a directory, everything below
// it, without following a symbolic link: each directory is opened from its parent's descriptor
// with O_NOFOLLOW | O_DIRECTORY, and a link is unlinked itself. `path` is for messages only.
// A directory deeper than kMaxRemoveDepth below `name` fails (named), removing what it could.
inline constexpr int kMaxRemoveDepth = 128;  // one descriptor per level is held while walking
Status remove_tree_at(int parent_fd, const std::string& name, const std::string& path);

// Written into an attempt's log directory when the job's cap removed one of its ranks' log files
// (its content says why and which files); `cohort logs --attempt` then explains the missing logs.
inline constexpr const char* kLogsRemovedMarker = "logs_removed_by_cap";

// What reserve_attempt_logs left for a new attempt.
struct AttemptLogBudget {
  uint64_t attempt_bytes = 0;  // the new attempt's ranks here together may keep this many; 0: no cap
  uint64_t older_bytes = 0;    // rank log bytes the job's other attempts keep here after trimming
  std::vector<std::string> removed;  // the rank log files removed (paths), in removal order
};

// Makes room for attempt `attempt` (> 0) of `job_id` in <log_dir>/<job_id>/ under a cap of
// `max_job_bytes` for all the job's rank logs on this node (0: no cap, nothing is removed). The
// job's other attempts (attempt-<M>/, and the job directory itself for logs written before attempts
// had directories) are trimmed, oldest first — the lowest attempt's rotated files (<rank log>.1),
// then its current files, then the next attempt's — until they keep at most max_job_bytes / 2;
// each removed file's .times index goes with it, and the attempt's directory gets
// kLogsRemovedMarker. The new attempt gets the rest (at least half the cap). Only rank log files
// count (rank-<n>.log and .log.1); job_spec.pb and the indexes are small. Links are never followed.
// Call before the attempt's LogCaptures open; no rank of the job may be running here. Blocking (disk).
StatusOr<AttemptLogBudget> reserve_attempt_logs(const std::string& log_dir, const std::string& job_id, int attempt,
                                                uint64_t max_job_bytes);

}  // namespace cohort::agent
