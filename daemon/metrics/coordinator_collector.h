#pragma once

// CoordinatorCollector: the coordinator's state as Prometheus gauges, computed at each scrape from
// Coordinator::list_jobs() and list_nodes() (so nothing in the coordinator keeps counters):
//
//   cohort_jobs{state}                         jobs in each state (pending ... cancelled)
//   cohort_job_queue_length                    PENDING jobs
//   cohort_job_queue_head_wait_seconds         how long the oldest PENDING job has waited (0: none)
//   cohort_nodes{state}                        registered nodes (ready | draining)
//   cohort_slots, cohort_free_slots            worker slots in the cluster, and those free
//   cohort_node_free_slots{node}               free slots per node
//   cohort_job_step{job}, cohort_job_epoch{job}, cohort_job_loss{job}, cohort_job_accuracy{job},
//   cohort_job_samples_per_second{job}         the last report of each RUNNING job
//   cohort_job_comm_wait_seconds_total{job}    (a counter) and cohort_job_comm_wait_ratio{job}: the
//                                              reporting rank's time blocked in collectives
//
// Thread-safe; Collect() takes the coordinator's lock twice (a copy of the jobs and nodes).

#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "daemon/coordinator/clock.h"
#include "daemon/coordinator/coordinator.h"

namespace cohort::metrics {

class CoordinatorCollector final : public prometheus::Collectable {
 public:
  // Neither is owned; both must outlive the collector's last Collect().
  CoordinatorCollector(const coordinator::Coordinator* coordinator, const coordinator::Clock* clock)
      : coordinator_(coordinator), clock_(clock) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const coordinator::Coordinator* const coordinator_;
  const coordinator::Clock* const clock_;
};

}  // namespace cohort::metrics
