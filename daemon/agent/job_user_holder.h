#pragma once

// JobUserHolder: which cohort owner the shared job_user serves on this node. Every owner without
// a user_map entry runs as the one Unix user job_user (cohort-job), and processes of one Unix user
// can read each other's /proc/<pid>/environ (COHORT_JOB_SECRET), signal and ptrace each other, and
// read and write each other's job directories and checkpoints. So by default job_user serves ONE
// owner per node: the first owner whose job runs as it holds it, recorded in a file under the
// agent's data directory so an agent restart keeps the hold; another owner's launch is refused
// (FAILED_PRECONDITION naming both owners, the user and the fix). An operator who accepts the
// sharing sets shared_job_user: true (then nothing is recorded or checked).
//
// Release: never automatic. What the holder left behind stays job_user's: its job directories,
// <data_dir>/jobs/<job id>, are removed only job_retention after their last write (the
// supervisor's sweep, remove_expired_job_dirs), and files its jobs wrote under the allowed path
// roots or anywhere else job_user may write are not tracked at all, so no moment is known when
// nothing of the holder remains; handing job_user to the next owner would hand them those too.
// The operator releases it by removing what job_user owns that the next owner must not see
// (`find / -xdev -user cohort-job`) and then the file, <data_dir>/job_user.holder.
//
// Example:
//   JobUserHolder holder("/var/lib/cohort", "cohort-job", /*shared=*/false);
//   COHORT_RETURN_IF_ERROR(holder.claim("alice"));  // alice holds cohort-job here from now on
//   holder.claim("bob");                            // FAILED_PRECONDITION: held by alice
//
// Thread-safe: claims are serialized (the check and the write are one step).

#include <mutex>
#include <optional>
#include <string>

#include "worker/base/status.h"

namespace cohort::agent {

// The file under the agent's data directory that names the owner holding job_user.
inline constexpr const char* kJobUserHolderFileName = "job_user.holder";
// Its mode: the agent's alone (owner names are not secret, but no job may plant or change one).
inline constexpr mode_t kJobUserHolderFileMode = 0600;
// An owner name longer than this in the file is a damaged file, not a name.
inline constexpr size_t kMaxJobUserHolderFileBytes = 4096;

class JobUserHolder {
 public:
  // `data_dir`: the agent's data directory (the file is <data_dir>/job_user.holder; the directory is
  // created if missing). `job_user`: named in errors. `shared`: the daemon config's shared_job_user.
  JobUserHolder(std::string data_dir, std::string job_user, bool shared);

  // OK when a job of `owner` may run as job_user on this node: job_user is shared, or `owner`
  // holds it already, or nobody does (then `owner` does from now on; the file is written
  // atomically, mode 0600, before this returns). FAILED_PRECONDITION naming both owners, job_user
  // and the fix when another owner holds it; the I/O error (with the path) when the file cannot be
  // read or written, so a damaged file refuses launches rather than being taken as "nobody".
  // INVALID_ARGUMENT for an empty `owner` (even when shared): "" would otherwise hold job_user for
  // every owner-less launch.
  // Blocking (file I/O); thread-safe.
  Status claim(const std::string& owner);

  // The owner recorded as holding job_user; nullopt when nobody does. Blocking (file I/O).
  StatusOr<std::optional<std::string>> holder() const;

  // <data_dir>/job_user.holder.
  std::string path() const;

 private:
  const std::string data_dir_;
  const std::string job_user_;
  const bool shared_;
  std::mutex mu_;  // serializes claim's read and write
};

}  // namespace cohort::agent
