#pragma once

// SharedMemoryEngine: the collectives of ranks that share a node, through one shared-memory
// segment instead of transport messages (MPI's vader / NCCL's SHM path / oneCCL's CPU allreduce).
//
// The segment (shm_open + ftruncate + mmap) holds a small control block per rank and a data slot
// per rank. Each rank copies (a chunk of) its input into its own slot; peers read it straight from
// there, reduce their slice out of every slot and copy results out. No message is sent.
//
// Protocol. Ranks advance in *phases*: each rank's control block holds `arrive`, the number of
// phases it has ended (a generation counter, compared with wrap-around). In phase i a rank writes
// only bank (i % 2) of its own slot and reads only bank ((i - 1) % 2) of its peers' slots, written
// in their phase i - 1. Two rules keep a bank from being written while a slow peer still reads
// it: a rank reads a peer's bank only once the peer's `arrive` has reached i, and a rank writes
// its own bank in phase i only once every peer's `arrive` has reached i (`writable`: the readers
// of the bank's last contents, in phase i - 1, are done). Most operations end a phase with a
// full barrier (`step`: bump, wait for every peer), which satisfies both rules at once;
// broadcast synchronises only root and readers (the root bumps and leaves; a reader bumps and
// waits for the root alone), so a root may run one phase ahead, as MPI's eager broadcast does;
// broadcasts of at most kShmInlineBytes go through a per-root ring indexed by generation instead
// of the banks, where the root may run kShmRingEntries - 2 phases ahead.
// Large messages are pipelined in chunks of kShmChunkBytes (cache-sized): posting chunk t,
// reducing chunk t-1 and copying out chunk t-2 share one step.
//
// Waiting polls, then polls with sched_yield between polls (a peer sharing the core runs at once),
// then sleeps in FUTEX_WAIT on the peer's `arrive` word with a bounded slice, so a stopped or
// slow peer costs at most one spin of CPU per wait; after each slice the waiter checks the deadline and that the
// peer's process is alive (its pid and start time in /proc), so a dead rank becomes UNAVAILABLE
// naming it and a stopped one DEADLINE_EXCEEDED naming it, never a hang.
//
// Single copy (CMA), opt-in (see its windows below). Broadcasts and allgathers inside a size window
// skip the segment in groups of 2 ranks on at least 2 CPUs (any group with COHORT_SHM_CMA=1): each rank
// whose data is read publishes the address and length of its buffer in its Control and ends its
// phase, and its peers read straight from that buffer into theirs with process_vm_readv (Linux
// cross-memory attach, as OpenMPI's vader BTL does for large messages): one copy instead of two.
// A broadcast splits the copy so that the root's otherwise idle core works too: the readers read
// the first half from the root's buffer while the root stages the second half in its slots, and
// then copy that half out of the segment. No rank ever writes into another's buffer (a broadcast root that also wrote into its readers'
// buffers was faster but could write into a buffer whose reader had timed out and returned; see
// broadcast_single_copy). A rank ends the next phase only once its copying is done, and returns
// only once every peer that reads its buffer has ended it (awaited like any flag: futex,
// liveness, deadline), so no buffer changes or goes away while a peer reads it. Setup probes it
// when a window is open: every rank reads a test word in each peer's memory; if any rank cannot (Yama ptrace_scope 2+, a
// seccomp filter, ENOSYS, another user) or has it turned off (COHORT_SHM_CMA=0), every rank keeps
// the two-copy path, agreed through the segment, so no two ranks ever mix the protocols.
//
// Lifetime: rank 0 creates the segment under a name unique to the communicator and attempt;
// every rank maps it; once all have (agreed over the transport) every rank unlinks it, so nothing
// is left in /dev/shm after any exit, SIGKILL included. The only window is rank 0 dying between
// creating it and broadcasting the name, which the others see as a failed setup; under cohortd the
// agent then removes the name when it reaps rank 0 (the name carries its pid: TaskSupervisor).
//
// Thread-safety: none; one collective at a time, on the communicator's executor. Every rank of
// the group calls the same operation with the same sizes (as collectives.h's contract).

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/deadline.h"
#include "worker/comm/types.h"

