#pragma once

// Conversions between the coordinator's plain C++ records and their cohort.v1 wire messages, kept
// in one place so every service (and the tests) agree on them.

#include "cohort/v1/coordinator.pb.h"
#include "cohort/v1/job.pb.h"
#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/job.h"
#include "daemon/coordinator/node_registry.h"

namespace cohort::daemon {

cohort::v1::JobState to_proto(coordinator::JobState state);
// UNSPECIFIED (and unknown numbers) → INVALID_ARGUMENT naming the value.
StatusOr<coordinator::JobState> from_proto(cohort::v1::JobState state);

coordinator::NodeInfo from_proto(const cohort::v1::NodeInfo& node);
void to_proto(const coordinator::NodeInfo& node, cohort::v1::NodeInfo* out);
// `now` (the coordinator clock's) turns the lease expiry into the time remaining.
void to_proto(const coordinator::NodeStatus& status, coordinator::TimePoint now, cohort::v1::NodeStatus* out);

coordinator::Metrics from_proto(const cohort::v1::Metrics& metrics);
void to_proto(const coordinator::Metrics& metrics, cohort::v1::Metrics* out);

void to_proto(const coordinator::Placement& placement, cohort::v1::Placement* out);
void to_proto(const coordinator::Job& job, cohort::v1::JobRecord* out);
void to_proto(const coordinator::JobEvent& event, cohort::v1::JobEvent* out);

}  // namespace cohort::daemon
