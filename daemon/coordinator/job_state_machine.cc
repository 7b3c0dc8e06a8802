#include "daemon/coordinator/job_state_machine.h"

#include <array>
#include <utility>

namespace cohort::coordinator {

namespace {

constexpr std::array<JobState, 6> kAllStates = {JobState::kPending, JobState::kPlaced,
                                                JobState::kRunning, JobState::kSucceeded,
                                                JobState::kFailed,  JobState::kCancelled};

}  // namespace

std::string_view job_state_name(JobState state) {
  switch (state) {
    case JobState::kPending:
      return "PENDING";
    case JobState::kPlaced:
      return "PLACED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
  }
  return "UNKNOWN";
}

StatusOr<JobState> parse_job_state(std::string_view name) {
  for (JobState state : kAllStates) {
    if (job_state_name(state) == name) return state;
  }
  return invalid_argument_error(
      "unknown job state '{}'; expected PENDING, PLACED, RUNNING, SUCCEEDED, "
      "FAILED or CANCELLED",
      name);
}

bool is_terminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed || state == JobState::kCancelled;
}

bool is_legal_transition(JobState from, JobState to) {
  switch (from) {
    case JobState::kPending:
      return to == JobState::kPlaced || to == JobState::kCancelled;
    case JobState::kPlaced:
      return to == JobState::kRunning || to == JobState::kFailed || to == JobState::kCancelled;
    case JobState::kRunning:
      return to == JobState::kSucceeded || to == JobState::kFailed || to == JobState::kCancelled;
    case JobState::kSucceeded:
    case JobState::kFailed:
    case JobState::kCancelled:
      return false;
  }
  return false;
}

StatusOr<JobStateMachine> JobStateMachine::restore(JobState state, int attempt, std::string reason,
                                                   int max_restarts) {
  if (attempt < 1) return invalid_argument_error("stored job has attempt {}; attempts count from 1", attempt);
  if (max_restarts < 0) return invalid_argument_error("stored job has max_restarts {}", max_restarts);
  JobStateMachine machine(max_restarts);
  machine.state_ = state;
  machine.attempt_ = attempt;
  machine.reason_ = std::move(reason);
  return machine;
}

StatusOr<JobTransition> JobStateMachine::transition(JobState to, std::string reason) {
  if (!is_legal_transition(state_, to)) {
    std::string_view why = is_terminal(state_) ? "the job already finished"
                           : to == JobState::kPending
                               ? "only a failed attempt with restarts left returns to PENDING"
                               : "that move is not in the job life cycle";
    return failed_precondition_error("job state cannot go from {} to {}: {}", job_state_name(state_),
                                     job_state_name(to), why);
  }
  JobTransition change{state_, to, attempt_, reason};
  state_ = to;
  reason_ = std::move(reason);
  return change;
}

StatusOr<JobTransition> JobStateMachine::fail_attempt(std::string reason) {
  if (state_ != JobState::kPlaced && state_ != JobState::kRunning) {
    return failed_precondition_error("job state cannot go from {} to FAILED: attempt {} is not running",
                                     job_state_name(state_), attempt_);
  }
  if (restarts_left() <= 0) {
    std::string final_reason = max_restarts_ == 0 ? std::move(reason)
                                                  : fmt::format("{} (attempt {}; all {} restart(s) used)",
                                                                reason, attempt_, max_restarts_);
    return transition(JobState::kFailed, std::move(final_reason));
  }
  JobTransition change{state_, JobState::kPending, attempt_ + 1, ""};
  change.reason = fmt::format("attempt {} failed: {}; restarting (restart {} of {})", attempt_, reason,
                              attempt_, max_restarts_);
  state_ = JobState::kPending;
  attempt_ += 1;
  reason_ = change.reason;
  return change;
}

}  // namespace cohort::coordinator