namespace cohort::comm {

// Bytes of one pipeline chunk per rank: a step's working set (post, reduce, copy out: about three
// chunks) stays in the last-level cache, while each step's barrier is paid per MiB, not per
// 256 KiB: on an oversubscribed node every barrier can cost a scheduling slice (measured on 2
// cores: 16 MiB allreduce 25-37 ms with 1 MiB chunks, 45-72 ms with 256 KiB). Each slot holds
// two banks of an input and a result region of this size.
inline constexpr size_t kShmChunkBytes = 1024 * 1024;
// Allreduces of at most this many bytes take one barrier: every rank reduces the whole message
// from every slot (P·n bytes read each), cheaper than a second barrier at this size.
inline constexpr size_t kShmDirectReduceBytes = 16 * 1024;
// Broadcast moves the message in pieces of a quarter of it, at least this and at most a chunk, so
// the readers' copy-out of piece t overlaps the root's copy-in of piece t+1 (with one piece, the
// two copies of a 64 KiB broadcast ran back to back). Below this size a piece's flag costs more
// than the overlap saves.
inline constexpr size_t kShmBroadcastMinPieceBytes = 8 * 1024;
// Results of at least this many bytes are written to the caller's buffer with non-temporal
// stores: such a destination (with the peers' and the segment's) outgrows the last-level cache,
// and ordinary stores first read every destination line from memory (measured on the 2-core
// EPYC: 64 MiB written in 1 MiB pieces at 8.8 GB/s with memcpy, 26.6 GB/s streaming).
inline constexpr size_t kShmStreamingStoreBytes = 8 * 1024 * 1024;
// Bytes per rank that travel inside the flag's cache line instead of the slot (see Control).
inline constexpr size_t kShmInlineBytes = 16;
// Posts of at least this many bytes move through their bank (post_area): phase by phase a rank
// writes lines its peers have not read lately. Writing a line a peer has just read means taking
// it out of that peer's cache first, which made writes into the segment 3-4x slower than a
// memcpy. Measured with bench:segment_handoff on the 2-core EPYC (bench/README.md, 2026-11-24),
// two alternating places against places moving through 4 MiB, per message: 1 MiB in 256 KiB
// pieces 98-135 -> 35-46 us; 32 KiB 3.9-5.0 -> 1.8-2.2 us; 16 KiB 1.8-1.9 -> 1.2-1.3 us. Smaller
// posts lose instead (8 KiB 0.5 -> 1.3 us, 4 KiB 0.3 -> 1.0 us): lines that far back have left
// the writer's own cache too, and at that size fetching them costs more than the peer's probe.
inline constexpr size_t kShmRotateMinBytes = 16 * 1024;
// Entries of a rank's broadcast ring: how far (minus 2) a root may run ahead of its slowest
// reader with broadcasts of at most kShmInlineBytes.
inline constexpr size_t kShmRingEntries = 64;
// Single copy (CMA, see above) is opt-in: its windows (whole-message bytes) are empty unless
// COHORT_SHM_CMA_BROADCAST_BYTES / COHORT_SHM_CMA_ALLGATHER_BYTES = MIN[:MAX] open them on every
// rank (rank 0's bounds apply; a rank with no window open turns it off for all), and then
// apply only where every rank can, in groups of 2 ranks on at least 2 CPUs (COHORT_SHM_CMA=1: any
// group, =0: never). It used to be on for broadcasts of 64 KiB-2 MiB and allgathers of
// 64-512 KiB at 2 ranks, where it beat the two copies through the segment. Since posts move
// through their bank (kShmRotateMinBytes), the two copies beat it at every size measured, 2 ranks
// on the 2-core EPYC (bench/README.md, 2026-11-24 10:21): process_vm_readv pins and copies page
// by page, 32 KiB in 3.6 us against memcpy's 0.6 us; 1 MiB in 82-104 us against 22 us.
// Group sizes above this use the transport (the segment and the flag scans grow with P).
inline constexpr int kShmMaxRanks = 64;
// Longest FUTEX_WAIT before the waiter rechecks its deadline and the peer's liveness.
inline constexpr Duration kShmLivenessInterval = std::chrono::milliseconds(20);

// Runs one collective over the transport (the communicator's run_collective): the engine's
// setup exchanges the segment's name and agrees on success that way.
using TransportCollective = std::function<Status(const std::function<Status(CollectiveContext&)>&)>;

class SharedMemoryEngine {
 public:
  // Creates and maps the segment for `size` ranks (this is `rank`). Collective over the group:
  // every rank calls it at the same point; every rank gets an engine or every rank an error (a
  // rank that cannot map, e.g. another /dev/shm, fails them all). A malformed COHORT_SHM_*
  // variable on any rank fails every rank with INVALID_ARGUMENT before anything is created (the
  // ranks exchange their verdicts first; the others' errors name that rank, variable and value).
  // Valid but different values are fine: each rank's wait times are its own, single copy is on
  // only where every rank has it on, and the windows are rank 0's. `label` names the
  // communicator in errors and in the segment's name.
  static StatusOr<std::unique_ptr<SharedMemoryEngine>> create(int rank, int size, const std::string& label,
                                                              const TransportCollective& transport,
                                                              Deadline deadline);
  ~SharedMemoryEngine();
  SharedMemoryEngine(const SharedMemoryEngine&) = delete;
  SharedMemoryEngine& operator=(const SharedMemoryEngine&) = delete;

