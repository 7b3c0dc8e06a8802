#pragma once

// Rendezvous: how the ranks of one job attempt meet. The Coordinator creates one per attempt when
// it places the job, from the placement it chose, so ranks are known before anyone joins:
//
//   1. join: each worker calls with its node id and its slot on that node (the agent told it). The
//      call blocks until every rank of the placement has joined, then answers with the rank the
//      placement gave that slot (node-major), the world and node sizes, and the master address.
//      Blocking until all have joined makes a rank that never starts an error for everyone
//      (DEADLINE_EXCEEDED naming the missing ranks) instead of a hang in the first collective.
//   2. the ranks bootstrap through store() (the attempt's KvStore).
//   3. barrier(rank): opens when every rank has called it; reusable (generations).
//   4. leave(rank): a rank is exiting; anyone in or entering a barrier fails at once.
//
// close(reason) ends the attempt's rendezvous — the Coordinator calls it when the attempt fails or
// is cancelled — and every blocked call (join, barrier, store waits) returns the reason at once.
//
// With a RendezvousJournal (a highly available coordinator, issue 16) the join completing, each
// barrier opening, each leave and every store write are journaled before anyone sees them, and a
// coordinator taking over rebuilds the attempt's Rendezvous from the journal (restore()), so ranks
// whose calls fail over to it get the answers they would have got from the old leader
// (rendezvous_journal.h says what is written and why that is enough).
//
// Thread-safe. Blocking calls take a timeout measured in real time (steady_clock).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/kv_store.h"
#include "daemon/coordinator/placement.h"
#include "daemon/coordinator/rendezvous_journal.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Default wait for every rank to join or reach a barrier (see kDefaultStoreTimeout for why long).
inline constexpr Duration kDefaultRendezvousTimeout = std::chrono::minutes(5);

// What a joining worker learns.
struct RankAssignment {
  int rank = 0;                // global, node-major
  int world_size = 0;          // ranks in the attempt
  int local_rank = 0;          // rank on its node
  int local_world_size = 0;    // ranks on its node
  int node_rank = 0;           // its node's position in the job
  int num_nodes = 0;           // nodes in the job
  std::string master_address;  // host of node rank 0 (MASTER_ADDR)
};

// The host part of "host:port", "[v6]:port" or a bare host.
std::string host_of_address(const std::string& address);

class Rendezvous {
 public:
  // The rendezvous of `attempt` of `job_id` over `placement` (non-empty, node-rank order).
  // `journal`: where its changes are journaled (null: memory only).
  Rendezvous(std::string job_id, int attempt, Placement placement,
             std::shared_ptr<RendezvousJournal> journal = nullptr);

  // Takes over what a journal held (a coordinator taking over the attempt): joined ranks, barrier
  // generation, left ranks and the store's contents. Call before any other method. INVALID_ARGUMENT
  // (nothing restored) for ranks outside the world.
  Status restore(const RendezvousState& state);

  const std::string& job_id() const { return job_id_; }
  int attempt() const { return attempt_; }
  const Placement& placement() const { return placement_; }
  int world_size() const { return world_size_; }
  // Host of node rank 0: where init methods that need a master (MASTER_ADDR) point.
  const std::string& master_address() const { return master_address_; }

  // Joins node `node_id`'s slot `local_slot` and blocks until every rank has joined or `timeout`
  // passes. Joining the same slot again (a retried RPC) is allowed and gets the same answer.
  // The join that completes the set journals it before waking anyone (UNAVAILABLE, and not counted,
  // when that fails). INVALID_ARGUMENT for a node not in the placement or a slot outside it;
  // DEADLINE_EXCEEDED naming the ranks that did not join; the close reason once closed.
  StatusOr<RankAssignment> join(const std::string& node_id, int local_slot,
                                Duration timeout = kDefaultRendezvousTimeout);

  // Blocks until every rank has called barrier (this generation) or `timeout` passes; a rank that
  // times out is withdrawn, so the barrier stays consistent for the others. INVALID_ARGUMENT for a
  // rank outside the world or already waiting; ABORTED when a rank has left; DEADLINE_EXCEEDED
  // naming the missing ranks; the close reason once closed.
  //
  // `generation`: the barriers this rank has passed in this attempt (0 for its first), which makes
  // the call safe to send again, as a request id makes a store add: a call for a barrier that has
  // opened already (its answer was lost, e.g. with the leader that opened it, whose successor
  // restored the opening from the journal) is answered OK at once and counted in no later barrier;
  // the same call arriving again while the first still waits waits with it (counted once). A
  // generation beyond the barriers opened is INVALID_ARGUMENT. Without it (std::nullopt), the call
  // counts in whichever barrier is open now, and a call sent again is not safe.
  Status barrier(int rank, Duration timeout = kDefaultRendezvousTimeout,
                 std::optional<int64_t> generation = std::nullopt);

  // Records that `rank` is done. Ranks in a barrier wake with ABORTED. Idempotent. Non-blocking.
  Status leave(int rank);

  // Whether every rank has left (the attempt's workers are all done with the rendezvous).
  bool all_left() const;

  // The progress as journaled (for tests and logs).
  RendezvousProgress progress() const;

  // The attempt's key-value store. Lives as long as this object; thread-safe.
  KvStore& store() { return store_; }

  // Ends the rendezvous: every blocked and later call returns `reason` (an OK reason becomes
  // CANCELLED). The first reason wins. Non-blocking.
  void close(Status reason);

 private:
  std::string describe() const { return "job " + job_id_ + " attempt " + std::to_string(attempt_); }
  RankAssignment assignment_for(const NodeAssignment& node, int local_slot) const;
  // Ranks in [0, world) not in `present`, as "3, 5 (node-b)".
  std::string missing_ranks(const std::set<int>& present) const;
  RendezvousProgress progress_locked() const;
  // Journals `progress` (OK without a journal); UNAVAILABLE naming `what` when that fails.
  Status journal_locked(const RendezvousProgress& progress, const std::string& what);

  const std::string job_id_;
  const int attempt_;
  const Placement placement_;
  const int world_size_;
  const std::string master_address_;
  const std::shared_ptr<RendezvousJournal> journal_;  // null: memory only
  KvStore store_;

  mutable std::mutex mu_;
  std::condition_variable changed_;  // notified on join completion, barrier opening, leave, close
  std::set<int> joined_;             // ranks that joined
  int64_t barrier_generation_ = 0;   // bumps each time the barrier opens
  std::map<int, int> in_barrier_;    // ranks waiting in the current generation -> calls waiting
  std::set<int> left_;
  Status closed_;  // OK while open
};

}  // namespace cohort::coordinator
