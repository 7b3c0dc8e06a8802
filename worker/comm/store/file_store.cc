#include "worker/comm/store/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>

#include "worker/comm/store/scoped_fd.h"
#include "worker/comm/store/store_wait.h"
#include "worker/comm/store/wire_format.h"

namespace cohort::comm {
namespace {

// Log record kinds: kSetRecord key value | kDeleteRecord key (wire_format encoding).
constexpr uint8_t kSetRecord = 1;
constexpr uint8_t kDeleteRecord = 2;

// A contended lock is retried after this pause, doubling up to the max: lock holds last
// microseconds, so the first retries are short.
constexpr std::chrono::microseconds kLockMinRetryInterval{20};
constexpr std::chrono::microseconds kLockMaxRetryInterval{2'000};

// See the header: fcntl locks are per process, so in-process users of any file store take
// turns here before touching a store file.
std::mutex& process_file_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string set_record(std::string_view key, std::string_view value) {
  return WireWriter().u8(kSetRecord).str(key).str(value).take();
}

std::string delete_record(std::string_view key) { return WireWriter().u8(kDeleteRecord).str(key).take(); }

// Reads bytes [offset, offset + size) of `fd`.
Status read_range(int fd, off_t offset, size_t size, std::string* out) {
  out->resize(size);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out->data() + done, size - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("pread", errno);
    if (n == 0) break;  // Truncated under us: the caller parses what it got.
    done += static_cast<size_t>(n);
  }
  out->resize(done);
  return ok_status();
}

Status write_range(int fd, off_t offset, std::string_view data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, offset + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno_status("pwrite", errno);
    done += static_cast<size_t>(n);
  }
  return ok_status();
}

// Applies the complete records at the start of `log` to `table`; returns the bytes they span
// (a record cut short by a writer that died mid-append is left unread), or DATA_LOSS on bytes
// that are no record at all.
StatusOr<size_t> replay(std::string_view log, KeyValueTable& table) {
  WireReader reader(log);
  size_t consumed = 0;
  while (!reader.at_end()) {
    uint8_t kind = 0;
    std::string key, value;
    if (!reader.u8(&kind) || !reader.str(&key)) break;
    if (kind == kSetRecord) {
      if (!reader.str(&value)) break;
      table.set(key, value);
    } else if (kind == kDeleteRecord) {
      table.erase(key);
    } else {
      return data_loss_error("unknown record kind {} at log byte {}", kind, consumed);
    }
    consumed = reader.position();
  }
  return consumed;
}

}  // namespace

FileStore::FileStore(std::string path) : path_(std::move(path)), name_("file store " + path_) {}

StatusOr<std::unique_ptr<FileStore>> FileStore::open(std::string path) {
  auto store = std::make_unique<FileStore>(std::move(path));
  // Any operation creates the file; num_keys also proves it is a readable store log.
  COHORT_RETURN_IF_ERROR(store->num_keys().status());
  return store;
}

Status FileStore::transact(Access access, Duration lock_timeout, const Operation& op) {
  std::lock_guard<std::mutex> process_lock(process_file_mutex());
  ScopedFd fd(::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd.valid()) {
    return errno_status(fmt::format("open({})", path_), errno)
        .with_context(name_ + ": cannot open the store file (does its directory exist and is it writable?)");
  }
  COHORT_RETURN_IF_ERROR(lock_file(fd.get(), access, lock_timeout));
  COHORT_RETURN_IF_ERROR(catch_up(fd.get(), access));
  std::string records;
  COHORT_RETURN_IF_ERROR(op(table_, &records));
  if (!records.empty()) COHORT_RETURN_IF_ERROR(append(fd.get(), records));
  // Closing the descriptor releases the lock.
  return ok_status();
}

Status FileStore::lock_file(int fd, Access access, Duration lock_timeout) const {
  // F_SETLK with our own retry instead of F_SETLKW, which would wait forever on a stopped holder.
  struct flock whole_file {};
  whole_file.l_type = access == Access::kWrite ? F_WRLCK : F_RDLCK;
  whole_file.l_whence = SEEK_SET;  // l_start = l_len = 0: the whole file, however long it grows
  const Deadline deadline = store_deadline(lock_timeout);
  auto pause = kLockMinRetryInterval;
  while (::fcntl(fd, F_SETLK, &whole_file) != 0) {
    if (errno == EINTR) continue;
    if (errno != EACCES && errno != EAGAIN) {
      return errno_status("fcntl(F_SETLK)", errno)
          .with_context(name_ + ": cannot lock the store file (does the filesystem support fcntl locks?)");
    }
    if (deadline.expired()) {
      return deadline_exceeded_error(
          "{}: could not lock the store file within {}: another process holds the lock (is it "
          "stopped?)",
          name_, format_duration(lock_timeout));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, kLockMaxRetryInterval);
  }
  return ok_status();
}

