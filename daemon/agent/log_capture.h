#pragma once

// LogCapture: one rank's output, kept twice: appended to a file in the agent's log directory
// (the complete record, read after the job) and to a bounded in-memory ring buffer from which
// StreamLogs serves the tail and follows new output without touching the disk.
//
// Offsets are absolute byte positions in the rank's output since the capture began, so a
// follower that asks for read_from(previous.next_offset) gets exactly the bytes after the ones it
// has, or learns how many it missed when the ring has already overwritten them.
//
// Example:
//   COHORT_ASSIGN_OR_RETURN(auto capture, LogCapture::open("/var/log/cohort/job-1/rank-0.log"));
//   capture->append("epoch 1 loss 0.3\n");
//   std::string last = capture->tail(4096);

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

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

  // Total bytes appended since the capture began.
  uint64_t size() const;
  // OK, or the first error writing the file.
  Status file_status() const;

 private:
  LogCapture(std::string path, int fd, size_t ring_bytes);
  LogChunk read_from_locked(uint64_t offset) const;

  const std::string path_;
  const size_t ring_bytes_;

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  int fd_;                // guarded by mu_; -1 once closed
  std::string ring_;      // guarded by mu_; byte at absolute offset o is ring_[o % ring_bytes_]
  uint64_t written_ = 0;  // guarded by mu_; total bytes appended
  bool closed_ = false;   // guarded by mu_
  Status file_status_;    // guarded by mu_
};

}  // namespace cohort::agent
