#pragma once

// FileRendezvous: how the processes of one job meet in a file:// store, and why a file left over
// from an earlier job never hands its keys to a new one.
//
// torch.distributed's FileStore deletes its file when the last process exits cleanly and leaves
// it behind after a crash; the next job on the same path then reads the old job's keys (old
// transport addresses, old counters) and hangs or connects to dead peers. cohort does not rely on
// deletion. The file holds numbered *generations*; each job uses a fresh one, and every key the
// job sees lives under it ("cohort/file_init/<group>/g<k>/..." in the file):
//
//   1. Read the group's current generation k.
//   2. A generation whose first process joined longer ago than the join window (the init timeout:
//      a job whose ranks arrive further apart fails its rendezvous anyway) belongs to a job that
//      is dead or done: move the group to k+1 (compare-and-set, so concurrent joiners agree).
//   3. The first joiner of k records its world size; then each process takes a slot with an
//      atomic counter. A slot past the world size means k is full, i.e. taken by an earlier job
//      (finished or crashed): move to k+1 and start again.
//   4. Ranks: given ones claim "rank/<r>" in k (a second claim is an error naming the file, not a
//      silent merge); missing ones are assigned in arrival order (the slot number), so only the
//      world size is required (torch.distributed's rank=-1).
//
// What stays unsafe, and is refused where it can be seen: a job that starts on the path less
// than a join window after an earlier job crashed *before all its ranks joined* would share that
// job's generation; a world size or rank that disagrees with it is an INVALID_ARGUMENT naming the
// file and what to do (delete the file or use a fresh path / group_name).

#include <functional>
#include <memory>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

// Longest group name, and its characters: it becomes part of every key in the file.
inline constexpr size_t kMaxFileGroupNameBytes = 128;
// Join attempts before giving up: each failed attempt means another job moved the generation at
// the same moment, so a handful suffice; the bound keeps a broken store from looping.
inline constexpr int kMaxFileJoinAttempts = 64;

struct FileRendezvousOptions {
  std::string path;                             // the file (for messages)
  std::string group_name;                       // "": the default group; several groups may share one file
  int rank = -1;                                // -1: assigned in arrival order
  int world_size = -1;                          // required
  Duration join_window = kDefaultStoreTimeout;  // generations older than this are dead (the init timeout)
  // Wall clock in milliseconds since the epoch (shared by every host on the filesystem); a test
  // seam, defaults to std::chrono::system_clock.
  std::function<int64_t()> now_ms;
};

struct FileRendezvous {
  std::shared_ptr<Store> store;  // the job's namespace: PrefixStore of its generation
  int rank = -1;
  int generation = 0;
};

// INVALID_ARGUMENT for a name that is not 1..kMaxFileGroupNameBytes of [A-Za-z0-9_.-].
Status check_group_name(const std::string& group_name);

// Joins a generation of `file` (a FileStore, or any store in tests) as described above. Never
// blocks on other processes: it only takes a slot; the bootstrap that follows waits for peers.
StatusOr<FileRendezvous> join_file_rendezvous(const std::shared_ptr<Store>& file,
                                              const FileRendezvousOptions& options);

}  // namespace cohort::comm
