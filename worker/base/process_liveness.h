#pragma once

// Whether a process of this host still runs, from /proc. A pid alone is not an identity: pids
// are reused, so a process is its pid plus its start time (/proc/<pid>/stat field 22, clock ticks
// since boot). Used by the intra-node transports to turn a peer that died into an error at once,
// where the transport's own keepalive may not notice it (UCX, before an endpoint is wired up).

#include <cstdint>
#include <string>

namespace cohort {

struct ProcessIdentity {
  int pid = 0;
  uint64_t start_time = 0;  // 0: unknown (not checkable)
  // Where the pid means something: this kernel's boot id and the pid namespace's inode. Two
  // processes can check each other by pid only when both match.
  std::string boot_id;
  uint64_t pid_namespace = 0;

  // Whether `other`'s pid and start time can be looked up in this process's /proc.
  bool same_pid_space(const ProcessIdentity& other) const {
    return start_time != 0 && other.start_time != 0 && !boot_id.empty() && boot_id == other.boot_id &&
           pid_namespace != 0 && pid_namespace == other.pid_namespace;
  }
};

// This process. start_time stays 0 (unknown) when /proc is not this pid namespace's (e.g. a
// `unshare -p` without its own /proc mount), so nobody checks it by pid.
ProcessIdentity this_process();

// The state letter (R, S, D, T, Z, ...) and start time of `pid` as seen from this process's pid
// namespace; false when it could not be read, with errno ENOENT or ESRCH when there is no such
// process (exited and reaped), another errno when reading failed for another reason (EMFILE, ...).
bool read_proc_stat(int pid, char* state, uint64_t* start_time);

// Whether `process` is visible from here as itself (same pid, same start time) and not a zombie.
bool process_visible(const ProcessIdentity& process);

// For a process of the same pid space: true once it has exited (no entry, a zombie, or its pid now
// belongs to another process). A stopped process is not gone, and neither is one whose entry
// could not be read for another reason than its absence (too many open files, ...).
bool process_gone(const ProcessIdentity& process);

}  // namespace cohort
