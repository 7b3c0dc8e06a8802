#pragma once

// Follows a job to its end for `cohort submit --follow` and `cohort run`: prints each state change
// as a line and training progress from the job's Metrics events — a redrawn bar when the output is
// a terminal, plain lines (at most one every kPlainProgressInterval) otherwise — and returns the
// job's final record.
//
//   COHORT_ASSIGN_OR_RETURN(cohort::v1::JobRecord job, follow_job(client, id, context));
//   return job.state() == cohort::v1::SUCCEEDED ? kExitOk : kExitFailure;

#include <chrono>
#include <string>

#include "client/cli/command.h"
#include "client/client.h"
#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::client::cli {

// Plain (non-terminal) progress lines come at most this often, so a log file stays readable.
inline constexpr std::chrono::seconds kPlainProgressInterval{2};
// How long follow_job keeps trying to reach a coordinator that went away before giving up: a
// restart (systemctl restart cohortd) takes seconds, a crash loop or a dead host longer.
inline constexpr std::chrono::seconds kFollowReconnectWindow{60};
// The first wait between reconnect attempts; it doubles up to kFollowMaxRetryBackoff.
inline constexpr std::chrono::milliseconds kFollowInitialRetryBackoff{200};
inline constexpr std::chrono::milliseconds kFollowMaxRetryBackoff{5000};
// Characters of the progress bar itself.
inline constexpr int kProgressBarWidth = 24;

// One progress line: "epoch 1/2  step 420/938  loss 0.4321  acc 86.12%  1234 samples/s  ETA 42s",
// with a leading "[=====>     ]  45%" bar when `bar` and the total steps (Metrics.total_steps) are
// known. `spec` gives the samples per step for the ETA, and the epoch count when the report lacks it.
std::string format_progress(const cohort::v1::Metrics& metrics, const cohort::v1::JobSpec& spec, bool bar);

// Watches the job until it is SUCCEEDED, FAILED or CANCELLED, printing to context.out (nothing in
// JSON mode), then returns its record. When the coordinator cannot be reached (UNAVAILABLE,
// DEADLINE_EXCEEDED, or CANCELLED by a server shutting down: a restart) it prints "coordinator unreachable,
// retrying" once to context.err and watches again from the last event seen, with backoff, for up to
// kFollowReconnectWindow; then, and on any other error, returns the error. Blocks.
StatusOr<cohort::v1::JobRecord> follow_job(Client& client, const std::string& job_id,
                                           const CommandContext& context);

}  // namespace cohort::client::cli
