#pragma once

// LogCapture: one rank's output, kept twice: appended to a file in the agent's log directory
// (the complete record, read after the job) and to a bounded in-memory ring buffer from which
// StreamLogs serves the tail and follows new output without touching the disk.
//
// Offsets are absolute byte positions in the rank's output since the capture began, so a
// follower that asks for read_from(previous.next_offset) gets exactly the bytes after the ones it
// has, or learns how many it missed when the ring has already overwritten them.
//
// On disk the rank's files are capped (LogCaptureOptions::max_file_bytes): when the file reaches
// half the cap it is renamed to <name>.1 (replacing the previous one) and a new file begins, so a
// rank never holds more than the cap on disk and keeps its newest output. Next to each file,
// <name>.times records, at most once a second, "file_offset unix_ms" of the output arriving, which
// is how `cohort logs --since` finds where to start, in memory or (read_log_files) on disk.
//
// Example:
//   COHORT_ASSIGN_OR_RETURN(auto capture, LogCapture::open("/var/log/cohort/job-1/rank-0.log"));
//   capture->append("epoch 1 loss 0.3\n");
//   std::string last = capture->tail(4096);

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "daemon/agent/confined_dir.h"
#include "worker/base/status.h"

namespace cohort::agent {

// 1 MiB per rank: minutes of a chatty training loop's output, so `cohort logs` and a follower
// that falls briefly behind are served from memory, while 100 ranks on a node cost only 100 MiB.
inline constexpr size_t kLogRingBufferBytes = 1 << 20;
// Rank logs are read through the agent (`cohort logs`), not by other users on the node: a job's
// output may hold its data paths and results.
inline constexpr mode_t kLogFileMode = 0640;
// Directories the agent creates for logs: searchable, not listable, by the job users (a job's
// spec file lies in its log directory, see AgentService).
inline constexpr mode_t kLogDirectoryMode = 0711;

// A rank's files on disk, current and rotated, at most this many bytes unless the agent's
// settings say otherwise (see TaskSupervisorOptions::max_log_bytes_per_job).
inline constexpr uint64_t kDefaultMaxLogFileBytes = uint64_t{1} << 30;  // 1 GiB
// When output arrived is recorded at most this often (the resolution of --since).
inline constexpr std::chrono::milliseconds kLogTimeCheckpointInterval = std::chrono::seconds(1);
// In-memory time checkpoints per capture (a day at one a second); beyond it every second one is
// dropped, which only coarsens --since for very old output.
inline constexpr size_t kMaxLogTimeCheckpoints = 86400;
// Suffixes of a rank's files: the rotated file and the time index.
inline constexpr const char* kRotatedLogSuffix = ".1";
inline constexpr const char* kLogTimesSuffix = ".times";

struct LogCaptureOptions {
  size_t ring_bytes = kLogRingBufferBytes;                 // in-memory tail
  uint64_t max_file_bytes = kDefaultMaxLogFileBytes;       // on disk, current + rotated; 0: no cap
  std::function<int64_t()> now_unix_ms;                    // the clock; empty: the system clock
};

// Which part of a rank's output to read (cohort logs --tail / --since).
struct LogSelection {
  int tail_lines = 0;         // only the last this many lines; 0: all
  int64_t since_unix_ms = 0;  // only output from this time on (to a second, from a line start); 0: all
};

// A chunk of output read from the ring buffer.
struct LogChunk {
  std::string data;          // the bytes from the requested offset (or the oldest kept one)
  uint64_t offset = 0;       // where `data` starts
  uint64_t next_offset = 0;  // where the next read_from should start
  uint64_t skipped = 0;      // bytes between the requested offset and `offset`, already dropped
  bool closed = false;       // the capture has ended: nothing after next_offset will ever come
};

// Thread-safe: one writer (the process's reader thread) and any number of readers.
class LogCapture {
 public:
  // Creates (or appends to) the file at `path`, creating its parent directories; a symbolic
  // link at `path` fails instead of being followed. Blocking.
  static StatusOr<std::unique_ptr<LogCapture>> open(const std::string& path,
                                                    size_t ring_bytes = kLogRingBufferBytes);
  // Creates (or appends to) the file `name` in `dir`, never following a link. Blocking.
  static StatusOr<std::unique_ptr<LogCapture>> open_in(const ConfinedDir& dir, const std::string& name,
                                                       size_t ring_bytes = kLogRingBufferBytes);
  // The same with every option (rotation cap, clock).
  static StatusOr<std::unique_ptr<LogCapture>> open_in(const ConfinedDir& dir, const std::string& name,
                                                       const LogCaptureOptions& options);
  ~LogCapture();
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  const std::string& path() const { return path_; }

