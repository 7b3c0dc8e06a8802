// remove_expired_job_logs over a real directory whose files get chosen modification times
// (utimensat), against an explicit "now": expired job directories go, recent ones, running jobs,
// non-job entries and link targets stay; the newest file of a job decides.
// reserve_attempt_logs over real files of chosen sizes: a job's older attempts are trimmed oldest
// first until the bytes on disk leave the new attempt its share of the job's cap.

#include "daemon/agent/log_retention.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

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

// Job directories (<data_dir>/jobs/<id>) go by the same rule, and the removal follows no link the
// job's user planted: a link to a directory outside (and one to a file) is removed, its target
// stays; a directory the job made read-only (0500) is still emptied and removed.
TEST(JobDirRetentionTest, ExpiredJobDirectoriesGoRunningOnesStayAndLinksAreNotFollowed) {
  TempDir dir;
  const fs::path jobs = fs::path(dir.path()) / "jobs";
  const fs::path outside = fs::path(dir.path()) / "outside";
  const int64_t old = kNow - kRetention.count() - 1;
  write_at(outside / "precious.pt", old);
  write_at(outside / "sub" / "also-precious", old);
  write_at(jobs / "done-1" / "checkpoint" / "iter-10.pt", old);
  write_at(jobs / "done-1" / "scratch" / "deep" / "a" / "b" / "file", old);
  fs::create_directory_symlink(outside, jobs / "done-1" / "link-to-outside");
  fs::create_directory_symlink(outside, jobs / "done-1" / "checkpoint" / "nested-link");
  fs::create_symlink(outside / "precious.pt", jobs / "done-1" / "file-link");
  write_at(jobs / "done-1" / "readonly" / "inside", old);
  write_at(jobs / "running-2" / "checkpoint" / "iter-5.pt", old);
  write_at(jobs / "recent-3" / "checkpoint" / "iter-5.pt", kNow - 60'000);
  fs::create_directory_symlink(outside, jobs / "link-4");  // not a job directory: left alone
  for (const char* sub : {"done-1/scratch/deep/a/b", "done-1/scratch/deep/a", "done-1/scratch/deep", "done-1/scratch",
                          "done-1/checkpoint", "done-1/readonly", "done-1", "running-2/checkpoint", "running-2"})
    touch_dir_at(jobs / sub, old);
  ASSERT_EQ(::chmod((jobs / "done-1" / "readonly").c_str(), 0500), 0);
  ASSERT_EQ(::chmod((jobs / "done-1").c_str(), 0500), 0);
  touch_dir_at(jobs / "done-1" / "readonly", old);
  touch_dir_at(jobs / "done-1", old);

  StatusOr<std::vector<std::string>> removed =
      remove_expired_job_dirs({jobs.string(), kRetention}, kNow, /*running=*/{"running-2"});
  ASSERT_TRUE(removed.ok()) << removed.status().to_string();
  EXPECT_EQ(*removed, std::vector<std::string>{"done-1"});
  EXPECT_FALSE(fs::exists(fs::symlink_status(jobs / "done-1")));
  EXPECT_TRUE(fs::exists(jobs / "running-2" / "checkpoint" / "iter-5.pt"));
  EXPECT_TRUE(fs::exists(jobs / "recent-3" / "checkpoint" / "iter-5.pt"));
  EXPECT_TRUE(fs::is_symlink(jobs / "link-4"));
  EXPECT_TRUE(fs::exists(outside / "precious.pt"));
  EXPECT_TRUE(fs::exists(outside / "sub" / "also-precious"));

  // Once it no longer runs, the running job's directory goes too.
  removed = remove_expired_job_dirs({jobs.string(), kRetention}, kNow, {});
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(*removed, std::vector<std::string>{"running-2"});
  EXPECT_TRUE(fs::exists(outside / "precious.pt"));
}

// As cohortd.service runs it: root with CAP_CHOWN and CAP_FOWNER but without CAP_DAC_OVERRIDE,
// so it may not unlink in a job user's 0700 (or 0500) directory until it took the directory over.
TEST(JobDirRetentionTest, RootWithoutDacOverrideEmptiesAJobUsersDirectories) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to hand the tree to another uid)";
  constexpr uid_t kJobUid = 65534;  // nobody
  TempDir dir;
  const fs::path jobs = fs::path(dir.path()) / "jobs";
  const int64_t old = kNow - kRetention.count() - 1;
  write_at(jobs / "done-1" / "checkpoint" / "iter-1.pt", old);
  write_at(jobs / "done-1" / "locked" / "inside", old);
  for (const auto& entry : fs::recursive_directory_iterator(jobs / "done-1"))
    ASSERT_EQ(::lchown(entry.path().c_str(), kJobUid, kJobUid), 0) << entry.path();
  ASSERT_EQ(::chown((jobs / "done-1").c_str(), kJobUid, kJobUid), 0);
  ASSERT_EQ(::chmod((jobs / "done-1" / "locked").c_str(), 0500), 0);
  ASSERT_EQ(::chmod((jobs / "done-1").c_str(), 0700), 0);
  for (const char* sub : {"done-1/checkpoint", "done-1/locked", "done-1"}) touch_dir_at(jobs / sub, old);

  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct caps[2] = {};
    if (::syscall(SYS_capget, &header, caps) != 0) ::_exit(10);
    caps[0].effective &= ~(1u << CAP_DAC_OVERRIDE);
    if (::syscall(SYS_capset, &header, caps) != 0) ::_exit(11);
    // Without the capability an unlink in the job user's directory is refused (the premise).
    if (::unlink((jobs / "done-1" / "checkpoint" / "iter-1.pt").c_str()) == 0 || errno != EACCES) ::_exit(12);
    StatusOr<std::vector<std::string>> removed = remove_expired_job_dirs({jobs.string(), kRetention}, kNow, {});
    if (!removed.ok()) ::_exit(13);
    ::_exit(removed->size() == 1 && !fs::exists(jobs / "done-1") ? 0 : 14);
  }
  int wait_status = 0;
  ASSERT_EQ(::waitpid(child, &wait_status, 0), child);
  ASSERT_TRUE(WIFEXITED(wait_status));
  EXPECT_EQ(WEXITSTATUS(wait_status), 0) << "10/11: capget/capset failed, 12: the premise does not hold, 13: "
                                             "error, 14: not removed";
  EXPECT_FALSE(fs::exists(jobs / "done-1"));
}

