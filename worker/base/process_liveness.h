#pragma once

// Whether a process of this host still runs, from /proc. A pid alone is not an identity: pids
// are reused, so a process is its pid plus its start time (/proc/<pid>/stat field 22, clock ticks
// since boot). Used by the intra-node transports to turn a peer that died into an error at once,
// where the transport's own keepalive may not notice it (UCX, before an endpoint is wired up).

#include <cstdint>

namespace cohort {

struct ProcessIdentity {
  int pid = 0;
  uint64_t start_time = 0;
};

// This process.
ProcessIdentity this_process();

// The state letter (R, S, D, T, Z, ...) and start time of `pid` as seen from this process's pid
// namespace; false when it has no entry (exited and reaped, or not visible from here).
bool read_proc_stat(int pid, char* state, uint64_t* start_time);

// Whether `process` is visible from here as itself (same pid, same start time) and not a zombie:
// a peer in another pid namespace is not, so check this once while the peer is known to be alive
// before relying on process_gone().
bool process_visible(const ProcessIdentity& process);

// For a process that was visible: true once it has exited (no entry, a zombie, or its pid now
// belongs to another process). A stopped process is not gone.
bool process_gone(const ProcessIdentity& process);

}  // namespace cohort
