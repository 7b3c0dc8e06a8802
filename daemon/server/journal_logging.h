#pragma once

// cohortd under systemd: when its stderr is the journal (systemd sets JOURNAL_STREAM to the
// "device:inode" of that stream, systemd.exec(5)), log records go to journald through spdlog's
// systemd sink with their priority, so `journalctl -u cohortd -p err` shows the errors, instead of
// every line arriving as plain text at the "info" priority. Elsewhere nothing changes.
//
// Example (cohortd's main, after init_logging):
//   cohort::daemon::log_to_journal_if_attached("cohortd");

#include <string>
#include <string_view>

namespace cohort::daemon {

// Whether `journal_stream` (JOURNAL_STREAM's value) names the file open as `fd`. A child of a
// unit that inherited the variable but not the stream (stderr redirected) is not attached.
bool is_journal_stream(const char* journal_stream, int fd);

// When stderr is the journal, replaces the default logger's sinks by a journald sink (identifier
// `identifier`, the level unchanged) and returns true; otherwise returns false. Call once, early,
// after init_logging and before starting threads.
bool log_to_journal_if_attached(const std::string& identifier);

}  // namespace cohort::daemon
