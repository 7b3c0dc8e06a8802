#include "daemon/coordinator/rendezvous.h"

#include <utility>

#include <fmt/ranges.h>

namespace cohort::coordinator {

std::string host_of_address(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.find(':');
  // No colon: a bare host. More than one: a bare IPv6 literal without a port.
  if (colon == std::string::npos || address.find(':', colon + 1) != std::string::npos) return address;
  return address.substr(0, colon);
}

Rendezvous::Rendezvous(std::string job_id, int attempt, Placement placement,
                       std::shared_ptr<RendezvousJournal> journal)
    : job_id_(std::move(job_id)),
      attempt_(attempt),
      placement_(std::move(placement)),
      world_size_(placement_.world_size()),
      master_address_(placement_.empty() ? std::string() : host_of_address(placement_.nodes.front().address)),
      journal_(std::move(journal)),
      store_("store of job " + job_id_ + " attempt " + std::to_string(attempt_), KvStoreLimits{},
             journal_.get()) {}

Status Rendezvous::restore(const RendezvousState& state) {
  for (const std::set<int>* ranks : {&state.progress.joined, &state.progress.left}) {
    for (int rank : *ranks) {
      if (rank < 0 || rank >= world_size_) {
        return invalid_argument_error("restoring the rendezvous of {}: rank {} is outside the world of {}",
                                      describe(), rank, world_size_);
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    joined_ = state.progress.joined;
    barrier_generation_ = state.progress.barrier_generation;
    left_ = state.progress.left;
  }
  store_.restore(state);
  return ok_status();
}

RendezvousProgress Rendezvous::progress() const {
  std::lock_guard<std::mutex> lock(mu_);
  return progress_locked();
}

RendezvousProgress Rendezvous::progress_locked() const {
  RendezvousProgress progress;
  if (static_cast<int>(joined_.size()) == world_size_) progress.joined = joined_;
  progress.barrier_generation = barrier_generation_;
  progress.left = left_;
  return progress;
}

Status Rendezvous::journal_locked(const RendezvousProgress& progress, const std::string& what) {
  if (journal_ == nullptr) return ok_status();
  Status written = journal_->write_progress(progress);
  if (written.ok()) return ok_status();
  // UNAVAILABLE either way: a deposed leader's client moves to the new leader and sends it again.
  return unavailable_error("{} of {}: the coordinator could not journal it, so nothing changed: {}", what,
                           describe(), written.message());
}

RankAssignment Rendezvous::assignment_for(const NodeAssignment& node, int local_slot) const {
  RankAssignment a;
  a.rank = node.first_rank + local_slot;
  a.world_size = world_size_;
  a.local_rank = local_slot;
  a.local_world_size = node.num_ranks;
  a.node_rank = node.node_rank;
  a.num_nodes = static_cast<int>(placement_.nodes.size());
  a.master_address = master_address_;
  return a;
}

std::string Rendezvous::missing_ranks(const std::set<int>& present) const {
  std::string out;
  for (const NodeAssignment& node : placement_.nodes) {
    std::string ranks;
    for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
      if (present.count(rank) != 0) continue;
      if (!ranks.empty()) ranks += ", ";
      ranks += std::to_string(rank);
    }
    if (ranks.empty()) continue;
    if (!out.empty()) out += "; ";
    out += ranks + " (node " + node.node_id + ")";
  }
  return out;
}

StatusOr<RankAssignment> Rendezvous::join(const std::string& node_id, int local_slot, Duration timeout) {
  const NodeAssignment* node = placement_.find_node(node_id);
  if (node == nullptr) {
    return invalid_argument_error("join {}: node '{}' is not in its placement (nodes: {})", describe(),
                                  node_id, placement_.node_list());
  }
  if (local_slot < 0 || local_slot >= node->num_ranks) {
    return invalid_argument_error("join {}: local slot {} is outside node '{}''s {} slot(s) (0 .. {})",
                                  describe(), local_slot, node_id, node->num_ranks, node->num_ranks - 1);
  }
  const RankAssignment assignment = assignment_for(*node, local_slot);

  std::unique_lock<std::mutex> lock(mu_);
  if (!closed_.ok()) return closed_;
  const bool was_complete = static_cast<int>(joined_.size()) == world_size_;
  if (joined_.insert(assignment.rank).second && static_cast<int>(joined_.size()) == world_size_) {
    // The last rank: the completed join is journaled before anyone learns of it.
    if (Status journaled =
            journal_locked(progress_locked(), "the join of rank " + std::to_string(assignment.rank));
        !journaled.ok()) {
      joined_.erase(assignment.rank);
      return journaled;
    }
  }
  if (!was_complete && static_cast<int>(joined_.size()) == world_size_) changed_.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  changed_.wait_until(lock, deadline,
                      [&] { return !closed_.ok() || static_cast<int>(joined_.size()) == world_size_; });
  if (!closed_.ok()) return closed_;
  if (static_cast<int>(joined_.size()) == world_size_) return assignment;
  // The joined slot stays recorded: a worker that retries after this timeout is still counted.
  return deadline_exceeded_error(
      "rendezvous of {} timed out after {}: {} of {} rank(s) joined; missing rank(s) {}", describe(),
      format_duration(timeout), joined_.size(), world_size_, missing_ranks(joined_));
}

Status Rendezvous::barrier(int rank, Duration timeout, std::optional<int64_t> generation) {
  if (rank < 0 || rank >= world_size_) {
    return invalid_argument_error("barrier of {}: rank {} is outside the world of {}", describe(), rank,
                                  world_size_);
  }
  std::unique_lock<std::mutex> lock(mu_);
  auto left_error = [&] {
    return aborted_error("barrier of {} cannot complete: rank(s) {} left the rendezvous", describe(),
                         fmt::join(left_, ", "));
  };
  if (!closed_.ok()) return closed_;
  if (generation.has_value()) {
    if (*generation < 0) {
      return invalid_argument_error("barrier of {}: rank {} sent generation {}; it counts barriers passed, from 0",
                                    describe(), rank, *generation);
    }
    // A call sent again for a barrier that opened already: its answer was lost, not its arrival.
    if (*generation < barrier_generation_) return ok_status();
    if (*generation > barrier_generation_) {
      return invalid_argument_error(
          "barrier of {}: rank {} asks for barrier {} (counting from 0), but only {} barrier(s) opened; a "
          "rank's generation is the number of barriers it has passed",
          describe(), rank, *generation, barrier_generation_);
    }
  }
  if (!left_.empty()) return left_error();
  auto waiting = in_barrier_.find(rank);
  if (waiting != in_barrier_.end() && !generation.has_value()) {
    return invalid_argument_error("barrier of {}: rank {} is already waiting in it", describe(), rank);
  }
  const int64_t current = barrier_generation_;
  if (waiting != in_barrier_.end()) {
    ++waiting->second;  // the same call sent again while the first waits: it waits too, counted once
  } else {
    in_barrier_.emplace(rank, 1);
  }
  if (static_cast<int>(in_barrier_.size()) == world_size_) {
    // The last arrival opens the barrier for this generation and resets it for the next.
    RendezvousProgress opened = progress_locked();
    ++opened.barrier_generation;
    if (Status journaled = journal_locked(opened, "opening barrier " + std::to_string(current));
        !journaled.ok()) {
      in_barrier_.erase(rank);
      return journaled;
    }
    ++barrier_generation_;
    in_barrier_.clear();
    changed_.notify_all();
    return ok_status();
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  changed_.wait_until(lock, deadline,
                      [&] { return barrier_generation_ != current || !closed_.ok() || !left_.empty(); });
  if (barrier_generation_ != current) return ok_status();
  // Withdrawn (a later call may arrive again), unless another call of the same rank still waits.
  if (auto self = in_barrier_.find(rank); self != in_barrier_.end() && --self->second == 0)
    in_barrier_.erase(self);
  if (!closed_.ok()) return closed_;
  if (!left_.empty()) return left_error();
  std::set<int> arrived;
  for (const auto& [waiting_rank, calls] : in_barrier_) arrived.insert(waiting_rank);
  arrived.insert(rank);
  return deadline_exceeded_error("barrier of {} timed out after {} at rank {}: rank(s) {} never arrived",
                                 describe(), format_duration(timeout), rank, missing_ranks(arrived));
}

Status Rendezvous::leave(int rank) {
  if (rank < 0 || rank >= world_size_) {
    return invalid_argument_error("leave {}: rank {} is outside the world of {}", describe(), rank,
                                  world_size_);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (left_.count(rank) != 0) return ok_status();
  RendezvousProgress after = progress_locked();
  after.left.insert(rank);
  COHORT_RETURN_IF_ERROR(journal_locked(after, "rank " + std::to_string(rank) + " leaving"));
  left_.insert(rank);
  changed_.notify_all();
  return ok_status();
}

bool Rendezvous::all_left() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(left_.size()) == world_size_;
}

void Rendezvous::close(Status reason) {
  if (reason.ok()) reason = cancelled_error("rendezvous of {} was closed", describe());
  store_.close(reason);
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_.ok()) return;
  closed_ = std::move(reason);
  changed_.notify_all();
}

}  // namespace cohort::coordinator