Status FileStore::catch_up(int fd, Access access) {
  struct stat info {};
  if (::fstat(fd, &info) != 0) return errno_status("fstat", errno).with_context(name_);
  if (info.st_dev != log_device_ || info.st_ino != log_inode_ || info.st_size < log_offset_) {
    forget_cache();
    log_device_ = info.st_dev;
    log_inode_ = info.st_ino;
  }
  std::string log;
  COHORT_RETURN_IF_ERROR(
      read_range(fd, log_offset_, static_cast<size_t>(info.st_size - log_offset_), &log).with_context(name_));
  StatusOr<size_t> consumed = replay(log, table_);
  if (!consumed.ok()) {
    forget_cache();
    return consumed.status().with_context(
        fmt::format("{}: corrupt store file (offset {})", name_, log_offset_));
  }
  log_offset_ += static_cast<off_t>(*consumed);
  // A torn record from a writer that died: cut it off before appending after it. Readers just
  // skip it; only the exclusive holder may change the file.
  if (access == Access::kWrite && *consumed < log.size() && ::ftruncate(fd, log_offset_) != 0) {
    return errno_status("ftruncate", errno).with_context(name_);
  }
  return ok_status();
}

Status FileStore::append(int fd, const std::string& records) {
  Status written = write_range(fd, log_offset_, records);
  if (!written.ok()) {
    // table_ already holds the change the file lacks: drop the partial append and the cache, so
    // the next operation replays what the file really says.
    if (::ftruncate(fd, log_offset_) != 0) {
      // Best effort: the next writer's catch_up cuts a torn record off anyway.
    }
    forget_cache();
    return written.with_context(name_ + ": cannot append to the store file");
  }
  log_offset_ += static_cast<off_t>(records.size());
  return ok_status();
}

void FileStore::forget_cache() {
  table_.clear();
  log_offset_ = 0;
  log_device_ = 0;
  log_inode_ = 0;
}

Status FileStore::set(std::string_view key, std::string_view value) {
  return transact(Access::kWrite, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string* records) {
    table.set(key, value);
    *records = set_record(key, value);
    return ok_status();
  });
}

StatusOr<std::string> FileStore::get(std::string_view key, Duration timeout) {
  std::string value;
  COHORT_RETURN_IF_ERROR(poll_until_present({std::string(key)}, timeout,
                                            [&](const KeyValueTable& table) { value = *table.find(key); }));
  return value;
}

StatusOr<int64_t> FileStore::add(std::string_view key, int64_t delta) {
  int64_t sum = 0;
  COHORT_RETURN_IF_ERROR(
      transact(Access::kWrite, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string* records) {
        StatusOr<int64_t> added = table.add(key, delta);
        if (!added.ok()) return added.status().with_context(name_);
        sum = *added;
        *records = set_record(key, *table.find(key));
        return ok_status();
      }));
  return sum;
}

StatusOr<std::string> FileStore::compare_set(std::string_view key, std::string_view expected,
                                             std::string_view desired) {
  std::string after;
  COHORT_RETURN_IF_ERROR(
      transact(Access::kWrite, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string* records) {
        bool swapped = false;
        after = table.compare_set(key, expected, desired, &swapped);
        // Log only a real change: a failed comparison wrote nothing.
        if (swapped) *records = set_record(key, desired);
        return ok_status();
      }));
  return after;
}

Status FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  return poll_until_present(keys, timeout, [](const KeyValueTable&) {});
}

StatusOr<bool> FileStore::check(const std::vector<std::string>& keys) {
  bool present = false;
  COHORT_RETURN_IF_ERROR(
      transact(Access::kRead, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string*) {
        present = table.contains_all(keys);
        return ok_status();
      }));
  return present;
}

StatusOr<bool> FileStore::delete_key(std::string_view key) {
  bool existed = false;
  COHORT_RETURN_IF_ERROR(
      transact(Access::kWrite, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string* records) {
        existed = table.erase(key);
        if (existed) *records = delete_record(key);
        return ok_status();
      }));
  return existed;
}

StatusOr<int64_t> FileStore::num_keys() {
  int64_t count = 0;
  COHORT_RETURN_IF_ERROR(
      transact(Access::kRead, kFileStoreLockTimeout, [&](KeyValueTable& table, std::string*) {
        count = table.size();
        return ok_status();
      }));
  return count;
}

Status FileStore::poll_until_present(const std::vector<std::string>& keys, Duration timeout,
                                     const std::function<void(const KeyValueTable&)>& on_present) {
  const Deadline deadline = store_deadline(timeout);
  auto pause = std::chrono::duration_cast<std::chrono::microseconds>(kFileStoreMinPollInterval);
  while (true) {
    std::vector<std::string> missing;
    // The lock wait is bounded by what is left of this wait (lock_file still tries once at 0).
    COHORT_RETURN_IF_ERROR(
        transact(Access::kRead, deadline.remaining(), [&](KeyValueTable& table, std::string*) {
          missing = table.missing(keys);
          if (missing.empty()) on_present(table);
          return ok_status();
        }));
    if (missing.empty()) return ok_status();
    if (deadline.expired()) return keys_timeout_error(name_, missing, keys.size(), timeout);
    std::this_thread::sleep_for(std::min<std::chrono::microseconds>(pause, deadline.remaining()));
    pause = std::min(pause * 2, kFileStoreMaxPollInterval);
  }
}

}  // namespace cohort::comm
