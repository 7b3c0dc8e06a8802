#pragma once

// FileStore: a Store shared by many processes through one file (the file:// init method, as
// torch.distributed's FileStore). Works on a local filesystem, or a shared one whose fcntl locks
// work across machines.
//
// Protocol: the file is an append-only log of records ("set key=value", "delete key"). Every
// operation takes an fcntl lock on the whole file (shared to read, exclusive to write), replays
// the records appended since this object last looked into an in-memory KeyValueTable, applies
// itself, appends its own records and unlocks. Waits poll with a short backoff.
//
// The file is never removed or compacted by the store. A FileStore used directly on a leftover
// file sees its old keys; the file:// init method does not: each job joins a fresh generation of
// the file (worker/comm/init/file_rendezvous.h).
//
// Thread-safe. fcntl locks belong to a process, not a thread or a descriptor (and closing any
// descriptor of the file drops them), so every FileStore in a process also serialises its file
// I/O on one process-wide mutex.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "worker/comm/store/key_value_table.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

// How long one operation waits for another process to release the file lock. Operations hold
// it for one read-modify-write (microseconds), so running out means a holder is stopped or the
// filesystem's locking is broken.
inline constexpr Duration kFileStoreLockTimeout = std::chrono::seconds(60);
// get/wait re-read the file after this pause, doubling it up to kFileStoreMaxPollInterval: quick
// to notice a key set right after the first look, cheap when a rank is minutes late.
inline constexpr std::chrono::microseconds kFileStoreMinPollInterval{500};
inline constexpr std::chrono::microseconds kFileStoreMaxPollInterval{20'000};

class FileStore : public Store {
 public:
  // Does not touch the file: the first operation creates it (the directory must exist).
  explicit FileStore(std::string path);
  // Creates the file now, so a bad path fails here with the path in the message.
  static StatusOr<std::unique_ptr<FileStore>> open(std::string path);

  const std::string& path() const { return path_; }

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  StatusOr<int64_t> num_keys() override;

 private:
  enum class Access { kRead, kWrite };
  // Runs `op` on the up-to-date table with the file locked for `access`. A kWrite op appends the
  // log records of its changes to `*records`; they are written before the lock is released.
  using Operation = std::function<Status(KeyValueTable& table, std::string* records)>;
  Status transact(Access access, Duration lock_timeout, const Operation& op);

  // Locked-file steps of transact.
  Status lock_file(int fd, Access access, Duration lock_timeout) const;
  Status catch_up(int fd, Access access);
  Status append(int fd, const std::string& records);
  void forget_cache();

  // Polls until `keys` exist; on success `on_present` runs with the file still locked.
  Status poll_until_present(const std::vector<std::string>& keys, Duration timeout,
                            const std::function<void(const KeyValueTable&)>& on_present);

  const std::string path_;
  const std::string name_;  // "file store <path>" for messages

  // The log replayed up to byte `log_offset_` of the file identified by (dev, ino); guarded by
  // the process-wide file-store mutex. A different inode (the file was replaced) or a shorter
  // file resets it.
  KeyValueTable table_;
  off_t log_offset_ = 0;
  dev_t log_device_ = 0;
  ino_t log_inode_ = 0;
};

}  // namespace cohort::comm
