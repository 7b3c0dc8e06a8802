#pragma once

// Test helper: a Coordinator service that records ReportMetrics calls, served on 127.0.0.1 at a
// free port in plaintext (the reporter talks plaintext when COHORT_CA_CERTIFICATE is unset; the
// secret over TLS is covered end to end by tests/control_plane/command_job_e2e_test). For
// metrics_reporter_test and report_metrics_test.

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cohort/v1/coordinator.grpc.pb.h"

namespace cohort::train::testing {

class RecordingCoordinator final : public v1::Coordinator::Service {
 public:
  grpc::Status ReportMetrics(grpc::ServerContext*, const v1::ReportMetricsRequest* request,
                             v1::ReportMetricsResponse*) override {
    std::lock_guard<std::mutex> lock(mutex);
    requests.push_back(*request);
    return grpc::Status::OK;
  }
  // The recorded requests so far (a copy). Thread-safe.
  std::vector<v1::ReportMetricsRequest> recorded() {
    std::lock_guard<std::mutex> lock(mutex);
    return requests;
  }
  std::mutex mutex;
  std::vector<v1::ReportMetricsRequest> requests;
};

// A RecordingCoordinator served on 127.0.0.1 at a free port (port stays 0 when the server failed).
struct RecordingServer {
  RecordingServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
  }
  ~RecordingServer() {
    if (server) server->Shutdown();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port); }
  RecordingCoordinator service;
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

}  // namespace cohort::train::testing
