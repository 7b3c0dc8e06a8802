// remove_expired_job_logs over a real directory whose files get chosen modification times
// (utimensat), against an explicit "now": expired job directories go, recent ones, running jobs,
// non-job entries and link targets stay; the newest file of a job decides.

#include "daemon/agent/log_retention.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"

namespace cohort::agent {
namespace {

namespace fs = std::filesystem;
using coordinator::testing::TempDir;
using std::chrono::hours;
using std::chrono::milliseconds;

constexpr int64_t kNow = 1'800'000'000'000;  // an arbitrary "now" (Unix ms)
constexpr milliseconds kRetention = hours(24 * 7);

// Writes `path` (creating its directories) and sets its modification time to `unix_ms`.
void write_at(const fs::path& path, int64_t unix_ms) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "output\n";
  const struct timespec times[2] = {{unix_ms / 1000, (unix_ms % 1000) * 1000000},
                                    {unix_ms / 1000, (unix_ms % 1000) * 1000000}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// Sets a directory's own modification time (creating files changed it).
void touch_dir_at(const fs::path& dir, int64_t unix_ms) {
  const struct timespec times[2] = {{unix_ms / 1000, 0}, {unix_ms / 1000, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, dir.c_str(), times, 0), 0) << dir;
}

TEST(LogRetentionTest, RemovesOnlyJobDirectoriesQuietForTheWholePeriod) {
  TempDir dir;
  const fs::path logs = fs::path(dir.path()) / "logs";
  const int64_t old = kNow - kRetention.count() - 1;
  const int64_t recent = kNow - kRetention.count() + 60'000;
  write_at(logs / "old-1" / "attempt-1" / "rank-0.log", old);
  write_at(logs / "old-1" / "attempt-1" / "rank-0.log.times", old);
  write_at(logs / "mixed-2" / "attempt-1" / "rank-0.log", old);
  write_at(logs / "mixed-2" / "attempt-2" / "rank-0.log", recent);  // the newest write counts
  write_at(logs / "running-3" / "rank-0.log", old);
  write_at(logs / "stray.txt", old);
  write_at(logs / "not a job" / "file", old);
  write_at(fs::path(dir.path()) / "elsewhere" / "keep.log", old);
  fs::create_directory_symlink(fs::path(dir.path()) / "elsewhere", logs / "link-4");
  for (const char* job : {"old-1", "old-1/attempt-1", "mixed-2", "mixed-2/attempt-1", "running-3", "not a job"})
    touch_dir_at(logs / job, old);
  touch_dir_at(logs / "mixed-2" / "attempt-2", recent);

  StatusOr<std::vector<std::string>> removed =
      remove_expired_job_logs({logs.string(), kRetention}, kNow, /*running=*/{"running-3"});
  ASSERT_TRUE(removed.ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, std::vector<std::string>{"old-1"});
  EXPECT_FALSE(fs::exists(logs / "old-1"));
  EXPECT_TRUE(fs::exists(logs / "mixed-2" / "attempt-1" / "rank-0.log"));
  EXPECT_TRUE(fs::exists(logs / "running-3" / "rank-0.log"));
  EXPECT_TRUE(fs::exists(logs / "stray.txt"));
  EXPECT_TRUE(fs::exists(logs / "not a job" / "file"));
  EXPECT_TRUE(fs::is_symlink(logs / "link-4"));
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "elsewhere" / "keep.log"));

  // A week after mixed-2's last write it goes too; running-3 stays while it runs, then goes.
  removed = remove_expired_job_logs({logs.string(), kRetention}, recent + kRetention.count(), {"running-3"});
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"mixed-2"});
  removed = remove_expired_job_logs({logs.string(), kRetention}, recent + kRetention.count(), {});
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"running-3"});
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / "elsewhere" / "keep.log"));
}

TEST(LogRetentionTest, MissingDirectoryRemovesNothingAndBadOptionsAreErrors) {
  TempDir dir;
  StatusOr<std::vector<std::string>> removed =
      remove_expired_job_logs({dir.path() + "/absent", kRetention}, kNow, {});
  ASSERT_TRUE(removed.ok()) << removed.status().to_string();
  EXPECT_TRUE(removed->empty());
  EXPECT_FALSE(remove_expired_job_logs({dir.path(), milliseconds(0)}, kNow, {}).ok());
  EXPECT_FALSE(remove_expired_job_logs({"", kRetention}, kNow, {}).ok());
}

}  // namespace
}  // namespace cohort::agent
