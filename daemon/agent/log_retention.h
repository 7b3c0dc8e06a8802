#pragma once

// Log retention on an agent: a finished job's rank logs (<log_dir>/<job_id>/, every attempt) are
// kept for the retention period (daemon config job_retention, the same period the coordinator
// keeps the job's records for), counted from the last write to any of the job's files on this node,
// then the whole directory is deleted. Jobs with a task still running here are never touched.
//
// The agent's TaskSupervisor calls remove_expired_job_logs() every kLogRetentionSweepInterval
// with its clock's wall time; tests call it with any time they like.
//
//   LogRetentionOptions options{"/var/lib/cohort/logs", std::chrono::hours(24 * 7)};
//   StatusOr<std::vector<std::string>> removed =
//       remove_expired_job_logs(options, clock->unix_millis(), supervisor.running_jobs());

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

}  // namespace cohort::agent
