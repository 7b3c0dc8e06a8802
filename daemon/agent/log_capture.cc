#include "daemon/agent/log_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

namespace cohort::agent {

namespace {

// Reads of files on disk go in blocks of this size (bounded memory whatever the file size).
constexpr size_t kLogReadBlockBytes = 64 * 1024;

int64_t system_unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Status write_all(int fd, std::string_view bytes, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status(fmt::format("write({})", path), errno);
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return ok_status();
}

// The time checkpoint rule shared by memory and disk: with checkpoints (offset, time) oldest first,
// each marking where output arriving at `time` began, and no output arriving a whole interval
// after a checkpoint without a new one, output since `since` starts at the returned offset (at
// most an interval early). `end` when all of it is older.
uint64_t offset_since(const std::vector<std::pair<uint64_t, int64_t>>& times, int64_t since, uint64_t end) {
  uint64_t start = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    if (times[i].second >= since) break;
    const bool wholly_older = times[i].second + kLogTimeCheckpointInterval.count() <= since;
    start = wholly_older ? (i + 1 < times.size() ? times[i + 1].first : end) : times[i].first;
  }
  return start;
}

}  // namespace

size_t tail_lines_start(std::string_view text, int lines) {
  if (lines <= 0) return 0;
  size_t end = text.size();
  if (end > 0 && text[end - 1] == '\n') --end;  // the last line's own newline
  int seen = 0;
  for (size_t i = end; i > 0; --i) {
    if (text[i - 1] == '\n' && ++seen == lines) return i;
  }
  return 0;
}

StatusOr<std::unique_ptr<LogCapture>> LogCapture::open(const std::string& path, size_t ring_bytes) {
  std::filesystem::path file(path);
  std::string parent = file.parent_path().string();
  COHORT_ASSIGN_OR_RETURN(ConfinedDir dir, ConfinedDir::open(parent.empty() ? "." : parent, kLogDirectoryMode));
  return open_in(dir, file.filename().string(), ring_bytes);
}

StatusOr<std::unique_ptr<LogCapture>> LogCapture::open_in(const ConfinedDir& dir, const std::string& name,
                                                          size_t ring_bytes) {
  LogCaptureOptions options;
  options.ring_bytes = ring_bytes;
  return open_in(dir, name, options);
}

StatusOr<std::unique_ptr<LogCapture>> LogCapture::open_in(const ConfinedDir& dir, const std::string& name,
                                                          const LogCaptureOptions& options) {
  const std::string path = dir.path() + "/" + name;
  if (options.ring_bytes == 0) return invalid_argument_error("LogCapture {}: ring_bytes must be > 0", path);
  COHORT_ASSIGN_OR_RETURN(int fd, dir.open_file(name, O_WRONLY | O_CREAT | O_APPEND, kLogFileMode));
  StatusOr<int> times_fd = dir.open_file(name + kLogTimesSuffix, O_WRONLY | O_CREAT | O_APPEND, kLogFileMode);
  if (!times_fd.ok()) {
    ::close(fd);
    return times_fd.status();
  }
  // The capture's own handle on the directory, to rotate by name after `dir` is gone.
  const int dir_fd = ::fcntl(dir.fd(), F_DUPFD_CLOEXEC, 0);
  struct stat st {};
  if (dir_fd < 0 || ::fstat(fd, &st) != 0) {
    Status error = errno_status(fmt::format("fcntl/fstat for {}", path), errno);
    ::close(fd);
    ::close(*times_fd);
    if (dir_fd >= 0) ::close(dir_fd);
    return error;
  }
  std::unique_ptr<LogCapture> capture(new LogCapture(path, name, dir_fd, fd, *times_fd, options));
  capture->file_bytes_ = static_cast<uint64_t>(st.st_size);
  return capture;
}

LogCapture::LogCapture(std::string path, std::string name, int dir_fd, int fd, int times_fd,
                       LogCaptureOptions options)
    : path_(std::move(path)),
      name_(std::move(name)),
      dir_fd_(dir_fd),
      options_(std::move(options)),
      ring_bytes_(options_.ring_bytes),
      fd_(fd),
      times_fd_(times_fd) {}

LogCapture::~LogCapture() {
  close();
  ::close(dir_fd_);
}

int64_t LogCapture::now_unix_ms() const { return options_.now_unix_ms ? options_.now_unix_ms() : system_unix_ms(); }

Status LogCapture::rotate_locked() {
  ::close(fd_);
  ::close(times_fd_);
  fd_ = times_fd_ = -1;
  const std::string rotated = name_ + kRotatedLogSuffix;
  if (::renameat(dir_fd_, name_.c_str(), dir_fd_, rotated.c_str()) != 0)
    return errno_status(fmt::format("renameat({} -> {})", path_, rotated), errno);
  const std::string times = name_ + kLogTimesSuffix;
  const std::string rotated_times = rotated + kLogTimesSuffix;
  if (::renameat(dir_fd_, times.c_str(), dir_fd_, rotated_times.c_str()) != 0 && errno != ENOENT)
    return errno_status(fmt::format("renameat({}{})", path_, kLogTimesSuffix), errno);
  constexpr int kFlags = O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC;
  fd_ = ::openat(dir_fd_, name_.c_str(), kFlags, kLogFileMode);
  if (fd_ < 0) return errno_status(fmt::format("openat({})", path_), errno);
  times_fd_ = ::openat(dir_fd_, times.c_str(), kFlags, kLogFileMode);
  if (times_fd_ < 0) return errno_status(fmt::format("openat({}{})", path_, kLogTimesSuffix), errno);
  file_bytes_ = 0;
  file_checkpoint_ms_.reset();
  return ok_status();
}

