#include "daemon/server/journal_logging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

namespace cohort::daemon {
namespace {

std::string id_of(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return fmt::format("{}:{}", static_cast<unsigned long long>(st.st_dev), static_cast<unsigned long long>(st.st_ino));
}

TEST(JournalLoggingTest, OnlyTheStreamJournalStreamNamesIsTheJournal) {
  const int fd = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  EXPECT_TRUE(is_journal_stream(id_of(fd).c_str(), fd));
  // Inherited by a child whose stderr went elsewhere: not the journal.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  EXPECT_FALSE(is_journal_stream(id_of(fd).c_str(), pipe_fds[1]));
  EXPECT_FALSE(is_journal_stream(nullptr, fd));
  EXPECT_FALSE(is_journal_stream("", fd));
  EXPECT_FALSE(is_journal_stream("not-a-pair", fd));
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
  ::close(fd);
}

TEST(JournalLoggingTest, OutsideSystemdTheLoggerIsLeftAlone) {
  ::unsetenv("JOURNAL_STREAM");
  const size_t sinks = spdlog::default_logger()->sinks().size();
  EXPECT_FALSE(log_to_journal_if_attached("cohortd"));
  EXPECT_EQ(spdlog::default_logger()->sinks().size(), sinks);
}

// Under systemd (JOURNAL_STREAM names stderr), the default logger writes through spdlog's systemd
// sink only, at the level it had, so records reach journald with their priority (journalctl -p err).
TEST(JournalLoggingTest, WhenStderrIsTheJournalTheSystemdSinkReplacesTheOthers) {
  std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  const std::vector<spdlog::sink_ptr> saved = logger->sinks();
  const spdlog::level::level_enum level = logger->level();
  logger->set_level(spdlog::level::warn);
  ::setenv("JOURNAL_STREAM", id_of(STDERR_FILENO).c_str(), 1);
  const bool attached = log_to_journal_if_attached("cohortd-test");
  ::unsetenv("JOURNAL_STREAM");
  const std::vector<spdlog::sink_ptr> sinks = logger->sinks();
  const spdlog::level::level_enum level_after = logger->level();
  // Restore the test's own logging before asserting anything.
  logger->sinks() = saved;
  logger->set_level(level);
  EXPECT_TRUE(attached);
  ASSERT_EQ(sinks.size(), 1u);
  EXPECT_NE(std::dynamic_pointer_cast<spdlog::sinks::systemd_sink_mt>(sinks[0]), nullptr)
      << "the only sink is not spdlog's systemd sink";
  EXPECT_EQ(level_after, spdlog::level::warn);
}

}  // namespace
}  // namespace cohort::daemon
