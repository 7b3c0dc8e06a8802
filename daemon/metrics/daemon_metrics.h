#pragma once

// DaemonMetrics: what cohortd's /metrics page shows, in the Prometheus text format, with
// prometheus-cpp (Debian's prometheus-cpp-dev) for the registry and the serializer. Names follow
// Prometheus' conventions (cohort_ prefix, base units, _total for counters):
//
//   cohort_grpc_server_handled_total{grpc_service,grpc_method,grpc_code}   counter
//   cohort_grpc_server_handling_seconds{grpc_service,grpc_method}          histogram
//   cohort_rendezvous_operations_total{kind,operation,code}   counter (kind: rendezvous | store)
//   cohort_task_exits_total{reason}   counter, this node's tasks (reason: succeeded | failed |
//                                     killed | stopped)
//   cohort_node_certificate_expiry_timestamp_seconds   gauge, an agent's node certificate's
//                                     notAfter (unix seconds), for an alert well before it
//   cohort_agent_task_containment   gauge, 1 when the agent runs each task in a cgroup v2 of its
//                                     own (daemon/agent/task_cgroups.h), 0 with process groups only
// and, on a coordinator, the gauges CoordinatorCollector computes at each scrape (jobs by state,
// the queue, nodes and slots, running jobs' training metrics).
//
// The RPC counters are fed by RpcMetricsInterceptor (a gRPC server interceptor, so no handler
// changes); calls the Authenticator refuses before any handler runs are not counted.
//
// Thread-safe: every method may be called from any thread.

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

namespace cohort::metrics {

// The content type of the Prometheus text exposition format, version 0.0.4.
inline constexpr const char* kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

// How a task ended, for cohort_task_exits_total.
enum class TaskExitReason {
  kSucceeded,  // exit code 0
  kFailed,     // a non-zero exit code
  kKilled,     // a signal the agent did not send
  kStopped,    // stopped by the agent (cancel, restart, drain)
};
TaskExitReason task_exit_reason(int exit_code, int signal, bool stopped);

class DaemonMetrics {
 public:
  DaemonMetrics();

  // One gRPC call ended: `method` is the full name ("/cohort.v1.Coordinator/SubmitJob"), `code`
  // the status code's name ("OK", "NOT_FOUND").
  void record_rpc(const std::string& method, const std::string& code, std::chrono::duration<double> elapsed);
  void record_task_exit(TaskExitReason reason);
  // The notAfter (unix seconds) of the node certificate the agent serves and calls with; the
  // gauge appears on the page once set.
  void set_node_certificate_expiry(int64_t not_after_unix_seconds);
  // Whether the agent contains its tasks in cgroups; the gauge appears on the page once set.
  void set_task_containment(bool contained);
  // Adds metrics computed at each scrape (a coordinator's state). Shared: kept until destruction.
  void add_collectable(std::shared_ptr<prometheus::Collectable> collectable);

  // The whole page, in the Prometheus text format. Runs every collectable; blocks on their locks.
  std::string text() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& rpcs_handled_;
  prometheus::Family<prometheus::Histogram>& rpc_seconds_;
  prometheus::Family<prometheus::Counter>& rendezvous_operations_;
  prometheus::Family<prometheus::Counter>& task_exits_;
  std::vector<prometheus::Counter*> task_exit_counters_;  // by TaskExitReason
  prometheus::Family<prometheus::Gauge>& node_certificate_expiry_;
  prometheus::Family<prometheus::Gauge>& task_containment_;
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables_;  // guarded by mu_
};

}  // namespace cohort::metrics