  // Appends to the file and the ring buffer, waking followers. A failed file write is kept as
  // file_status() and the ring still receives the bytes, so a full disk does not hide the logs.
  void append(std::string_view bytes);

  // Marks the end of the output (the process and its pipes are gone) and wakes followers.
  void close();

  // The last min(n_bytes, kept) bytes. Non-blocking.
  std::string tail(size_t n_bytes) const;

  // The bytes from `offset` on that the ring still holds; an offset already overwritten starts
  // at the oldest kept byte and reports the gap in `skipped`. Non-blocking.
  LogChunk read_from(uint64_t offset) const;

  // Blocks until bytes past `offset` exist, the capture is closed, or `timeout` passes; then
  // returns read_from(offset). For StreamLogs with follow.
  LogChunk wait_and_read_from(uint64_t offset, std::chrono::milliseconds timeout) const;

  // Where a reader of `selection` starts: the first byte the ring holds of the output written since
  // selection.since_unix_ms, then moved on so only the last tail_lines lines remain. Starts at the
  // oldest kept byte when the ring already dropped part of the selection. Non-blocking.
  uint64_t start_of(const LogSelection& selection) const;

  // Total bytes appended since the capture began.
  uint64_t size() const;
  // OK, or the first error writing the file.
  Status file_status() const;

 private:
  LogCapture(std::string path, std::string name, int dir_fd, int fd, int times_fd, LogCaptureOptions options);
  LogChunk read_from_locked(uint64_t offset) const;
  int64_t now_unix_ms() const;
  // Writes to the file (rotating first when the cap says so) and records the time checkpoint.
  void write_file_locked(std::string_view bytes, int64_t now_ms);
  Status rotate_locked();

  const std::string path_;
  const std::string name_;  // the file's name in its directory
  const int dir_fd_;        // the directory, for rotating by name without following links
  const LogCaptureOptions options_;
  const size_t ring_bytes_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int fd_;                // guarded by mu_; -1 once closed
  std::string ring_;      // guarded by mu_; byte at absolute offset o is ring_[o % ring_bytes_]
  uint64_t written_ = 0;  // guarded by mu_; total bytes appended
  bool closed_ = false;   // guarded by mu_
  Status file_status_;    // guarded by mu_
  int times_fd_;          // guarded by mu_; the .times index of the current file; -1 once closed
  uint64_t file_bytes_ = 0;  // guarded by mu_; size of the current file
  std::optional<int64_t> file_checkpoint_ms_;  // guarded by mu_; the current file's newest .times entry
  // guarded by mu_; (absolute offset, unix ms) when output arrived, oldest first, thinned when full.
  std::vector<std::pair<uint64_t, int64_t>> times_;
};

// Reads a rank's output from its files in `dir` (the rotated `<name>.1`, then `<name>`) when the
// capture is gone (the agent restarted or forgot the job): the selected part, in blocks, to
// `on_data` until it returns false. NOT_FOUND when neither file exists. Blocking.
Status read_log_files(const ConfinedDir& dir, const std::string& name, const LogSelection& selection,
                      const std::function<bool(std::string_view)>& on_data);

// Where the last `lines` lines of `text` begin (a final newline ends the last line, it does not
// start another); 0 when `text` has no more than that many.
size_t tail_lines_start(std::string_view text, int lines);

}  // namespace cohort::agent
