#include "daemon/agent/unix_user.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

namespace cohort::agent {
namespace {

// getpwnam_r's buffer when sysconf gives no hint; it grows on ERANGE up to kMaxPasswdBuffer.
constexpr size_t kDefaultPasswdBuffer = 16 * 1024;
constexpr size_t kMaxPasswdBuffer = 1024 * 1024;

}  // namespace

StatusOr<UnixUser> lookup_unix_user(const std::string& name) {
  if (name.empty()) return invalid_argument_error("job user is empty; set job_user in the daemon config");
  long hint = ::sysconf(_SC_GETPW_R_SIZE_MAX);
  std::vector<char> buffer(hint > 0 ? static_cast<size_t>(hint) : kDefaultPasswdBuffer);
  passwd entry{};
  passwd* found = nullptr;
  int err = 0;
  while ((err = ::getpwnam_r(name.c_str(), &entry, buffer.data(), buffer.size(), &found)) == ERANGE &&
         buffer.size() < kMaxPasswdBuffer) {
    buffer.resize(buffer.size() * 2);
  }
  if (err != 0) return errno_status(fmt::format("getpwnam_r({})", name), err);
  if (found == nullptr) {
    return not_found_error(
        "job user '{}' does not exist on this node; create it (e.g. `useradd --system --no-create-home {}`; "
        "deploy/install-deps.sh creates the default, {}) or set job_user / user_map in the daemon config",
        name, name, kDefaultJobUser);
  }
  UnixUser user;
  user.name = name;
  user.uid = entry.pw_uid;
  user.gid = entry.pw_gid;
  int count = kMaxSupplementaryGroups;
  user.groups.resize(static_cast<size_t>(count));
  if (::getgrouplist(name.c_str(), entry.pw_gid, user.groups.data(), &count) < 0) {
    return failed_precondition_error("user '{}' is in more than {} groups (kMaxSupplementaryGroups)", name,
                                     kMaxSupplementaryGroups);
  }
  user.groups.resize(static_cast<size_t>(count));
  return user;
}

StatusOr<std::optional<UnixUser>> unix_user_for_job(const std::string& owner, const JobUserOptions& options) {
  if (::geteuid() != 0) {
    // An unprivileged agent cannot switch users: its ranks run as itself. A real uid of root behind
    // a non-root effective one would leave the ranks able to regain root, so refuse that too.
    if (::getuid() == 0) {
      return failed_precondition_error(
          "the agent's real uid is root but its effective uid is not; run cohortd as root (it then drops "
          "every job to an unprivileged user) or entirely as an unprivileged user");
    }
    // Its own uid owns the data directory's secrets, which the job could read through
    // COHORT_JOB_DIR/../..: only a single-user daemon may run jobs so.
    if (!options.run_jobs_as_daemon_user) {
      return failed_precondition_error(
          "cannot run the job of owner '{}': this agent is not root (uid {}), so the job would run as the "
          "agent's own uid and could read its data directory {} (the cluster CA key ca/ca.key, "
          "admin.credentials, the node key) and act as the operator; run cohortd as root (it then runs "
          "every job as an unprivileged user from user_map / job_user), or set run_jobs_as_daemon_user: "
          "true in the daemon config if every cohort user may act as the operator",
          owner, ::geteuid(), options.data_dir.empty() ? std::string("(the daemon's data_dir)") : options.data_dir);
    }
    return std::optional<UnixUser>();
  }
  const std::map<std::string, std::string>& user_map = options.user_map;
  auto mapped = owner.empty() ? user_map.end() : user_map.find(owner);
  const std::string& name = mapped != user_map.end() ? mapped->second : options.job_user;
  StatusOr<UnixUser> user = lookup_unix_user(name);
  if (!user.ok()) {
    return failed_precondition_error("cannot run the job of owner '{}': {}", owner, user.status().message());
  }
  const bool root_group = std::find(user->groups.begin(), user->groups.end(), gid_t{0}) != user->groups.end();
  if (user->uid == 0 || user->gid == 0 || root_group) {
    return failed_precondition_error(
        "job user '{}' (for owner '{}') is root or in group root (uid {} gid {}); jobs never run as root: map "
        "the owner to an "
        "unprivileged user in user_map, or set job_user",
        name, owner, user->uid, user->gid);
  }
  return std::optional<UnixUser>(std::move(user).value());
}

}  // namespace cohort::agent
