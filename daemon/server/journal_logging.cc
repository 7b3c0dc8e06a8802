#include "daemon/server/journal_logging.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include <spdlog/sinks/systemd_sink.h>
#include <spdlog/spdlog.h>

namespace cohort::daemon {

bool is_journal_stream(const char* journal_stream, int fd) {
  if (journal_stream == nullptr) return false;
  unsigned long long device = 0, inode = 0;
  if (std::sscanf(journal_stream, "%llu:%llu", &device, &inode) != 2) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0) return false;
  return static_cast<unsigned long long>(st.st_dev) == device && static_cast<unsigned long long>(st.st_ino) == inode;
}

bool log_to_journal_if_attached(const std::string& identifier) {
  if (!is_journal_stream(std::getenv("JOURNAL_STREAM"), STDERR_FILENO)) return false;
  auto sink = std::make_shared<spdlog::sinks::systemd_sink_mt>(identifier);
  // The journal stamps time, unit and priority itself: the message is all that goes in.
  sink->set_pattern("%v");
  std::shared_ptr<spdlog::logger> logger = spdlog::default_logger();
  logger->sinks().clear();
  logger->sinks().push_back(std::move(sink));
  return true;
}

}  // namespace cohort::daemon
