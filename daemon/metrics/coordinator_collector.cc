#include "daemon/metrics/coordinator_collector.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <string>

namespace cohort::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr coordinator::JobState kAllStates[] = {
    coordinator::JobState::kPending,   coordinator::JobState::kPlaced, coordinator::JobState::kRunning,
    coordinator::JobState::kSucceeded, coordinator::JobState::kFailed, coordinator::JobState::kCancelled,
};

std::string lower_case(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

MetricFamily gauge_family(const char* name, const char* help) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = MetricType::Gauge;
  return family;
}

void add_gauge(MetricFamily& family, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.gauge.value = value;
  family.metric.push_back(std::move(metric));
}

}  // namespace

std::vector<MetricFamily> CoordinatorCollector::Collect() const {
  const std::vector<coordinator::Job> jobs = coordinator_->list_jobs();
  const std::vector<coordinator::NodeStatus> nodes = coordinator_->list_nodes();
  const int64_t now_ms = clock_->unix_millis();

  std::map<coordinator::JobState, int> by_state;
  int queued = 0;
  int64_t oldest_submit_ms = 0;
  MetricFamily step = gauge_family("cohort_job_step", "Optimizer steps a running job reported, by job.");
  MetricFamily epoch =
      gauge_family("cohort_job_epoch", "Current epoch (0-based) a running job reported, by job.");
  MetricFamily loss = gauge_family("cohort_job_loss", "Latest training loss a running job reported, by job.");
  MetricFamily accuracy = gauge_family("cohort_job_accuracy",
                                       "Latest evaluation accuracy (0..1) a running job reported, by job.");
  MetricFamily throughput = gauge_family(
      "cohort_job_samples_per_second", "Training throughput over all ranks a running job reported, by job.");
  // The reporting rank's time blocked in collectives: cumulative (a counter, reset by a restart,
  // which rate() handles) and its share of the last report interval.
  MetricFamily comm_wait = gauge_family(
      "cohort_job_comm_wait_seconds_total",
      "Seconds the reporting rank of a running job spent blocked in collectives this attempt, by job.");
  comm_wait.type = MetricType::Counter;
  MetricFamily comm_wait_ratio =
      gauge_family("cohort_job_comm_wait_ratio",
                   "Share (0..1) of wall time the reporting rank of a running job spent blocked in collectives "
                   "since its previous report, by job.");
  for (const coordinator::Job& job : jobs) {
    ++by_state[job.state()];
    if (job.state() == coordinator::JobState::kPending) {
      ++queued;
      if (oldest_submit_ms == 0 || job.submit_unix_ms < oldest_submit_ms)
        oldest_submit_ms = job.submit_unix_ms;
    }
    if (job.state() == coordinator::JobState::kRunning && job.last_metrics) {
      const coordinator::Metrics& m = *job.last_metrics;
      const std::vector<ClientMetric::Label> labels = {{"job", job.id}};
      add_gauge(step, static_cast<double>(m.step), labels);
      add_gauge(epoch, m.epoch, labels);
      add_gauge(loss, m.loss, labels);
      add_gauge(accuracy, m.accuracy, labels);
      add_gauge(throughput, m.samples_per_s, labels);
      ClientMetric waited;
      waited.label = labels;
      waited.counter.value = m.comm_wait_s;
      comm_wait.metric.push_back(std::move(waited));
      add_gauge(comm_wait_ratio, m.comm_wait_ratio, labels);
    }
  }

  std::vector<MetricFamily> families;
  MetricFamily states = gauge_family("cohort_jobs", "Jobs the coordinator knows, by state.");
  for (coordinator::JobState state : kAllStates) {
    add_gauge(states, by_state[state], {{"state", lower_case(coordinator::job_state_name(state))}});
  }
  families.push_back(std::move(states));
  MetricFamily queue = gauge_family("cohort_job_queue_length", "Jobs waiting to be placed (PENDING).");
  add_gauge(queue, queued);
  families.push_back(std::move(queue));
  MetricFamily head_wait =
      gauge_family("cohort_job_queue_head_wait_seconds",
                   "How long the oldest PENDING job has waited since its submission (0: none).");
  add_gauge(head_wait, queued == 0 ? 0.0 : std::max<int64_t>(0, now_ms - oldest_submit_ms) / 1000.0);
  families.push_back(std::move(head_wait));

  int ready = 0;
  int draining = 0;
  int suspect = 0;
  int restored = 0;
  int slots = 0;
  int free_slots = 0;
  MetricFamily node_free = gauge_family("cohort_node_free_slots", "Free worker slots per node.");
  for (const coordinator::NodeStatus& node : nodes) {
    ++(!node.suspect_reason.empty() ? suspect
       : node.unschedulable         ? draining
       : node.awaiting_registration ? restored
                                    : ready);
    slots += node.info.slots;
    free_slots += node.free_slots;
    add_gauge(node_free, node.free_slots, {{"node", node.info.node_id}});
  }
  MetricFamily node_count =
      gauge_family("cohort_nodes", "Registered nodes, by state (ready, draining, suspect: its agent did not "
                                   "answer a launch, restored: known from etcd, not registered since a "
                                   "takeover).");
  add_gauge(node_count, ready, {{"state", "ready"}});
  add_gauge(node_count, draining, {{"state", "draining"}});
  add_gauge(node_count, suspect, {{"state", "suspect"}});
  add_gauge(node_count, restored, {{"state", "restored"}});
  families.push_back(std::move(node_count));
  MetricFamily slot_count = gauge_family("cohort_slots", "Worker slots of all registered nodes.");
  add_gauge(slot_count, slots);
  families.push_back(std::move(slot_count));
  MetricFamily free_count = gauge_family("cohort_free_slots", "Free worker slots of all registered nodes.");
  add_gauge(free_count, free_slots);
  families.push_back(std::move(free_count));
  families.push_back(std::move(node_free));

  for (MetricFamily* family : {&step, &epoch, &loss, &accuracy, &throughput, &comm_wait, &comm_wait_ratio})
    families.push_back(std::move(*family));
  return families;
}

}  // namespace cohort::metrics
