#pragma once

// RendezvousJournal: where one attempt's Rendezvous and its KvStore write down what a coordinator
// taking over needs to continue them (issue 16). A store that several coordinators share (etcd,
// daemon/etcd/etcd_rendezvous_journal.h) gives each placed attempt a journal; the embedded SQLite
// store gives none: the rendezvous then lives only in the coordinator's memory, and a restart of
// that single coordinator loses it (a rank in the middle of it fails, and its job restarts by its
// policy).
//
// What is written, and why only that: a fact a rank has been told and will not assert again.
//   - the join completing: once every rank joined, ranks were answered and will not join again, so
//     the completed set is written before anyone is woken. A join still waiting is not written: its
//     rank is blocked in the call, and the call, broken by a failover, is sent again to the new
//     leader (worker/base/leader_channel.h), which counts it then. The answer itself (rank, sizes,
//     master) is a function of the placement, which the job record stores.
//   - a barrier opening (its generation) and a rank leaving, for the same reason; a barrier call
//     sent again with its generation (Rendezvous::barrier) after the old leader opened that barrier
//     is answered from the journaled generation, not counted in the next one;
//   - every store write (set, add, compare_set, delete): other ranks read it later. An add or delete
//     sent with a request id also writes its answer, so the same request sent again after a
//     failover (the old leader applied it, its answer was lost) gets that answer instead of being
//     applied twice.
// Each change is one write (one etcd transaction), made under the rendezvous's or the store's lock
// before the change becomes visible: when it fails, nothing changes and the caller gets UNAVAILABLE
// (its client moves to the leader and sends the call again).
//
// Thread-safe: the Rendezvous and its KvStore call it from any gRPC handler thread. Blocks on I/O.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::coordinator {

// How many answered request ids a store remembers (and its journal keeps). A client sends a call
// again within its own deadline, seconds after the failover, so a few thousand of the newest cover
// every call still in flight even in jobs of thousands of ranks.
inline constexpr size_t kMaxAnsweredRequests = 4096;

// A store write's request id and the answer it got.
struct AnsweredRequest {
  std::string id;
  std::string answer;

  bool operator==(const AnsweredRequest& other) const { return id == other.id && answer == other.answer; }
};

// The progress of an attempt's rendezvous itself.
struct RendezvousProgress {
  std::set<int> joined;            // every rank once the join completed, else empty
  int64_t barrier_generation = 0;  // barriers opened so far
  std::set<int> left;              // ranks that left

  bool operator==(const RendezvousProgress& other) const {
    return joined == other.joined && barrier_generation == other.barrier_generation && left == other.left;
  }
};

// Everything a journal holds of one attempt, as a new leader reads it back.
struct RendezvousState {
  RendezvousProgress progress;
  std::map<std::string, std::string> data;  // the store's keys and values
  std::vector<AnsweredRequest> answered;    // oldest first

  bool empty() const { return progress == RendezvousProgress{} && data.empty() && answered.empty(); }
};

class RendezvousJournal {
 public:
  virtual ~RendezvousJournal() = default;

  // The rendezvous's progress is now `progress`.
  virtual Status write_progress(const RendezvousProgress& progress) = 0;

  // A store write: `key` now holds `value` (std::nullopt: deleted). `answered`: a request's answer
  // to remember (an empty id: none); `forget`: request ids no longer remembered. One write.
  virtual Status write_key(const std::string& key, const std::optional<std::string>& value,
                           const AnsweredRequest& answered, const std::vector<std::string>& forget) = 0;
};

}  // namespace cohort::coordinator
