#pragma once

// Where a command job's program is: the agent starts ranks with execve, which takes a path, so a
// bare name such as `python3` is looked up here the way a shell would (execvp's rules), in the
// PATH the ranks will see. Looking it up before the launch turns "not found" into an error that
// names the command and the directories searched, instead of a rank that dies at exec.
//
//   StatusOr<std::string> path = find_executable("python3", "/usr/local/bin:/usr/bin:/bin");
//   // "/usr/bin/python3"
//
// Reads the file system (stat, access); thread-safe.

#include <sys/types.h>

#include <optional>
#include <string>

#include "worker/base/status.h"

namespace cohort::agent {

// The PATH used when neither the job's env nor the agent's environment has one.
inline constexpr const char* kDefaultSearchPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

// Whose permissions the search uses: the job's user, not the agent's (root could see and "execute"
// files the job's user cannot reach).
struct SearchIdentity {
  uid_t uid = 0;
  gid_t gid = 0;
};

// `name` itself when it contains a '/' (absolute, or relative to the working directory: left to
// execve); else the first `<dir>/<name>` along `search_path` that is a regular file `as` may
// execute (checked with the calling thread's file-system identity switched to `as` with
// setfsuid/setfsgid, so directories it cannot search are skipped too; its supplementary groups
// are not considered). Without `as`, the agent's own permissions. NOT_FOUND naming the command
// and the directories searched otherwise.
StatusOr<std::string> find_executable(const std::string& name, const std::string& search_path,
                                      std::optional<SearchIdentity> as = std::nullopt);

}  // namespace cohort::agent
