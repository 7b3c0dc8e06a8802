#include "daemon/coordinator/job_state_machine.h"

#include <set>
#include <utility>

#include <gtest/gtest.h>

#include "cohort/v1/job.pb.h"

namespace cohort::coordinator {
namespace {

constexpr JobState kAll[] = {JobState::kPending,   JobState::kPlaced, JobState::kRunning,
                             JobState::kSucceeded, JobState::kFailed, JobState::kCancelled};

TEST(JobStateMachineTest, ANewJobIsPendingOnItsFirstAttempt) {
  JobStateMachine machine(2);
  EXPECT_EQ(machine.state(), JobState::kPending);
  EXPECT_EQ(machine.attempt(), 1);
  EXPECT_EQ(machine.reason(), "submitted");
  EXPECT_EQ(machine.restarts_left(), 2);
}

TEST(JobStateMachineTest, TheHappyPathRecordsEachReason) {
  JobStateMachine machine;
  auto placed = machine.transition(JobState::kPlaced, "placed on node-a");
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ(placed->from, JobState::kPending);
  EXPECT_EQ(placed->to, JobState::kPlaced);
  EXPECT_EQ(placed->attempt, 1);
  ASSERT_TRUE(machine.transition(JobState::kRunning, "all ranks started").ok());
  ASSERT_TRUE(machine.transition(JobState::kSucceeded, "all ranks exited 0").ok());
  EXPECT_EQ(machine.state(), JobState::kSucceeded);
  EXPECT_EQ(machine.reason(), "all ranks exited 0");
}

TEST(JobStateMachineTest, OnlyTheLifeCycleMovesAreLegal) {
  const std::set<std::pair<JobState, JobState>> legal = {
      {JobState::kPending, JobState::kPlaced},   {JobState::kPending, JobState::kCancelled},
      {JobState::kPlaced, JobState::kRunning},   {JobState::kPlaced, JobState::kFailed},
      {JobState::kPlaced, JobState::kCancelled}, {JobState::kRunning, JobState::kSucceeded},
      {JobState::kRunning, JobState::kFailed},   {JobState::kRunning, JobState::kCancelled},
  };
  for (JobState from : kAll) {
    for (JobState to : kAll) {
      EXPECT_EQ(is_legal_transition(from, to), legal.count({from, to}) == 1)
          << job_state_name(from) << " -> " << job_state_name(to);
    }
  }
}

TEST(JobStateMachineTest, AnIllegalTransitionIsAFailedPreconditionNamingBothStates) {
  auto machine = JobStateMachine::restore(JobState::kSucceeded, 1, "done", 0);
  ASSERT_TRUE(machine.ok());
  auto change = machine->transition(JobState::kRunning, "again");
  ASSERT_FALSE(change.ok());
  EXPECT_EQ(change.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(change.status().message().find("from SUCCEEDED to RUNNING"), std::string::npos)
      << change.status().message();
  EXPECT_EQ(machine->state(), JobState::kSucceeded);
  EXPECT_EQ(machine->reason(), "done");

  JobStateMachine pending;
  change = pending.transition(JobState::kRunning, "skipping placement");
  ASSERT_FALSE(change.ok());
  EXPECT_NE(change.status().message().find("from PENDING to RUNNING"), std::string::npos);
}

TEST(JobStateMachineTest, PendingIsReachableOnlyThroughARestart) {
  auto machine = JobStateMachine::restore(JobState::kRunning, 1, "running", 3);
  ASSERT_TRUE(machine.ok());
  auto change = machine->transition(JobState::kPending, "requeue");
  ASSERT_FALSE(change.ok());
  EXPECT_NE(change.status().message().find("restarts left"), std::string::npos) << change.status().message();
}

TEST(JobStateMachineTest, AFailedAttemptWithRestartsLeftReturnsToPendingWithTheNextAttempt) {
  JobStateMachine machine(2);
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(machine.transition(JobState::kPlaced, "placed").ok());
    ASSERT_TRUE(machine.transition(JobState::kRunning, "started").ok());
    auto change = machine.fail_attempt("rank 1 on node node-a exited with code 1");
    ASSERT_TRUE(change.ok());
    EXPECT_EQ(change->from, JobState::kRunning);
    EXPECT_EQ(change->to, JobState::kPending);
    EXPECT_EQ(change->attempt, attempt + 1);
    EXPECT_EQ(machine.attempt(), attempt + 1);
    EXPECT_NE(machine.reason().find(fmt::format("attempt {} failed: rank 1", attempt)), std::string::npos)
        << machine.reason();
    EXPECT_NE(machine.reason().find(fmt::format("restart {} of 2", attempt)), std::string::npos)
        << machine.reason();
  }
  // The third attempt fails from PLACED with no restarts left: FAILED for good.
  ASSERT_TRUE(machine.transition(JobState::kPlaced, "placed").ok());
  auto change = machine.fail_attempt("node node-b lost");
  ASSERT_TRUE(change.ok());
  EXPECT_EQ(change->to, JobState::kFailed);
  EXPECT_EQ(machine.state(), JobState::kFailed);
  EXPECT_EQ(machine.attempt(), 3);
  EXPECT_NE(machine.reason().find("node node-b lost (attempt 3; all 2 restart(s) used)"), std::string::npos)
      << machine.reason();
}

TEST(JobStateMachineTest, WithoutRestartsAFailureIsFinalAndKeepsItsReason) {
  JobStateMachine machine;
  ASSERT_TRUE(machine.transition(JobState::kPlaced, "placed").ok());
  ASSERT_TRUE(machine.fail_attempt("rank 0 on node node-a exited with code 2").ok());
  EXPECT_EQ(machine.state(), JobState::kFailed);
  EXPECT_EQ(machine.reason(), "rank 0 on node node-a exited with code 2");
}

TEST(JobStateMachineTest, OnlyAStartedAttemptCanFail) {
  JobStateMachine machine(1);
  auto change = machine.fail_attempt("boom");
  ASSERT_FALSE(change.ok());
  EXPECT_EQ(change.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(change.status().message().find("from PENDING to FAILED"), std::string::npos);
  EXPECT_EQ(machine.attempt(), 1);
}

TEST(JobStateMachineTest, StateNamesRoundTripAndUnknownNamesAreRejected) {
  for (JobState state : kAll) {
    auto parsed = parse_job_state(job_state_name(state));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, state);
  }
  EXPECT_EQ(parse_job_state("running").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(is_terminal(JobState::kCancelled));
  EXPECT_FALSE(is_terminal(JobState::kRunning));
}

// The gRPC adapter maps states by name, and the job store writes the names: they must stay the
// wire enum's.
TEST(JobStateMachineTest, StateNamesAreTheWireEnumsNames) {
  for (JobState state : kAll) {
    cohort::v1::JobState wire = cohort::v1::JOB_STATE_UNSPECIFIED;
    ASSERT_TRUE(cohort::v1::JobState_Parse(std::string(job_state_name(state)), &wire))
        << job_state_name(state);
    EXPECT_NE(wire, cohort::v1::JOB_STATE_UNSPECIFIED);
  }
}

TEST(JobStateMachineTest, RestoreRejectsImpossibleRecords) {
  EXPECT_EQ(JobStateMachine::restore(JobState::kPending, 0, "", 0).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(JobStateMachine::restore(JobState::kPending, 1, "", -1).status().code(),
            StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::coordinator
