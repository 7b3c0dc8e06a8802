#include "daemon/agent/executable_path.h"

#include <sys/stat.h>

#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cohort::agent {

StatusOr<std::string> find_executable(const std::string& name, const std::string& search_path) {
  if (name.empty()) return invalid_argument_error("the command's program (command[0]) is empty");
  if (name.find('/') != std::string::npos) return name;
  std::vector<std::string> searched;
  std::istringstream in(search_path);
  for (std::string dir; std::getline(in, dir, ':');) {
    // An empty PATH entry means the working directory to a shell; a daemon has no meaningful
    // one, so it is skipped rather than searched.
    if (dir.empty() || dir.front() != '/') continue;
    searched.push_back(dir);
    const std::string candidate = dir + "/" + name;
    struct stat info {};
    if (::stat(candidate.c_str(), &info) == 0 && S_ISREG(info.st_mode) && (info.st_mode & 0111) != 0) {
      return candidate;
    }
  }
  return not_found_error(
      "command {:?} was not found in PATH ({}); give its absolute path in command[0], or set PATH in the job's env",
      name, searched.empty() ? std::string("no absolute directories") : fmt::format("{}", fmt::join(searched, ":")));
}

}  // namespace cohort::agent
