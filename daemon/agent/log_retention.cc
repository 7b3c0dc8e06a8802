#include "daemon/agent/log_retention.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <system_error>
#include <tuple>
#include <utility>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "daemon/agent/confined_dir.h"
#include "daemon/agent/job_id.h"
#include "daemon/agent/log_capture.h"

namespace cohort::agent {
namespace {

namespace fs = std::filesystem;

int64_t mtime_unix_ms(const struct stat& info) {
  return static_cast<int64_t>(info.st_mtim.tv_sec) * 1000 + info.st_mtim.tv_nsec / 1000000;
}

// The newest modification time (Unix ms) of `dir` and of everything below it, links not followed.
int64_t newest_write_unix_ms(const fs::path& dir) {
  struct stat info {};
  int64_t newest = ::lstat(dir.c_str(), &info) == 0 ? mtime_unix_ms(info) : 0;
  std::error_code error;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, error), end;
       !error && it != end; it.increment(error)) {
    if (::lstat(it->path().c_str(), &info) == 0) newest = std::max(newest, mtime_unix_ms(info));
  }
  return newest;
}

// One rank log file of one of a job's other attempts, as reserve_attempt_logs orders them.
struct RankLogFile {
  int attempt = 0;       // 0: the job directory itself (logs from before attempts had directories)
  bool current = false;  // <name> (newer output) rather than the rotated <name>.1
  int rank = 0;
  size_t dir = 0;        // index of its directory in the caller's list
  std::string name;      // in its directory
  uint64_t bytes = 0;

  // Oldest output first: attempt by attempt, each attempt's rotated files before its current ones.
  bool operator<(const RankLogFile& other) const {
    return std::tie(attempt, current, rank) < std::tie(other.attempt, other.current, other.rank);
  }
};

// "attempt-<n>" with n > 0 written as the agent writes it; nullopt for any other name.
std::optional<int> parse_attempt_dir(const std::string& name) {
  int attempt = 0;
  if (std::sscanf(name.c_str(), "attempt-%d", &attempt) != 1 || attempt <= 0) return std::nullopt;
  if (name != fmt::format("attempt-{}", attempt)) return std::nullopt;
  return attempt;
}

// "rank-<n>.log" (current) or "rank-<n>.log.1" (rotated) → (rank, current); nullopt otherwise.
std::optional<std::pair<int, bool>> parse_rank_log(const std::string& name) {
  int rank = -1;
  if (std::sscanf(name.c_str(), "rank-%d.log", &rank) != 1 || rank < 0) return std::nullopt;
  const std::string current = fmt::format("rank-{}.log", rank);
  if (name == current) return std::make_pair(rank, true);
  if (name == current + kRotatedLogSuffix) return std::make_pair(rank, false);
  return std::nullopt;
}

