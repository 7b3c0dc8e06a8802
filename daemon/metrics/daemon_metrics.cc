#include "daemon/metrics/daemon_metrics.h"

#include <prometheus/text_serializer.h>

namespace cohort::metrics {
namespace {

// Latency buckets (seconds) for gRPC calls: unary calls take milliseconds; store waits, barriers
// and streams (WatchJob, StreamLogs) run up to their deadlines, so the top buckets reach a minute.
const prometheus::Histogram::BucketBoundaries& rpc_buckets() {
  static const prometheus::Histogram::BucketBoundaries kBuckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
  return kBuckets;
}

constexpr const char* kRendezvousPrefix = "/cohort.v1.Rendezvous/";

// The Rendezvous service's methods that act on the job's key-value store (the rest join, leave
// and synchronise the ranks).
bool is_store_method(const std::string& name) {
  return name == "Set" || name == "Get" || name == "Add" || name == "CompareSet" || name == "Wait" ||
         name == "Check" || name == "Delete" || name == "NumKeys";
}

const char* reason_name(TaskExitReason reason) {
  switch (reason) {
    case TaskExitReason::kSucceeded:
      return "succeeded";
    case TaskExitReason::kFailed:
      return "failed";
    case TaskExitReason::kKilled:
      return "killed";
    case TaskExitReason::kStopped:
      return "stopped";
  }
  return "failed";
}

}  // namespace

TaskExitReason task_exit_reason(int exit_code, int signal, bool stopped) {
  if (stopped) return TaskExitReason::kStopped;
  if (signal != 0) return TaskExitReason::kKilled;
  return exit_code == 0 ? TaskExitReason::kSucceeded : TaskExitReason::kFailed;
}

DaemonMetrics::DaemonMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      rpcs_handled_(prometheus::BuildCounter()
                        .Name("cohort_grpc_server_handled_total")
                        .Help("gRPC calls this daemon completed, by method and status code.")
                        .Register(*registry_)),
      rpc_seconds_(prometheus::BuildHistogram()
                       .Name("cohort_grpc_server_handling_seconds")
                       .Help("Time from a gRPC call's start to its status, by method.")
                       .Register(*registry_)),
      rendezvous_operations_(prometheus::BuildCounter()
                                 .Name("cohort_rendezvous_operations_total")
                                 .Help("Rendezvous (join, barrier, leave) and key-value store operations of "
                                       "job ranks, by operation and status code.")
                                 .Register(*registry_)),
      task_exits_(
          prometheus::BuildCounter()
              .Name("cohort_task_exits_total")
              .Help("Exits of the tasks this node's agent ran, by reason (succeeded, failed: non-zero "
                    "exit code, killed: a signal the agent did not send, stopped: by the agent).")
              .Register(*registry_)),
      node_certificate_expiry_(prometheus::BuildGauge()
                                   .Name("cohort_node_certificate_expiry_timestamp_seconds")
                                   .Help("When this agent's node certificate expires (its notAfter, unix seconds); "
                                         "the agent renews it in the last third of its validity.")
                                   .Register(*registry_)),
      task_containment_(prometheus::BuildGauge()
                            .Name("cohort_agent_task_containment")
                            .Help("1 when this agent runs each task in a cgroup v2 of its own, so that "
                                  "what a task moves out of its process group (setsid, a daemon) dies "
                                  "with it; 0 when it has process groups only (no writable cgroup v2: see "
                                  "its start-up warning).")
                            .Register(*registry_)) {
  // Every reason is on the page from the start, so rate() and alerts see a 0 before the first exit.
  for (TaskExitReason reason : {TaskExitReason::kSucceeded, TaskExitReason::kFailed, TaskExitReason::kKilled,
                                TaskExitReason::kStopped}) {
    task_exit_counters_.push_back(&task_exits_.Add({{"reason", reason_name(reason)}}));
  }
}

void DaemonMetrics::set_node_certificate_expiry(int64_t not_after_unix_seconds) {
  node_certificate_expiry_.Add({}).Set(static_cast<double>(not_after_unix_seconds));
}

void DaemonMetrics::set_task_containment(bool contained) {
  task_containment_.Add({}).Set(contained ? 1.0 : 0.0);
}

void DaemonMetrics::record_rpc(const std::string& method, const std::string& code,
                               std::chrono::duration<double> elapsed) {
  // "/cohort.v1.Coordinator/SubmitJob" -> service "cohort.v1.Coordinator", method "SubmitJob".
  const size_t slash = method.rfind('/');
  const std::string service = slash == std::string::npos || slash == 0 ? "" : method.substr(1, slash - 1);
  const std::string name = slash == std::string::npos ? method : method.substr(slash + 1);
  rpcs_handled_.Add({{"grpc_service", service}, {"grpc_method", name}, {"grpc_code", code}}).Increment();
  rpc_seconds_.Add({{"grpc_service", service}, {"grpc_method", name}}, rpc_buckets())
      .Observe(elapsed.count());
  if (method.rfind(kRendezvousPrefix, 0) == 0) {
    rendezvous_operations_
        .Add({{"kind", is_store_method(name) ? "store" : "rendezvous"}, {"operation", name}, {"code", code}})
        .Increment();
  }
}

void DaemonMetrics::record_task_exit(TaskExitReason reason) {
  task_exit_counters_.at(static_cast<size_t>(reason))->Increment();
}

void DaemonMetrics::add_collectable(std::shared_ptr<prometheus::Collectable> collectable) {
  std::lock_guard<std::mutex> lock(mu_);
  collectables_.push_back(std::move(collectable));
}

std::string DaemonMetrics::text() const {
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  std::vector<std::shared_ptr<prometheus::Collectable>> collectables;
  {
    std::lock_guard<std::mutex> lock(mu_);
    collectables = collectables_;
  }
  for (const auto& collectable : collectables) {
    std::vector<prometheus::MetricFamily> more = collectable->Collect();
    families.insert(families.end(), std::make_move_iterator(more.begin()),
                    std::make_move_iterator(more.end()));
  }
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace cohort::metrics
