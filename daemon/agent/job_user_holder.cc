#include "daemon/agent/job_user_holder.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <utility>

#include <fmt/format.h>

#include "daemon/agent/confined_dir.h"

namespace cohort::agent {
namespace {

// The data directory's mode when the holder creates it (cohortd's layout: searchable, not listable).
constexpr mode_t kDataDirMode = 0711;

}  // namespace

JobUserHolder::JobUserHolder(std::string data_dir, std::string job_user, bool shared)
    : data_dir_(std::move(data_dir)), job_user_(std::move(job_user)), shared_(shared) {}

std::string JobUserHolder::path() const { return data_dir_ + "/" + kJobUserHolderFileName; }

StatusOr<std::optional<std::string>> JobUserHolder::holder() const {
  COHORT_ASSIGN_OR_RETURN(ConfinedDir dir, ConfinedDir::open(data_dir_, kDataDirMode));
  StatusOr<int> fd = dir.open_file(kJobUserHolderFileName, O_RDONLY, 0);
  if (!fd.ok()) {
    if (fd.status().code() == StatusCode::kNotFound) return std::optional<std::string>();
    return fd.status().with_context(fmt::format("reading {}", path()));
  }
  std::string bytes;
  char buffer[512];
  for (;;) {
    const ssize_t n = ::read(*fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(*fd);
      return errno_status(fmt::format("read({})", path()), err);
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
    if (bytes.size() > kMaxJobUserHolderFileBytes) break;
  }
  ::close(*fd);
  // One owner name and a newline, as claim writes it; anything else was not written by the agent.
  if (bytes.empty() || bytes.back() != '\n' || bytes.size() > kMaxJobUserHolderFileBytes ||
      bytes.find('\n') != bytes.size() - 1) {
    return failed_precondition_error(
        "{} is damaged (not one owner name and a newline); write the owner who holds job_user '{}' into it, "
        "or remove it once nothing of that owner remains that {} can reach",
        path(), job_user_, job_user_);
  }
  bytes.pop_back();
  return std::optional<std::string>(std::move(bytes));
}

Status JobUserHolder::claim(const std::string& owner) {
  // An owner-less launch (an older coordinator's) would record "" and then every other owner-less
  // launch would share job_user with it while every real owner is refused.
  if (owner.empty()) {
    // The caller's context names the job (AgentService: "LaunchTasks for job '<id>' on node <n>").
    return invalid_argument_error(
        "the launch names no owner, so it cannot run as job_user '{}' (a coordinator older than this agent "
        "sends launches without one; upgrade the coordinator)",
        job_user_);
  }
  if (shared_) return ok_status();
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(std::optional<std::string> held, holder());
  if (held.has_value()) {
    if (*held == owner) return ok_status();
    return failed_precondition_error(
        "owner '{}' cannot run jobs as job_user '{}' on this node: owner '{}' holds it (recorded in {}), and "
        "jobs of one Unix user can read and signal each other; map '{}' to their own Unix user in user_map, "
        "or set shared_job_user: true to accept that owners under job_user can read and signal each other's "
        "jobs",
        owner, job_user_, *held, path(), owner);
  }
  if (owner.find('\n') != std::string::npos) {
    return invalid_argument_error("owner {:?} has a newline; it cannot hold job_user '{}'", owner, job_user_);
  }
  COHORT_ASSIGN_OR_RETURN(ConfinedDir dir, ConfinedDir::open(data_dir_, kDataDirMode));
  return dir.write_file_atomically(kJobUserHolderFileName, owner + "\n", kJobUserHolderFileMode, std::nullopt)
      .with_context(fmt::format("recording that owner '{}' holds job_user '{}'", owner, job_user_));
}

}  // namespace cohort::agent
