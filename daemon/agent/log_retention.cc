#include "daemon/agent/log_retention.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include <spdlog/spdlog.h>

#include "daemon/agent/job_id.h"

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

}  // namespace

StatusOr<std::vector<std::string>> remove_expired_job_logs(const LogRetentionOptions& options,
                                                           int64_t now_unix_ms,
                                                           const std::set<std::string>& running) {
  if (options.log_dir.empty()) return invalid_argument_error("log retention needs the log directory");
  if (options.retention.count() <= 0)
    return invalid_argument_error("log retention is {} ms; it must be positive", options.retention.count());
  std::vector<std::string> removed;
  std::error_code error;
  if (!fs::is_directory(options.log_dir, error)) return removed;
  for (fs::directory_iterator it(options.log_dir, error), end; !error && it != end; it.increment(error)) {
    const std::string job_id = it->path().filename().string();
    // Only job directories: nothing else that happens to lie there, and never through a link.
    std::error_code kind_error;
    if (!it->is_directory(kind_error) || it->is_symlink(kind_error)) continue;
    if (!validate_job_id(job_id, "log directory").ok() || running.count(job_id) != 0) continue;
    const int64_t last_write = newest_write_unix_ms(it->path());
    if (now_unix_ms - last_write < options.retention.count()) continue;
    std::error_code remove_error;
    fs::remove_all(it->path(), remove_error);  // removes links themselves, never their targets
    if (remove_error) {
      spdlog::warn("agent: cannot delete the logs of job {} ({}) after their retention period: {}", job_id,
                   it->path().string(), remove_error.message());
      continue;
    }
    removed.push_back(job_id);
  }
  if (error) {
    return unavailable_error("log retention: cannot list {}: {}", options.log_dir, error.message());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace cohort::agent
