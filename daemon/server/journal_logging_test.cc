#include "daemon/server/journal_logging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
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

}  // namespace
}  // namespace cohort::daemon
