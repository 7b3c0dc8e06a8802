#pragma once

// UnixUser: the Unix account a job's ranks run as. An agent running as root never runs a job as
// root: it maps the job's owner (a cohort user) through the daemon config's user_map, else uses the
// default job user (cohort-job), and the launcher switches to that account in the child before
// exec. An agent that is not root cannot switch, so its ranks would run as the agent's own user,
// which owns the data directory's secrets (the cluster CA key, admin.credentials, the node key):
// any job could then act as the operator. So it runs jobs only when told the daemon is
// single-user (run_jobs_as_daemon_user: the embedded `cohort run` cluster, or the config key).
//
// Example:
//   JobUserOptions options;
//   options.user_map = {{"alice", "alice"}};
//   COHORT_ASSIGN_OR_RETURN(std::optional<UnixUser> run_as, unix_user_for_job("alice", options));
//   launch_options.run_as = run_as;  // nullopt: keep the agent's own user

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// The default job user; deploy/install-deps.sh creates it.
inline constexpr const char* kDefaultJobUser = "cohort-job";
// How an operator creates the default job user (named in the error when it is missing).
inline constexpr const char* kCreateJobUserCommand = "useradd --system --no-create-home cohort-job";
// Supplementary groups taken over from the group database per user; more is a broken database.
inline constexpr int kMaxSupplementaryGroups = 1024;

struct UnixUser {
  std::string name;
  uid_t uid = 0;
  gid_t gid = 0;                // primary group
  std::vector<gid_t> groups;    // supplementary groups (from /etc/group), primary included
};

// Looks `name` up in the user database (getpwnam_r, getgrouplist). NOT_FOUND names the user and
// how to create it. Blocking (NSS may ask a directory service).
StatusOr<UnixUser> lookup_unix_user(const std::string& name);

struct JobUserOptions {
  std::string job_user = kDefaultJobUser;       // for owners without a user_map entry
  std::map<std::string, std::string> user_map;  // cohort user -> Unix user
  // An agent that is not root runs jobs as its own uid only when this is set (every cohort user
  // may act as the operator: `cohort run`, or a single-user daemon).
  bool run_jobs_as_daemon_user = false;
  std::string data_dir;  // the agent's data directory, named in errors
};

// Who the ranks of `owner`'s job run as. Running as root: user_map[owner] if present, else
// `job_user`, looked up; FAILED_PRECONDITION when that user is missing or is root (uid 0).
// Not root: nullopt (the ranks keep the agent's user, which cannot switch) when
// run_jobs_as_daemon_user, else FAILED_PRECONDITION naming the uid, the risk and the two ways out.
// An empty owner has no mapping. Blocking (the lookup).
StatusOr<std::optional<UnixUser>> unix_user_for_job(const std::string& owner, const JobUserOptions& options);

}  // namespace cohort::agent
