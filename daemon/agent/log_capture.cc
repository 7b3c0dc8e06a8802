#include "daemon/agent/log_capture.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

namespace cohort::agent {

StatusOr<std::unique_ptr<LogCapture>> LogCapture::open(const std::string& path, size_t ring_bytes) {
  std::filesystem::path file(path);
  std::string parent = file.parent_path().string();
  COHORT_ASSIGN_OR_RETURN(ConfinedDir dir, ConfinedDir::open(parent.empty() ? "." : parent, kLogDirectoryMode));
  return open_in(dir, file.filename().string(), ring_bytes);
}

StatusOr<std::unique_ptr<LogCapture>> LogCapture::open_in(const ConfinedDir& dir, const std::string& name,
                                                          size_t ring_bytes) {
  const std::string path = dir.path() + "/" + name;
  if (ring_bytes == 0) return invalid_argument_error("LogCapture {}: ring_bytes must be > 0", path);
  COHORT_ASSIGN_OR_RETURN(int fd, dir.open_file(name, O_WRONLY | O_CREAT | O_APPEND, kLogFileMode));
  return std::unique_ptr<LogCapture>(new LogCapture(path, fd, ring_bytes));
}

LogCapture::LogCapture(std::string path, int fd, size_t ring_bytes)
    : path_(std::move(path)), ring_bytes_(ring_bytes), fd_(fd) {}

LogCapture::~LogCapture() { close(); }

void LogCapture::append(std::string_view bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ >= 0 && file_status_.ok()) {
    std::string_view rest = bytes;
    while (!rest.empty()) {
      ssize_t n = ::write(fd_, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        file_status_ = errno_status(fmt::format("write({})", path_), errno);
        break;
      }
      rest.remove_prefix(static_cast<size_t>(n));
    }
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
  closed_ = true;
  cv_.notify_all();
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

}  // namespace cohort::agent