// remove_tree_at never follows the link it is given, nor one swapped in below.
TEST(JobDirRetentionTest, RemoveTreeAtRemovesALinkItselfAndRefusesBadNames) {
  TempDir dir;
  const fs::path root = fs::path(dir.path()) / "root";
  const fs::path outside = fs::path(dir.path()) / "outside";
  write_at(outside / "keep", kNow);
  fs::create_directories(root);
  fs::create_directory_symlink(outside, root / "job-1");
  const int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(remove_tree_at(fd, "job-1", (root / "job-1").string()).ok());
  EXPECT_FALSE(fs::exists(fs::symlink_status(root / "job-1")));
  EXPECT_TRUE(fs::exists(outside / "keep"));
  EXPECT_FALSE(remove_tree_at(fd, "..", (root / "..").string()).ok());
  EXPECT_FALSE(remove_tree_at(fd, "a/b", (root / "a/b").string()).ok());
  EXPECT_TRUE(fs::exists(outside / "keep"));
  ::close(fd);
}

// Writes `bytes` bytes to `path`, creating its directories.
void write_bytes(const fs::path& path, size_t bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << std::string(bytes, 'x');
}

// Bytes of rank log files (rank-<n>.log and .log.1) below `dir`, as the cap counts them.
uint64_t rank_log_bytes(const fs::path& dir) {
  uint64_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool rank_log = name.rfind("rank-", 0) == 0 && (ends_with(".log") || ends_with(".log.1"));
    if (entry.is_regular_file() && !entry.is_symlink() && rank_log) total += entry.file_size();
  }
  return total;
}

