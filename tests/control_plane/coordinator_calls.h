#pragma once

// The Coordinator calls the control-plane tests make over real gRPC, each with a deadline so a
// stuck server fails the test instead of hanging it: submit, get, poll for a state, wait for
// nodes to register.

#include <chrono>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"

namespace cohort::daemon::testing {

// Bounds every RPC of these tests.
inline constexpr std::chrono::seconds kRpcTimeout{20};
// How often the polling helpers ask again.
inline constexpr std::chrono::milliseconds kPollInterval{20};

inline void set_deadline(grpc::ClientContext* context, std::chrono::milliseconds timeout = kRpcTimeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

// The new job's id; a failed call is a test failure (and returns "").
inline std::string submit_job(cohort::v1::Coordinator::Stub& stub, const cohort::v1::JobSpec& spec) {
  cohort::v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  cohort::v1::SubmitJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = stub.SubmitJob(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.job_id();
}

inline cohort::v1::JobRecord get_job(cohort::v1::Coordinator::Stub& stub, const std::string& id) {
  cohort::v1::GetJobRequest request;
  request.set_job_id(id);
  cohort::v1::GetJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status status = stub.GetJob(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.job();
}

inline bool is_final_state(cohort::v1::JobState state) {
  return state == cohort::v1::SUCCEEDED || state == cohort::v1::FAILED || state == cohort::v1::CANCELLED;
}

// Polls until the job is in `state`, or in a final state it cannot leave, or `timeout` passes;
// returns the last record (the caller checks its state).
inline cohort::v1::JobRecord wait_for_job_state(cohort::v1::Coordinator::Stub& stub, const std::string& id,
                                                cohort::v1::JobState state,
                                                std::chrono::milliseconds timeout = kRpcTimeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  cohort::v1::JobRecord job = get_job(stub, id);
  while (job.state() != state && !is_final_state(job.state()) && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(kPollInterval);
    job = get_job(stub, id);
  }
  return job;
}

// Polls ListNodes until `count` nodes are live; the last answer, or a test failure after `timeout`.
inline cohort::v1::ListNodesResponse wait_for_nodes(cohort::v1::Coordinator::Stub& stub, int count,
                                                    std::chrono::milliseconds timeout = kRpcTimeout) {
  const auto give_up = std::chrono::steady_clock::now() + timeout;
  cohort::v1::ListNodesResponse response;
  while (std::chrono::steady_clock::now() < give_up) {
    response.Clear();
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub.ListNodes(&context, {}, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    if (status.ok() && response.nodes_size() == count) return response;
    std::this_thread::sleep_for(kPollInterval);
  }
  ADD_FAILURE() << count << " node(s) did not register within " << timeout.count() << " ms";
  return response;
}

}  // namespace cohort::daemon::testing
