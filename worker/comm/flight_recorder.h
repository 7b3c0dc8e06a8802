#pragma once

// FlightRecorder: the last N operations of a communicator (sequence, op, sizes, root/peer,
// algorithm, start/end, outcome), point-to-point transfers included, so a timeout or mismatch
// explains itself. Dumped to the log when an operation times out; tests and tools read it with
// dump(); flight_recorder_registry.h dumps every live recorder of the process as a Chrome trace on
// demand (a signal or a call).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/types.h"

namespace cohort::comm {

inline constexpr size_t kDefaultFlightRecorderSize = 64;

// What an operation is, kept as plain fields so the hot path formats and allocates nothing; the
// text ("f32 x 1024, sum, root 0") is made only for errors, dumps and debug cross-checks.
struct OpInfo {
  const char* op = "";           // "allreduce": a string literal
  int dtype = -1;                // a DataType value, or -1 when the op has none (barrier)
  size_t count = 0;              // elements
  const char* count_label = "";  // "" | " total" | " sent": what `count` counts
  int reduce_op = -1;            // a ReduceOp value, or -1
  int root = -1;                 // or -1
  int peer = -1;                 // point to point: the other rank; -1 for collectives
  int tag = -1;                  // point to point: the user's tag

  bool is_point_to_point() const { return peer >= 0; }
  // "f32 x 1024, sum, root 0", "f32 x 8, peer 1, tag 0" (empty for a barrier).
  std::string detail() const;
  // "allreduce(f32 x 1024, sum)".
  std::string signature() const { return std::string(op) + "(" + detail() + ")"; }
};

// `text` as a JSON string literal, quotes included (for trace dumps).
std::string json_string(std::string_view text);

struct FlightRecord {
  uint64_t sequence = 0;
  OpInfo info;
  Clock::time_point start;
  std::optional<Clock::time_point> end;  // unset while running
  Status status;            // the outcome once ended
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = kDefaultFlightRecorderSize)
      : capacity_(capacity), exclusive_(std::make_unique<ExclusiveSlot[]>(capacity)) {}

  // Records the start of an operation; returns its slot id for finish(). Thread-safe.
  uint64_t start(uint64_t sequence, const OpInfo& info) { return start(sequence, info, Clock::now()); }
  // The same with the start time the caller already read (a collective reads the clock once for
  // its deadline, its record and its blocked time). Allocates nothing once the window is full.
  uint64_t start(uint64_t sequence, const OpInfo& info, Clock::time_point at);
  // Records the end of operation `id` (ignored if it fell out of the window). Thread-safe.
  void finish(uint64_t id, const Status& status) { finish(id, status, Clock::now()); }
  void finish(uint64_t id, const Status& status, Clock::time_point at);

  // The same for the one-at-a-time lane: operations of which only one runs at a time and whose
  // successive callers are ordered by the caller (a communicator's collectives, started and
  // finished by the holder of its run token, whose acquire and release order one holder's writes
  // before the next one's). Takes no lock and no locked instruction: each slot is a sequence lock
  // the readers retry. An error outcome is copied under the ring's lock (it is rare). Calling
  // these from two threads at once is a race. Ids are this lane's own: finish_exclusive() only.
  uint64_t start_exclusive(uint64_t sequence, const OpInfo& info, Clock::time_point at);
  void finish_exclusive(uint64_t id, const Status& status, Clock::time_point at);

  // One line per recorded operation, oldest first:
  // "#12 allreduce f32 x 1024, sum: OK after 1.2 ms" / "... RUNNING for 30.0 s".
  std::string dump() const;
  // How many error outcomes of the one-at-a-time lane are kept (at most those in its window).
  size_t exclusive_errors_kept() const;

  // The recorded operations as Chrome Trace Event Format objects ("ph":"X" complete events, ts
  // and dur in microseconds of the wall clock, so dumps of several ranks line up), each followed
  // by a comma, appended to `out`: collectives on thread `tid`, point to point on `tid + 1` (they
  // overlap collectives and each other). Running operations end at the dump. Thread-safe.
  void append_chrome_trace_events(int pid, int64_t tid, std::string* out) const;

 private:
  struct Entry {
    uint64_t id;
    FlightRecord record;
  };
  // A lock for the ring that costs one atomic write per use (an exchange to take it, a plain store
  // to give it back) where std::mutex costs two: start() and finish() run on every operation.
  // Held only to copy a record in or out (dumps copy the ring and format outside), so a waiter
  // spins briefly and then yields.
  class RingLock {
   public:
    void lock() {
      while (taken_.exchange(true, std::memory_order_acquire)) {
        for (int spins = 0; taken_.load(std::memory_order_relaxed); ++spins) {
          if (spins >= kSpinsBeforeYield) std::this_thread::yield();
        }
      }
    }
    void unlock() { taken_.store(false, std::memory_order_release); }

   private:
    static constexpr int kSpinsBeforeYield = 64;
    std::atomic<bool> taken_{false};
  };

  // A slot of the one-at-a-time lane: every field atomic (relaxed stores are plain stores), so a
  // reader that races the writer reads a torn record, never undefined behaviour, and `version`
  // tells it to retry: odd while the writer is inside, bumped twice per write.
  struct ExclusiveSlot {
    std::atomic<uint64_t> version{0};
    std::atomic<uint64_t> id{0};  // the operation's id + 1; 0 while the slot is unused
    std::atomic<uint64_t> sequence{0};
    std::atomic<const char*> op{""};
    std::atomic<const char*> count_label{""};
    std::atomic<size_t> count{0};
    std::atomic<int> dtype{-1};
    std::atomic<int> reduce_op{-1};
    std::atomic<int> root{-1};
    std::atomic<int64_t> start{0};  // Clock ticks since its epoch
    std::atomic<int64_t> end{0};
    std::atomic<bool> ended{false};
    std::atomic<bool> failed{false};  // the status is in exclusive_errors_
  };
  // Writer side of a slot's sequence lock: the slot's fields may be stored between them.
  static void begin_write(ExclusiveSlot& slot);
  static void end_write(ExclusiveSlot& slot);
  // A consistent copy of `slot`, or nothing when it is unused.
  std::optional<std::pair<uint64_t, FlightRecord>> read_exclusive(const ExclusiveSlot& slot) const;

  // The recorded operations of both lanes, oldest first (a copy, so dumps format without holding
  // the lock).
  std::vector<FlightRecord> snapshot() const;

  const size_t capacity_;
  mutable RingLock lock_;
  // A ring: operation `id` sits in slot id % capacity_ while it is among the last capacity_
  // (entry.id tells a reused slot apart). Grows to capacity_ and is then overwritten in place,
  // so the hot path allocates nothing and a large capacity costs the ring's memory only once used
  // (the one-at-a-time lane's slots, below, are made with the recorder).
  std::vector<Entry> ring_;
  uint64_t next_id_ = 0;
  // The one-at-a-time lane: operation `id` in slot id % capacity_, like the ring; allocated with
  // the recorder (capacity_ slots of about 100 bytes). exclusive_next_ is only touched by the
  // lane's writer.
  std::unique_ptr<ExclusiveSlot[]> exclusive_;
  uint64_t exclusive_next_ = 0;
  // The error outcomes of the lane's operations still in its window, by id (under lock_).
  std::vector<std::pair<uint64_t, Status>> exclusive_errors_;
};

}  // namespace cohort::comm