TEST(JobLogCapTest, OlderAttemptsAreTrimmedOldestFirstSoTheJobStaysWithinItsCap) {
  TempDir dir;
  const fs::path logs = fs::path(dir.path()) / "logs";
  const fs::path job = logs / "mlp-7";
  constexpr uint64_t kCap = 1000;
  // Attempt 1: rank 0 rotated once, and rank 1; attempt 2: rank 0 rotated once. 900 bytes.
  write_bytes(job / "attempt-1" / "rank-0.log.1", 200);
  write_bytes(job / "attempt-1" / "rank-0.log", 200);
  write_bytes(job / "attempt-1" / "rank-0.log.times", 20);
  write_bytes(job / "attempt-1" / "rank-1.log", 200);
  write_bytes(job / "attempt-1" / "job_spec.pb", 50);
  write_bytes(job / "attempt-2" / "rank-0.log.1", 150);
  write_bytes(job / "attempt-2" / "rank-0.log", 150);
  ASSERT_EQ(rank_log_bytes(job), 900u);

  // Attempt 3 starts: the history may keep half the cap; attempt 1's rank 0 goes, rotated file first.
  StatusOr<AttemptLogBudget> budget = reserve_attempt_logs(logs.string(), "mlp-7", 3, kCap);
  ASSERT_TRUE(budget.ok()) << budget.status().to_string();
  EXPECT_EQ(budget->older_bytes, 500u);
  EXPECT_EQ(budget->attempt_bytes, 500u);
  EXPECT_EQ(budget->removed, (std::vector<std::string>{(job / "attempt-1" / "rank-0.log.1").string(),
                                                       (job / "attempt-1" / "rank-0.log").string()}));
  EXPECT_EQ(rank_log_bytes(job), 500u);
  EXPECT_FALSE(fs::exists(job / "attempt-1" / "rank-0.log.times"));  // its index went with it
  EXPECT_TRUE(fs::exists(job / "attempt-1" / "rank-1.log"));
  EXPECT_TRUE(fs::exists(job / "attempt-1" / "job_spec.pb"));
  EXPECT_TRUE(fs::exists(job / "attempt-1" / kLogsRemovedMarker));
  EXPECT_FALSE(fs::exists(job / "attempt-2" / kLogsRemovedMarker));

  // Attempt 3 used its share; attempt 4 starts: the oldest output goes again, attempt 3 stays whole.
  write_bytes(job / "attempt-3" / "rank-0.log.1", 250);
  write_bytes(job / "attempt-3" / "rank-0.log", 250);
  ASSERT_EQ(rank_log_bytes(job), kCap);
  budget = reserve_attempt_logs(logs.string(), "mlp-7", 4, kCap);
  ASSERT_TRUE(budget.ok()) << budget.status().to_string();
  EXPECT_EQ(budget->older_bytes, 500u);
  EXPECT_EQ(budget->attempt_bytes, kCap - 500u);
  EXPECT_EQ(rank_log_bytes(job), 500u);
  EXPECT_FALSE(fs::exists(job / "attempt-1" / "rank-1.log"));
  EXPECT_FALSE(fs::exists(job / "attempt-2" / "rank-0.log"));
  EXPECT_TRUE(fs::exists(job / "attempt-2" / kLogsRemovedMarker));
  EXPECT_EQ(fs::file_size(job / "attempt-3" / "rank-0.log.1"), 250u);
  EXPECT_EQ(fs::file_size(job / "attempt-3" / "rank-0.log"), 250u);
}

TEST(JobLogCapTest, AFirstAttemptHasTheWholeCapAndNoCapRemovesNothing) {
  TempDir dir;
  const fs::path logs = fs::path(dir.path()) / "logs";
  StatusOr<AttemptLogBudget> first = reserve_attempt_logs(logs.string(), "fresh-1", 1, 4096);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->attempt_bytes, 4096u);
  EXPECT_TRUE(first->removed.empty());

  write_bytes(logs / "big-2" / "attempt-1" / "rank-0.log", 5000);
  StatusOr<AttemptLogBudget> uncapped = reserve_attempt_logs(logs.string(), "big-2", 2, 0);
  ASSERT_TRUE(uncapped.ok());
  EXPECT_EQ(uncapped->attempt_bytes, 0u);  // no cap
  EXPECT_EQ(rank_log_bytes(logs / "big-2"), 5000u);
  // The attempt's own files (a relaunch of the same attempt) are its share, not history.
  StatusOr<AttemptLogBudget> same = reserve_attempt_logs(logs.string(), "big-2", 1, 1000);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE(same->removed.empty());
  EXPECT_EQ(rank_log_bytes(logs / "big-2"), 5000u);

  EXPECT_EQ(reserve_attempt_logs(logs.string(), "big-2", 0, 1000).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(reserve_attempt_logs(logs.string(), "../etc", 1, 1000).status().code(), StatusCode::kInvalidArgument);
}

TEST(JobLogCapTest, LinksAndForeignFilesAreNeitherCountedNorRemoved) {
  TempDir dir;
  const fs::path logs = fs::path(dir.path()) / "logs";
  const fs::path job = logs / "linked-3";
  const fs::path elsewhere = fs::path(dir.path()) / "elsewhere";
  write_bytes(elsewhere / "rank-0.log", 3000);
  write_bytes(job / "attempt-1" / "notes.txt", 3000);
  write_bytes(job / "attempt-1" / "rank-1.log", 100);
  fs::create_directory_symlink(elsewhere, job / "attempt-2");
  fs::create_symlink(elsewhere / "rank-0.log", job / "attempt-1" / "rank-0.log");
  StatusOr<AttemptLogBudget> budget = reserve_attempt_logs(logs.string(), "linked-3", 3, 1000);
  ASSERT_TRUE(budget.ok()) << budget.status().to_string();
  EXPECT_EQ(budget->older_bytes, 100u);
  EXPECT_TRUE(budget->removed.empty());
  EXPECT_EQ(fs::file_size(elsewhere / "rank-0.log"), 3000u);
  EXPECT_TRUE(fs::exists(job / "attempt-1" / "notes.txt"));
}

}  // namespace
}  // namespace cohort::agent
