#pragma once

// ConfinedDir: a directory the agent writes into (its log tree, its job directories) without ever
// following a symbolic link below it. Every path below the root is walked one component at a time
// with openat(O_NOFOLLOW | O_DIRECTORY) from an open descriptor, so a link planted anywhere in the
// tree (e.g. logs/<job> -> /etc) makes the call fail instead of writing where it points, and a
// name is checked to be one component (no "/", no "..") before it is used.
//
// The root's own path comes from the daemon config (an operator's choice) and is opened as given.
//
// Example:
//   COHORT_ASSIGN_OR_RETURN(ConfinedDir logs, ConfinedDir::open("/var/lib/cohort/logs", 0711));
//   COHORT_ASSIGN_OR_RETURN(ConfinedDir attempt, logs.subdir({"job-1", "attempt-1"}, 0711));
//   COHORT_RETURN_IF_ERROR(attempt.write_file_atomically("job_spec.pb", bytes, 0400, owner));

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// A file's owner to set (uid, gid).
struct FileOwner {
  uid_t uid = 0;
  gid_t gid = 0;
};

// Move-only; the descriptor is closed with the object. Thread-compatible.
class ConfinedDir {
 public:
  // Opens the directory at `path`, creating it and its missing parents with `mode` (the mode is
  // set only on directories this call creates). Blocking.
  static StatusOr<ConfinedDir> open(const std::string& path, mode_t mode);

  ConfinedDir(ConfinedDir&& other) noexcept
      : fd_(std::exchange(other.fd_, -1)), path_(std::move(other.path_)) {}
  ConfinedDir& operator=(ConfinedDir&& other) noexcept;
  ConfinedDir(const ConfinedDir&) = delete;
  ConfinedDir& operator=(const ConfinedDir&) = delete;
  ~ConfinedDir();

  const std::string& path() const { return path_; }
  int fd() const { return fd_; }

  // Opens (creating where missing) the directory `components` below this one; each component's
  // mode is set to `mode`. A component that is a symbolic link or not a directory fails, naming
  // the path. Blocking.
  StatusOr<ConfinedDir> subdir(const std::vector<std::string>& components, mode_t mode) const;

  // openat(name, flags | O_NOFOLLOW | O_CLOEXEC, mode) in this directory; the caller owns the
  // descriptor. Blocking.
  StatusOr<int> open_file(const std::string& name, int flags, mode_t mode) const;

  // Replaces `name` with `bytes` so that a reader sees the old file or the new one, never a part:
  // writes a temporary file with a unique name created exclusively (O_EXCL), sets its mode and
  // owner, then renames it over `name`. Blocking.
  Status write_file_atomically(const std::string& name, std::string_view bytes, mode_t mode,
                               std::optional<FileOwner> owner) const;

  // fchown / fchmod of this directory itself.
  Status set_owner(FileOwner owner) const;
  Status set_mode(mode_t mode) const;

 private:
  ConfinedDir(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  int fd_ = -1;
  std::string path_;  // for messages
};

// OK when `name` is one path component: non-empty, not "." or "..", without '/' or NUL, at most
// NAME_MAX bytes. INVALID_ARGUMENT naming it otherwise.
Status validate_path_component(const std::string& name);

}  // namespace cohort::agent