// The rank log files directly in `dir` (regular files only, links not followed).
void list_rank_logs(const ConfinedDir& dir, int attempt, size_t dir_index, std::vector<RankLogFile>* out) {
  std::error_code error;
  for (fs::directory_iterator it(dir.path(), error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    std::optional<std::pair<int, bool>> rank_log = parse_rank_log(name);
    struct stat info {};
    if (!rank_log || ::fstatat(dir.fd(), name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(info.st_mode)) {
      continue;
    }
    out->push_back(RankLogFile{attempt, rank_log->second, rank_log->first, dir_index, name,
                               static_cast<uint64_t>(info.st_size)});
  }
}

}  // namespace

StatusOr<AttemptLogBudget> reserve_attempt_logs(const std::string& log_dir, const std::string& job_id, int attempt,
                                                uint64_t max_job_bytes) {
  COHORT_RETURN_IF_ERROR(validate_job_id(job_id, "log cap"));
  if (attempt <= 0) return invalid_argument_error("log cap of job {}: attempt {} must be positive", job_id, attempt);
  AttemptLogBudget budget;
  if (max_job_bytes == 0) return budget;  // no cap
  COHORT_ASSIGN_OR_RETURN(ConfinedDir root, ConfinedDir::open(log_dir, kLogDirectoryMode));
  std::vector<ConfinedDir> dirs;  // [0]: the job's directory, then its other attempts' directories
  COHORT_ASSIGN_OR_RETURN(ConfinedDir job_dir, root.subdir({job_id}, kLogDirectoryMode));
  dirs.push_back(std::move(job_dir));
  std::vector<RankLogFile> files;
  list_rank_logs(dirs[0], 0, 0, &files);
  std::error_code error;
  for (fs::directory_iterator it(dirs[0].path(), error), end; !error && it != end; it.increment(error)) {
    const std::optional<int> other = parse_attempt_dir(it->path().filename().string());
    if (!other || *other == attempt) continue;
    // subdir refuses a link: such an entry is not the agent's and is left alone.
    StatusOr<ConfinedDir> attempt_dir = dirs[0].subdir({it->path().filename().string()}, kLogDirectoryMode);
    if (!attempt_dir.ok()) {
      spdlog::warn("agent: log cap of job {}: skipping {}: {}", job_id, it->path().string(),
                   attempt_dir.status().to_string());
      continue;
    }
    dirs.push_back(std::move(attempt_dir).value());
    list_rank_logs(dirs.back(), *other, dirs.size() - 1, &files);
  }
  if (error) return unavailable_error("log cap of job {}: cannot list {}: {}", job_id, dirs[0].path(), error.message());

  for (const RankLogFile& file : files) budget.older_bytes += file.bytes;
  std::sort(files.begin(), files.end());
  // Half the cap for the history, so the new attempt (the one people look at) has at least half.
  const uint64_t older_limit = max_job_bytes / 2;
  std::vector<bool> marked(dirs.size(), false);
  for (const RankLogFile& file : files) {
    if (budget.older_bytes <= older_limit) break;
    const ConfinedDir& dir = dirs[file.dir];
    const std::string path = dir.path() + "/" + file.name;
    if (::unlinkat(dir.fd(), file.name.c_str(), 0) != 0 && errno != ENOENT) {
      // Logged, not fatal: a launch does not fail over old logs; the next attempt tries again.
      spdlog::warn("agent: log cap of job {}: cannot remove {}: {}", job_id, path, std::strerror(errno));
      continue;
    }
    ::unlinkat(dir.fd(), (file.name + kLogTimesSuffix).c_str(), 0);  // its index; may not exist
    budget.older_bytes -= file.bytes;
    budget.removed.push_back(path);
    if (!marked[file.dir]) {
      marked[file.dir] = true;
      Status marker = dir.write_file_atomically(
          kLogsRemovedMarker,
          fmt::format("Rank logs here were removed, oldest output first, to keep the logs of job {} on this node "
                      "within max_log_bytes_per_job = {} bytes when attempt {} started.\n",
                      job_id, max_job_bytes, attempt),
          kLogFileMode, std::nullopt);
      if (!marker.ok()) spdlog::warn("agent: log cap of job {}: {}", job_id, marker.to_string());
    }
  }
  budget.attempt_bytes = max_job_bytes - std::min(budget.older_bytes, older_limit);
  if (!budget.removed.empty()) {
    spdlog::info("agent: job {} attempt {}: removed {} older log file(s) to stay within {} bytes; {} bytes kept",
                 job_id, attempt, budget.removed.size(), max_job_bytes, budget.older_bytes);
  }
  return budget;
}

namespace {

// One directory level of remove_tree_at; `depth` counts levels below the tree's top.
Status remove_tree_level(int parent_fd, const std::string& name, const std::string& path, int depth) {
  if (::unlinkat(parent_fd, name.c_str(), 0) == 0 || errno == ENOENT) return ok_status();
  if (errno != EISDIR) return errno_status(fmt::format("unlink({})", path), errno);
  if (depth > kMaxRemoveDepth) {
    return failed_precondition_error("{} lies more than {} directories deep; remove it by hand (rm -rf)", path,
                                     kMaxRemoveDepth);
  }
  // Never through a link: a job's user may have swapped the directory for one since it was listed.
  const int fd = ::openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return ok_status();
    return errno_status(fmt::format("open({})", path), errno);
  }
  // Take the directory over, through its descriptor, so its entries can be removed: the job's user
  // owns it (possibly mode 0500), and cohortd.service gives root no CAP_DAC_OVERRIDE, only
  // CAP_CHOWN and CAP_FOWNER. Nothing is lost: the whole tree goes.
  struct stat info {};
  // Where it fails, the unlinks below fail and say so.
  if (::fstat(fd, &info) == 0) {
    if (info.st_uid != ::geteuid() && ::fchown(fd, ::geteuid(), static_cast<gid_t>(-1)) != 0) {
      spdlog::debug("agent: fchown({}): {}", path, std::strerror(errno));
    }
    if ((info.st_mode & 0700) != 0700 && ::fchmod(fd, 0700) != 0) {
      spdlog::debug("agent: fchmod({}): {}", path, std::strerror(errno));
    }
  }
  DIR* dir = ::fdopendir(fd);
  if (dir == nullptr) {
    const int err = errno;
    ::close(fd);
    return errno_status(fmt::format("fdopendir({})", path), err);
  }
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string child = entry->d_name;
    if (child != "." && child != "..") names.push_back(child);
  }
  Status first_error;
  for (const std::string& child : names) {
    Status removed = remove_tree_level(::dirfd(dir), child, path + "/" + child, depth + 1);
    if (!removed.ok() && first_error.ok()) first_error = removed;
  }
  ::closedir(dir);
  COHORT_RETURN_IF_ERROR(first_error);
  if (::unlinkat(parent_fd, name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT) {
    return errno_status(fmt::format("rmdir({})", path), errno);
  }
  return ok_status();
}

// remove_expired_job_logs / remove_expired_job_dirs: `what` names the kind in messages.
StatusOr<std::vector<std::string>> remove_expired_dirs(const LogRetentionOptions& options, int64_t now_unix_ms,
                                                       const std::set<std::string>& running, const char* what) {
  if (options.log_dir.empty()) return invalid_argument_error("{} retention needs the directory", what);
  if (options.retention.count() <= 0)
    return invalid_argument_error("{} retention is {} ms; it must be positive", what, options.retention.count());
  std::vector<std::string> removed;
  std::error_code error;
  if (!fs::is_directory(options.log_dir, error)) return removed;
  const int root_fd = ::open(options.log_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (root_fd < 0) return errno_status(fmt::format("{} retention: open({})", what, options.log_dir), errno);
  for (fs::directory_iterator it(options.log_dir, error), end; !error && it != end; it.increment(error)) {
    const std::string job_id = it->path().filename().string();
    // Only job directories: nothing else that happens to lie there, and never through a link.
    std::error_code kind_error;
    if (!it->is_directory(kind_error) || it->is_symlink(kind_error)) continue;
    if (!validate_job_id(job_id, "retention").ok() || running.count(job_id) != 0) continue;
    const int64_t last_write = newest_write_unix_ms(it->path());
    if (now_unix_ms - last_write < options.retention.count()) continue;
    if (Status gone = remove_tree_at(root_fd, job_id, it->path().string()); !gone.ok()) {
      spdlog::warn("agent: cannot delete the {} of job {} ({}) after their retention period: {}", what, job_id,
                   it->path().string(), gone.to_string());
      continue;
    }
    removed.push_back(job_id);
  }
  ::close(root_fd);
  if (error) {
    return unavailable_error("{} retention: cannot list {}: {}", what, options.log_dir, error.message());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace

Status remove_tree_at(int parent_fd, const std::string& name, const std::string& path) {
  COHORT_RETURN_IF_ERROR(validate_path_component(name));
  return remove_tree_level(parent_fd, name, path, 0);
}

StatusOr<std::vector<std::string>> remove_expired_job_logs(const LogRetentionOptions& options,
                                                           int64_t now_unix_ms,
                                                           const std::set<std::string>& running) {
  return remove_expired_dirs(options, now_unix_ms, running, "logs");
}

StatusOr<std::vector<std::string>> remove_expired_job_dirs(const LogRetentionOptions& options, int64_t now_unix_ms,
                                                           const std::set<std::string>& running) {
  return remove_expired_dirs(options, now_unix_ms, running, "job directory");
}

}  // namespace cohort::agent
