#pragma once

// JobStateMachine: a job's life cycle, with only the legal moves.
//
//   PENDING ──▶ PLACED ──▶ RUNNING ──▶ SUCCEEDED
//      │          │  │        │  └───▶ FAILED
//      │          │  └────────┼──────▶ FAILED
//      └──────────┴───────────┴──────▶ CANCELLED
//
// A failed attempt (from PLACED or RUNNING) with restarts left goes back to PENDING with the next
// attempt number instead of FAILED; that move exists only through fail_attempt(), never as a plain
// transition, so no caller can re-queue a job without spending a restart. SUCCEEDED, FAILED and
// CANCELLED are final. Every state carries the reason it was entered with.
//
// A value type; not thread-safe (the Coordinator serializes access). Non-blocking.

#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::coordinator {

enum class JobState { kPending, kPlaced, kRunning, kSucceeded, kFailed, kCancelled };

// "PENDING", "PLACED", ... (the wire enum's names, and the JobStore's column values).
std::string_view job_state_name(JobState state);
// The inverse of job_state_name; INVALID_ARGUMENT for anything else.
StatusOr<JobState> parse_job_state(std::string_view name);
// SUCCEEDED, FAILED and CANCELLED.
bool is_terminal(JobState state);
// Whether `from → to` is a plain transition (the restart move PLACED/RUNNING → PENDING is not).
bool is_legal_transition(JobState from, JobState to);

// One state change, as recorded in the job's event log.
struct JobTransition {
  JobState from = JobState::kPending;
  JobState to = JobState::kPending;
  int attempt = 1;     // the attempt the change belongs to (the new one for a restart)
  std::string reason;  // why
};

class JobStateMachine {
 public:
  // A new job: PENDING, attempt 1, "submitted".
  JobStateMachine() = default;
  explicit JobStateMachine(int max_restarts) : max_restarts_(max_restarts) {}

  // A machine rebuilt from a stored record. INVALID_ARGUMENT for attempt < 1 or negative restarts.
  static StatusOr<JobStateMachine> restore(JobState state, int attempt, std::string reason, int max_restarts);

  JobState state() const { return state_; }
  int attempt() const { return attempt_; }
  const std::string& reason() const { return reason_; }
  int max_restarts() const { return max_restarts_; }
  // Restarts not yet used: attempts 1 .. max_restarts+1 are allowed.
  int restarts_left() const { return max_restarts_ + 1 - attempt_; }

  // Moves to `to` with `reason`. FAILED_PRECONDITION naming both states when the move is illegal
  // (the state is unchanged then).
  StatusOr<JobTransition> transition(JobState to, std::string reason);

  // The current attempt failed for `reason`. With restarts left: PENDING, attempt + 1, and a reason
  // that says which attempt failed and why. Otherwise FAILED with `reason`. FAILED_PRECONDITION
  // unless the job is PLACED or RUNNING (only a started attempt can fail).
  StatusOr<JobTransition> fail_attempt(std::string reason);

 private:
  JobState state_ = JobState::kPending;
  int attempt_ = 1;
  std::string reason_ = "submitted";
  int max_restarts_ = 0;
};

}  // namespace cohort::coordinator