void LogCapture::write_file_locked(std::string_view bytes, int64_t now_ms) {
  if (fd_ < 0 || !file_status_.ok() || bytes.empty()) return;
  if (options_.max_file_bytes > 0) {
    // Half the cap per file, so the current and the rotated file together stay within it.
    const uint64_t half = std::max<uint64_t>(options_.max_file_bytes / 2, 1);
    if (bytes.size() > half) bytes.remove_prefix(bytes.size() - half);
    if (file_bytes_ > 0 && file_bytes_ + bytes.size() > half) {
      if (Status rotated = rotate_locked(); !rotated.ok()) {
        file_status_ = rotated;
        return;
      }
    }
  }
  if (times_fd_ >= 0 && (!file_checkpoint_ms_ || now_ms - *file_checkpoint_ms_ >= kLogTimeCheckpointInterval.count())) {
    file_checkpoint_ms_ = now_ms;
    // The index only serves --since; a failure to write it must not lose the output itself.
    (void)write_all(times_fd_, fmt::format("{} {}\n", file_bytes_, now_ms), path_);
  }
  if (Status written = write_all(fd_, bytes, path_); !written.ok()) {
    file_status_ = written;
    return;
  }
  file_bytes_ += bytes.size();
}

void LogCapture::append(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now_ms = now_unix_ms();
  write_file_locked(bytes, now_ms);
  if (!bytes.empty() && (times_.empty() || now_ms - times_.back().second >= kLogTimeCheckpointInterval.count())) {
    if (times_.size() >= kMaxLogTimeCheckpoints) times_.erase(times_.begin(), times_.begin() + times_.size() / 2);
    times_.emplace_back(written_, now_ms);
  }
  // Only the last ring_bytes_ of a huge chunk can survive; skip the rest.
  if (bytes.size() > ring_bytes_) {
    written_ += bytes.size() - ring_bytes_;
    bytes.remove_prefix(bytes.size() - ring_bytes_);
  }
  if (ring_.size() < ring_bytes_) ring_.resize(ring_bytes_);
  for (char c : bytes) ring_[written_++ % ring_bytes_] = c;
  cv_.notify_all();
}

void LogCapture::close() {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0) {
    if (::close(fd_) != 0 && file_status_.ok()) {
      file_status_ = errno_status(fmt::format("close({})", path_), errno);
    }
    fd_ = -1;
  }
  if (times_fd_ >= 0) {
    ::close(times_fd_);
    times_fd_ = -1;
  }
  closed_ = true;
  cv_.notify_all();
}

uint64_t LogCapture::start_of(const LogSelection& selection) const {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t oldest = written_ > ring_bytes_ ? written_ - ring_bytes_ : 0;
  uint64_t start = oldest;
  if (selection.since_unix_ms > 0) {
    start = std::max(start, offset_since(times_, selection.since_unix_ms, written_));
    // Back to the start of its line, as far as the ring holds it.
    while (start > oldest && start < written_ && ring_[(start - 1) % ring_bytes_] != '\n') --start;
  }
  if (selection.tail_lines > 0) start += tail_lines_start(read_from_locked(start).data, selection.tail_lines);
  return start;
}

std::string LogCapture::tail(size_t n_bytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t kept = std::min<uint64_t>(written_, ring_bytes_);
  uint64_t n = std::min<uint64_t>(n_bytes, kept);
  return read_from_locked(written_ - n).data;
}

LogChunk LogCapture::read_from(uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_from_locked(offset);
}

LogChunk LogCapture::wait_and_read_from(uint64_t offset, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return closed_ || written_ > offset; });
  return read_from_locked(offset);
}

LogChunk LogCapture::read_from_locked(uint64_t offset) const {
  LogChunk chunk;
  uint64_t oldest = written_ > ring_bytes_ ? written_ - ring_bytes_ : 0;
  uint64_t start = std::clamp<uint64_t>(offset, oldest, written_);
  chunk.offset = start;
  chunk.skipped = start > offset ? start - offset : 0;
  chunk.next_offset = written_;
  chunk.closed = closed_;
  chunk.data.reserve(written_ - start);
  for (uint64_t o = start; o < written_; ++o) chunk.data.push_back(ring_[o % ring_bytes_]);
  return chunk;
}

uint64_t LogCapture::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return written_;
}

Status LogCapture::file_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return file_status_;
}

