#include "daemon/agent/executable_path.h"

#include <fcntl.h>
#include <sys/fsuid.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cohort::agent {

namespace {

// Switches this thread's file-system uid/gid (Linux keeps them per thread) for the scope, so that
// permission checks are the job user's; the agent's capabilities for file access drop with a
// non-zero fsuid and come back on restore.
class ScopedFsIdentity {
 public:
  explicit ScopedFsIdentity(std::optional<SearchIdentity> as) : active_(as.has_value()) {
    if (!active_) return;
    old_gid_ = static_cast<gid_t>(::setfsgid(as->gid));
    old_uid_ = static_cast<uid_t>(::setfsuid(as->uid));
  }
  ~ScopedFsIdentity() {
    if (!active_) return;
    ::setfsuid(old_uid_);
    ::setfsgid(old_gid_);
  }
  ScopedFsIdentity(const ScopedFsIdentity&) = delete;
  ScopedFsIdentity& operator=(const ScopedFsIdentity&) = delete;

 private:
  bool active_;
  uid_t old_uid_ = 0;
  gid_t old_gid_ = 0;
};

}  // namespace

StatusOr<std::string> find_executable(const std::string& name, const std::string& search_path,
                                      std::optional<SearchIdentity> as) {
  if (name.empty()) return invalid_argument_error("the command's program (command[0]) is empty");
  if (name.find('/') != std::string::npos) return name;
  ScopedFsIdentity identity(as);
  std::vector<std::string> searched;
  std::istringstream in(search_path);
  for (std::string dir; std::getline(in, dir, ':');) {
    // An empty PATH entry means the working directory to a shell; a daemon has no meaningful
    // one, so it is skipped rather than searched.
    if (dir.empty() || dir.front() != '/') continue;
    searched.push_back(dir);
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
        ::faccessat(AT_FDCWD, candidate.c_str(), X_OK, AT_EACCESS) == 0) {
      return candidate;
    }
  }
  return not_found_error(
      "command {:?} was not found in PATH ({}); give its absolute path in command[0], or set PATH in the job's env",
      name, searched.empty() ? std::string("no absolute directories") : fmt::format("{}", fmt::join(searched, ":")));
}

}  // namespace cohort::agent
