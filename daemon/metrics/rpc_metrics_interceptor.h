#pragma once

// RpcMetricsInterceptor: counts every gRPC call a cohortd server answers, by method and status
// code, and times it, into DaemonMetrics. A server interceptor sees each call's method when the
// call starts and its status just before it is sent, so no handler changes.
//
//   builder.experimental().SetInterceptorCreators(rpc_metrics_interceptors(&metrics));

#include <memory>
#include <vector>

#include <grpcpp/support/server_interceptor.h>

#include "daemon/metrics/daemon_metrics.h"

namespace cohort::metrics {

// The interceptor factories to give grpc::ServerBuilder; `metrics` must outlive the server.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> rpc_metrics_interceptors(
    DaemonMetrics* metrics);

// "OK", "NOT_FOUND", ...: a status code's name as Prometheus labels show it.
const char* grpc_code_name(grpc::StatusCode code);

}  // namespace cohort::metrics