namespace {

// One file of a rank's log, opened for reading, with the part of it that is selected.
struct LogFile {
  int fd = -1;
  uint64_t begin = 0;  // first selected byte
  uint64_t end = 0;    // the file's size when opened
};

// The file's time index ("offset unix_ms" lines); empty when missing or unreadable.
std::vector<std::pair<uint64_t, int64_t>> read_times(const ConfinedDir& dir, const std::string& name) {
  std::vector<std::pair<uint64_t, int64_t>> times;
  StatusOr<int> fd = dir.open_file(name + kLogTimesSuffix, O_RDONLY, 0);
  if (!fd.ok()) return times;
  std::string text;
  char block[4096];
  ssize_t n;
  while ((n = ::read(*fd, block, sizeof block)) > 0) text.append(block, static_cast<size_t>(n));
  ::close(*fd);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string::npos) break;  // a line cut by a crash
    unsigned long long offset = 0;
    long long ms = 0;
    if (std::sscanf(text.c_str() + pos, "%llu %lld", &offset, &ms) == 2) times.emplace_back(offset, ms);
    pos = eol + 1;
  }
  return times;
}

StatusOr<std::string> pread_exact(const LogFile& file, uint64_t offset, size_t n) {
  std::string bytes(n, '\0');
  size_t got = 0;
  while (got < n) {
    ssize_t r = ::pread(file.fd, bytes.data() + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return errno_status("pread(rank log)", errno);
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  bytes.resize(got);
  return bytes;
}

// Moves `file.begin` back to the start of its line.
Status align_to_line(LogFile& file) {
  while (file.begin > 0 && file.begin < file.end) {
    const uint64_t from = file.begin > kLogReadBlockBytes ? file.begin - kLogReadBlockBytes : 0;
    COHORT_ASSIGN_OR_RETURN(std::string block, pread_exact(file, from, file.begin - from));
    const size_t newline = block.rfind('\n');
    if (newline != std::string::npos) {
      file.begin = from + newline + 1;
      return ok_status();
    }
    file.begin = from;
  }
  return ok_status();
}

// Keeps only the last `lines` lines of the files' selected parts, oldest file first.
Status keep_tail(std::vector<LogFile>& files, int lines) {
  int seen = 0;
  bool last_byte = true;  // the very last byte's newline ends the last line, it starts none
  for (size_t f = files.size(); f > 0; --f) {
    LogFile& file = files[f - 1];
    uint64_t pos = file.end;
    while (pos > file.begin) {
      const uint64_t from = pos - file.begin > kLogReadBlockBytes ? pos - kLogReadBlockBytes : file.begin;
      COHORT_ASSIGN_OR_RETURN(std::string block, pread_exact(file, from, pos - from));
      for (size_t i = block.size(); i > 0; --i) {
        if (block[i - 1] != '\n') {
          last_byte = false;
          continue;
        }
        if (last_byte) {
          last_byte = false;
          continue;
        }
        if (++seen == lines) {
          file.begin = from + i;
          for (size_t older = 0; older + 1 < f; ++older) files[older].begin = files[older].end;
          return ok_status();
        }
      }
      pos = from;
    }
  }
  return ok_status();
}

}  // namespace

Status read_log_files(const ConfinedDir& dir, const std::string& name, const LogSelection& selection,
                      const std::function<bool(std::string_view)>& on_data) {
  std::vector<LogFile> files;
  std::vector<std::string> names = {name + kRotatedLogSuffix, name};
  auto close_all = [&] {
    for (LogFile& file : files) ::close(file.fd);
  };
  for (const std::string& file_name : names) {
    StatusOr<int> fd = dir.open_file(file_name, O_RDONLY, 0);
    if (!fd.ok()) {
      if (fd.status().code() == StatusCode::kNotFound) continue;
      close_all();
      return fd.status();
    }
    struct stat st {};
    ::fstat(*fd, &st);
    LogFile file{*fd, 0, static_cast<uint64_t>(st.st_size)};
    if (selection.since_unix_ms > 0) {
      file.begin = std::min(file.end, offset_since(read_times(dir, file_name), selection.since_unix_ms, file.end));
      if (Status aligned = align_to_line(file); !aligned.ok()) {
        ::close(file.fd);
        close_all();
        return aligned;
      }
    }
    files.push_back(file);
  }
  if (files.empty()) {
    return not_found_error("no log file {}/{} (the rank never ran here, or its logs were removed)", dir.path(),
                           name);
  }
  Status status = selection.tail_lines > 0 ? keep_tail(files, selection.tail_lines) : ok_status();
  for (const LogFile& file : files) {
    for (uint64_t pos = file.begin; status.ok() && pos < file.end;) {
      StatusOr<std::string> block = pread_exact(file, pos, std::min<uint64_t>(kLogReadBlockBytes, file.end - pos));
      if (!block.ok()) {
        status = block.status();
        break;
      }
      if (block->empty()) break;  // the file shrank under us
      pos += block->size();
      if (!on_data(*block)) {
        close_all();
        return ok_status();
      }
    }
  }
  close_all();
  return status;
}

}  // namespace cohort::agent