  // True when every rank is this process (threads over a loopback transport): the engine works,
  // but gains nothing over in-process copies, so the selector uses it only when forced.
  bool in_process() const { return in_process_; }
  // Which messages go single-copy (whole message, bytes; the same on every rank: rank 0's
  // settings). Empty windows (min > max) where the setup's probe found CMA unusable on some rank
  // or some rank turned it off.
  struct SingleCopyWindow {
    size_t min = SIZE_MAX;
    size_t max = 0;
    bool covers(size_t bytes) const { return bytes >= min && bytes <= max; }
  };
  SingleCopyWindow single_copy_broadcast() const { return broadcast_window_; }
  SingleCopyWindow single_copy_allgather() const { return allgather_window_; }
  // Operations this process has run single-copy, over all its engines (for tests and benchmarks:
  // the path is invisible otherwise).
  static uint64_t single_copy_operations();

  // `recv` (count elements) becomes the reduction of every rank's `send` (null or == recv: in
  // place), on every rank when root < 0, else on `root` only (others' recv untouched). op is
  // never AVG (the communicator scales).
  Status allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                   Deadline deadline);
  // `recv` (counts[rank] elements) becomes block `rank` of the reduction of every rank's `send`
  // (sum(counts) elements, blocks in rank order).
  Status reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& counts, DataType dtype,
                         ReduceOp op, Deadline deadline);
  // Every rank's `buf` becomes the root's.
  Status broadcast(void* buf, size_t bytes, int root, Deadline deadline);
  // `recv` becomes the concatenation of every rank's `send` (bytes[r] from rank r) on every rank
  // (root < 0) or on root only. With root < 0, `bytes` must be identical on every rank; with a
  // root only bytes[rank] must be right everywhere (the engine exchanges the lengths).
  Status gatherv(const void* send, void* recv, const std::vector<size_t>& bytes, int root, Deadline deadline);
  // Rank r's `recv` receives block r of the root's `send` (the root's `bytes` count).
  Status scatterv(const void* send, void* recv, const std::vector<size_t>& bytes, int root, Deadline deadline);
  // `recv` receives recv_bytes[p] bytes from every rank p (p's block for this rank).
  Status alltoallv(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                   const std::vector<size_t>& recv_bytes, Deadline deadline);
  Status barrier(Deadline deadline);

 private:
  struct Control;
  SharedMemoryEngine(int rank, int size, std::string label, uint8_t* base, size_t bytes);

  Control& control(int r) const;
  // Bank `bank` of rank r's slot: its input region, and its result region.
  uint8_t* input(int r, int bank) const;
  uint8_t* result(int r, int bank) const;
  // Where rank r posts `bytes` (at most kShmChunkBytes) in its phase `phase` (bank phase % 2): its
  // Control's inline line when they fit, else a region of the bank that moves on every phase of
  // that bank (see kShmRotateMinBytes). Writer and readers pass the same phase and `bytes`, so
  // they agree.
  uint8_t* post_area(int r, uint32_t phase, size_t bytes) const;
  // Rank r's broadcast-ring entry for the phase `generation`.
  uint8_t* ring_entry(int r, uint32_t generation) const;
  // The generation tag of a ring entry (see kRingEntryBytes).
  static std::atomic<uint64_t>& ring_tag(uint8_t* entry);
  // The bank this rank writes in the current step; peers' data of the previous step is in 1 - it.
  int bank() const { return static_cast<int>(arrived_ & 1u); }

  // Ends a step: bumps this rank's generation, wakes sleepers, waits for every peer.
  Status step(Deadline deadline, const char* op);
  // Ends this rank's phase without waiting: bumps the generation and wakes sleepers. Fails with
  // the first failure once one has happened.
  Status publish(const char* op);
  // Waits until this rank may write its own bank of the current phase: every peer has ended the
  // phase before (free when the last phase ended with a full barrier).
  Status writable(Deadline deadline, const char* op);
  // wait_for, recording a failure (the ranks' generations have diverged after it).
  Status await(int peer, uint32_t target, Deadline deadline, const char* op);
  // Broadcast's piece size for a message of `bytes`.
  size_t broadcast_piece(size_t bytes) const;
  Status wait_for(int peer, uint32_t target, Deadline deadline, const char* op);
  // OK while `peer`'s process runs; UNAVAILABLE naming it once it has exited.
  Status check_alive(int peer, const char* op) const;
  // Setup: reads every peer's probe word through CMA, records this rank's verdict and windows in
  // its Control, barriers, and sets the windows: rank 0's where every rank can, else empty.
  // `wanted` is false where COHORT_SHM_CMA=0 here.
  Status agree_on_single_copy(bool wanted, SingleCopyWindow broadcast, SingleCopyWindow allgather,
                              Deadline deadline);
  // Exposes `bytes` at `data` to the peers for the current phase (see "Single copy").
  void expose(const void* data, size_t bytes);
  // Takes this rank's exposure back: a rank that returns an error from a single-copy operation
  // does so before its program may reuse the buffer, so a peer that comes late finds nothing to
  // read (or finds it gone when its copy ends) and fails instead of returning reused memory.
  void withdraw_exposure();
  // Copies `bytes` of what `peer` exposed in the phase it has just ended (from offset `offset` in
  // it) into `local` with process_vm_readv; a copy during which the peer withdrew is void. Records
  // and returns an error naming the peer.
  Status read_exposed(int peer, size_t offset, void* local, size_t bytes, const char* op);
  Status broadcast_single_copy(void* buf, size_t bytes, int root, Deadline deadline);
  // The part of a single-copy broadcast of `bytes` that readers read from the root's buffer.
  static size_t split_head(size_t bytes);
  Status allgather_single_copy(const void* send, void* recv, const std::vector<size_t>& bytes, Deadline deadline);

  // Every rank writes `row` (size_ values) to its slot; returns all rows (size_ × size_). One step.
  StatusOr<std::vector<uint64_t>> exchange_rows(const std::vector<uint64_t>& row, Deadline deadline,
                                                const char* op);
  // The streaming pipeline of broadcast / gather / scatter / alltoall: rank p exposes lengths[p]
  // bytes of `source` (its own), chunk t in step t; in step t+1 every rank hands chunk t of each
  // peer to `consume(p, offset in p's stream, data, bytes)`. This rank's own chunks go to
  // `consume` in step t, or, with `own_out` set, are written there with streaming stores in the
  // same pass that copies them into the slot (`consume` then never sees this rank).
  using Consume = std::function<void(int peer, size_t offset, const uint8_t* data, size_t bytes)>;
  Status stream(const uint8_t* source, const std::vector<size_t>& lengths, const Consume& consume,
                Deadline deadline, const char* op, uint8_t* own_out = nullptr);

  const int rank_;
  const int size_;
  const std::string label_;
  uint8_t* const base_;
  const size_t bytes_;
  uint32_t arrived_ = 0;  // phases this rank has ended (== control(rank_).arrive)
  uint32_t known_ = 0;    // every peer's `arrive` is known to be at least this
  // arrived_ without the wrap: the tiny broadcast ring's tags (kRingEntryBytes).
  uint64_t phases_ = 0;
  // The first failure: ranks' generations have diverged, so every later operation fails with it.
  Status failure_;
  bool in_process_ = false;
  bool oversubscribed_ = false;  // more ranks than online CPUs: yield from the first miss
  std::chrono::microseconds spin_time_{};  // how long a waiter polls before the futex (kSpinTime, COHORT_SHM_SPIN_US)
  std::chrono::microseconds poll_time_{};  // how long of it without yielding (kPurePollTime, COHORT_SHM_POLL_US)
  std::vector<int> pids_;                  // each rank's pid (as this rank sees it)
  std::vector<uint64_t> start_times_;      // each rank's process start time, to tell pid reuse
  std::vector<bool> liveness_checkable_;   // false where the pid was not this rank's to check
  SingleCopyWindow broadcast_window_;        // see single_copy_broadcast()
  SingleCopyWindow allgather_window_;
  uint64_t probe_word_ = 0;                  // setup: what peers read through CMA (its value is in the segment)

};

}  // namespace cohort::comm
