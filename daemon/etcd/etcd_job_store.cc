#include "daemon/etcd/etcd_job_store.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "daemon/etcd/etcd_rendezvous_journal.h"
#include "daemon/etcd/job_records.pb.h"

namespace cohort::etcd {
namespace {

using coordinator::Job;
using coordinator::JobEvent;
using coordinator::JobState;
using coordinator::JobStateMachine;
using coordinator::Metrics;
using coordinator::MetricsRecord;
using coordinator::NodeAssignment;

std::string seq_key(int64_t seq) { return fmt::format("{:020d}", seq); }

etcdstore::StoredMetrics to_stored(const Metrics& m) {
  etcdstore::StoredMetrics out;
  out.set_step(m.step);
  out.set_epoch(m.epoch);
  out.set_loss(m.loss);
  out.set_accuracy(m.accuracy);
  out.set_samples_per_s(m.samples_per_s);
  out.set_rank(m.rank);
  out.set_total_steps(m.total_steps);
  out.set_total_epochs(m.total_epochs);
  out.set_samples_per_step(m.samples_per_step);
  out.set_comm_wait_s(m.comm_wait_s);
  out.set_comm_wait_ratio(m.comm_wait_ratio);
  return out;
}

Metrics from_stored(const etcdstore::StoredMetrics& m) {
  Metrics out;
  out.step = m.step();
  out.epoch = m.epoch();
  out.loss = m.loss();
  out.accuracy = m.accuracy();
  out.samples_per_s = m.samples_per_s();
  out.rank = m.rank();
  out.total_steps = m.total_steps();
  out.total_epochs = m.total_epochs();
  out.samples_per_step = m.samples_per_step();
  out.comm_wait_s = m.comm_wait_s();
  out.comm_wait_ratio = m.comm_wait_ratio();
  return out;
}

etcdserverpb::RequestOp put_op(const std::string& key, const std::string& value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(value);
  return op;
}

etcdserverpb::RequestOp delete_op(const std::string& key, const std::string& range_end = "") {
  etcdserverpb::RequestOp op;
  op.mutable_request_delete_range()->set_key(key);
  op.mutable_request_delete_range()->set_range_end(range_end);
  return op;
}

StatusOr<int64_t> parse_counter(const std::string& key, const std::string& text) {
  int64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return data_loss_error("etcd key {}: '{}' is not a number", key, text);
  }
  return value;
}

StatusOr<Job> decode_job(const KeyValue& kv) {
  etcdstore::StoredJob stored;
  if (!stored.ParseFromString(kv.value))
    return data_loss_error("etcd key {}: not a StoredJob record", kv.key);
  Job job;
  job.id = stored.id();
  job.owner = stored.owner();
  job.seq = stored.seq();
  job.spec = stored.spec();
  auto state = coordinator::parse_job_state(stored.state());
  if (!state.ok()) return data_loss_error("etcd key {}: {}", kv.key, state.status().message());
  auto machine = JobStateMachine::restore(*state, stored.attempt(), stored.reason(),
                                          job.spec.restart_policy().max_restarts());
  if (!machine.ok()) return data_loss_error("etcd key {}: {}", kv.key, machine.status().message());
  job.machine = *machine;
  job.submit_unix_ms = stored.submit_unix_ms();
  job.start_unix_ms = stored.start_unix_ms();
  job.end_unix_ms = stored.end_unix_ms();
  if (stored.has_last_metrics()) job.last_metrics = from_stored(stored.last_metrics());
  for (const auto& node : stored.placement()) {
    NodeAssignment assignment;
    assignment.node_id = node.node_id();
    assignment.address = node.address();
    assignment.node_rank = node.node_rank();
    assignment.first_rank = node.first_rank();
    assignment.num_ranks = node.num_ranks();
    assignment.gpus.assign(node.gpus().begin(), node.gpus().end());
    job.placement.nodes.push_back(std::move(assignment));
  }
  return job;
}

StatusOr<JobEvent> decode_event(const KeyValue& kv) {
  etcdstore::StoredEvent stored;
  if (!stored.ParseFromString(kv.value))
    return data_loss_error("etcd key {}: not a StoredEvent record", kv.key);
  JobEvent event;
  event.seq = stored.seq();
  event.job_id = stored.job_id();
  event.unix_ms = stored.unix_ms();
  event.kind = JobEvent::Kind::kStateChange;
  auto from = coordinator::parse_job_state(stored.from_state());
  auto to = coordinator::parse_job_state(stored.to_state());
  if (!from.ok() || !to.ok()) {
    return data_loss_error("etcd key {}: {}", kv.key, (from.ok() ? to.status() : from.status()).message());
  }
  event.change = coordinator::JobTransition{*from, *to, stored.attempt(), stored.reason()};
  return event;
}

StatusOr<coordinator::NodeInfo> decode_node(const KeyValue& kv) {
  etcdstore::StoredNode stored;
  if (!stored.ParseFromString(kv.value))
    return data_loss_error("etcd key {}: not a StoredNode record", kv.key);
  coordinator::NodeInfo node;
  node.node_id = stored.node_id();
  node.address = stored.address();
  node.hostname = stored.hostname();
  node.cores = stored.cores();
  node.memory_bytes = stored.memory_bytes();
  for (const etcdstore::StoredGpu& gpu : stored.gpus())
    node.gpus.push_back(coordinator::GpuInfo{gpu.index(), gpu.model(), gpu.memory_bytes()});
  node.slots = stored.slots();
  return node;
}

}  // namespace

EtcdJobStore::EtcdJobStore(EtcdClient* client, std::string prefix)
    : client_(client), prefix_(std::move(prefix)), description_([&] {
        std::string endpoints;
        for (const std::string& endpoint : client->options().endpoints) {
          endpoints += (endpoints.empty() ? "" : ",") + endpoint;
        }
        return "etcd://" + endpoints + prefix_;
      }()) {}

StatusOr<std::unique_ptr<EtcdJobStore>> EtcdJobStore::open(EtcdClient* client, std::string prefix) {
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  if (prefix.empty()) {
    return invalid_argument_error("etcd job store: the key prefix is empty; use e.g. '{}'",
                                  kDefaultStorePrefix);
  }
  return std::unique_ptr<EtcdJobStore>(new EtcdJobStore(client, std::move(prefix)));
}

std::string EtcdJobStore::job_key(const std::string& job_id) const { return prefix_ + "/jobs/" + job_id; }

std::string EtcdJobStore::event_key(const std::string& job_id, int64_t seq) const {
  return prefix_ + "/events/" + job_id + "/" + seq_key(seq);
}

std::string EtcdJobStore::metrics_prefix(const std::string& job_id) const {
  return prefix_ + "/metrics/" + job_id + "/";
}

std::string EtcdJobStore::node_key(const std::string& node_id) const { return prefix_ + "/nodes/" + node_id; }

std::string EtcdJobStore::rendezvous_prefix(const std::string& job_id) const {
  return prefix_ + "/rendezvous/" + job_id + "/";
}

std::string EtcdJobStore::rendezvous_prefix(const std::string& job_id, int attempt) const {
  return rendezvous_prefix(job_id) + fmt::format("{:010d}/", attempt);
}

std::shared_ptr<coordinator::RendezvousJournal> EtcdJobStore::rendezvous_journal(const std::string& job_id,
                                                                                 int attempt) {
  return std::make_shared<EtcdRendezvousJournal>(client_, rendezvous_prefix(job_id, attempt), fence_,
                                                 fmt::format("job {} attempt {}", job_id, attempt));
}

Status EtcdJobStore::open_rendezvous_journal(const std::string& job_id, int attempt) {
  // Only if not open yet: an open journal's progress record holds the rendezvous's progress.
  const std::string prefix = rendezvous_prefix(job_id, attempt);
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_key(EtcdRendezvousJournal::progress_key(prefix));
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_create_revision(0);
  *request.add_success() = EtcdRendezvousJournal::open_op(prefix);
  request.add_failure()->mutable_request_range()->set_key(EtcdRendezvousJournal::progress_key(prefix));
  COHORT_ASSIGN_OR_RETURN(TxnResult result, client_->fenced_txn(std::move(request), fence_));
  if (result.succeeded) return ok_status();
  if (result.response.responses_size() > 0 && result.response.responses(0).response_range().kvs_size() > 0)
    return ok_status();  // open already
  return EtcdClient::lost_leadership_error(
      fmt::format("opening the rendezvous journal of job {} attempt {}", job_id, attempt), fence_);
}

StatusOr<coordinator::RendezvousState> EtcdJobStore::load_rendezvous(const std::string& job_id,
                                                                     int attempt) const {
  const std::string prefix = rendezvous_prefix(job_id, attempt);
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs, range_all(prefix));
  return EtcdRendezvousJournal::decode(prefix, kvs);
}

Status EtcdJobStore::write(etcdserverpb::TxnRequest request, const std::string& what,
                           const std::string& must_exist) {
  if (!must_exist.empty()) EtcdClient::require_key(request, must_exist);
  COHORT_ASSIGN_OR_RETURN(TxnResult result, client_->fenced_txn(std::move(request), fence_));
  if (result.succeeded) return ok_status();
  if (!must_exist.empty() && EtcdClient::key_was_missing(result)) {
    return not_found_error("{} refused: {} is not stored", what, must_exist);
  }
  return EtcdClient::lost_leadership_error(what, fence_);
}

StatusOr<etcdserverpb::RequestOp> EtcdJobStore::job_put(const Job& job) const {
  etcdstore::StoredJob stored;
  stored.set_id(job.id);
  stored.set_owner(job.owner);
  stored.set_seq(job.seq);
  *stored.mutable_spec() = job.spec;
  stored.set_state(std::string(coordinator::job_state_name(job.state())));
  stored.set_reason(job.machine.reason());
  stored.set_attempt(job.attempt());
  stored.set_submit_unix_ms(job.submit_unix_ms);
  stored.set_start_unix_ms(job.start_unix_ms);
  stored.set_end_unix_ms(job.end_unix_ms);
  if (job.last_metrics) *stored.mutable_last_metrics() = to_stored(*job.last_metrics);
  for (const NodeAssignment& node : job.placement.nodes) {
    etcdstore::StoredNodeAssignment* out = stored.add_placement();
    out->set_node_id(node.node_id);
    out->set_address(node.address);
    out->set_node_rank(node.node_rank);
    out->set_first_rank(node.first_rank);
    out->set_num_ranks(node.num_ranks);
    for (int gpu : node.gpus) out->add_gpus(gpu);
  }
  std::string bytes;
  if (!stored.SerializeToString(&bytes))
    return internal_error("job '{}': cannot serialize its record", job.id);
  return put_op(job_key(job.id), bytes);
}

StatusOr<etcdserverpb::RequestOp> EtcdJobStore::event_put(const JobEvent& event) const {
  if (event.kind != JobEvent::Kind::kStateChange) {
    return invalid_argument_error("event {} of job '{}' is a metrics event; only state changes are stored",
                                  event.seq, event.job_id);
  }
  etcdstore::StoredEvent stored;
  stored.set_seq(event.seq);
  stored.set_job_id(event.job_id);
  stored.set_unix_ms(event.unix_ms);
  stored.set_from_state(std::string(coordinator::job_state_name(event.change.from)));
  stored.set_to_state(std::string(coordinator::job_state_name(event.change.to)));
  stored.set_attempt(event.change.attempt);
  stored.set_reason(event.change.reason);
  std::string bytes;
  if (!stored.SerializeToString(&bytes)) return internal_error("event {}: cannot serialize it", event.seq);
  return put_op(event_key(event.job_id, event.seq), bytes);
}

Status EtcdJobStore::upsert_job(const Job& job) {
  etcdserverpb::TxnRequest request;
  COHORT_ASSIGN_OR_RETURN(*request.add_success(), job_put(job));
  return write(std::move(request), "writing job " + job.id);
}

Status EtcdJobStore::append_event(const JobEvent& event) {
  etcdserverpb::TxnRequest request;
  COHORT_ASSIGN_OR_RETURN(*request.add_success(), event_put(event));
  return write(std::move(request), fmt::format("writing event {} of job {}", event.seq, event.job_id));
}

Status EtcdJobStore::save(const Job& job, const JobEvent& event) {
  etcdserverpb::TxnRequest request;
  COHORT_ASSIGN_OR_RETURN(*request.add_success(), job_put(job));
  COHORT_ASSIGN_OR_RETURN(*request.add_success(), event_put(event));
  // The change that ends an attempt (it failed, succeeded or was cancelled) takes its rendezvous
  // journal with it, in the same transaction: no request of its own. The whole job's prefix goes,
  // so a journal left by a leader that died mid-write goes too.
  auto active = [](JobState state) { return state == JobState::kPlaced || state == JobState::kRunning; };
  if (active(event.change.from) && !active(event.change.to)) {
    const std::string rendezvous = rendezvous_prefix(job.id);
    *request.add_success() = delete_op(rendezvous, EtcdClient::prefix_end(rendezvous));
  } else if (!active(event.change.from) && active(event.change.to)) {
    // The placement opens the attempt's journal: its writes are accepted from now until the save
    // above deletes it (etcd_rendezvous_journal.h), so a late one cannot outlive the attempt.
    *request.add_success() = EtcdRendezvousJournal::open_op(rendezvous_prefix(job.id, job.attempt()));
  }
  return write(std::move(request), fmt::format("writing job {} with event {}", job.id, event.seq));
}

Status EtcdJobStore::append_metrics(const std::string& job_id, const MetricsRecord& record,
                                    int64_t max_rows) {
  if (max_metrics_seq_ < 0) {
    COHORT_ASSIGN_OR_RETURN(max_metrics_seq_, read_counter(prefix_ + "/meta/max_metrics_seq"));
  }
  auto rows = metrics_rows_.find(job_id);
  if (rows == metrics_rows_.end()) {
    // Once per job per coordinator: how many reports it has (limit 1 still returns the count).
    COHORT_ASSIGN_OR_RETURN(RangeResult counted, client_->range_prefix(metrics_prefix(job_id), 1));
    rows = metrics_rows_.emplace(job_id, counted.count).first;
  }
  etcdstore::StoredMetricsRecord stored;
  stored.set_seq(record.seq);
  stored.set_attempt(record.attempt);
  stored.set_unix_ms(record.unix_ms);
  *stored.mutable_metrics() = to_stored(record.metrics);
  std::string bytes;
  if (!stored.SerializeToString(&bytes))
    return internal_error("metrics {}: cannot serialize them", record.seq);
  etcdserverpb::TxnRequest request;
  *request.add_success() = put_op(metrics_prefix(job_id) + seq_key(record.seq), bytes);
  const int64_t new_max = std::max(max_metrics_seq_, record.seq);
  if (new_max != max_metrics_seq_)
    *request.add_success() = put_op(prefix_ + "/meta/max_metrics_seq", std::to_string(new_max));
  // One request: the job must be stored (as the SQLite store's foreign key demands), behind the fence.
  COHORT_RETURN_IF_ERROR(write(
      std::move(request), fmt::format("writing metrics {} of job {}", record.seq, job_id), job_key(job_id)));
  max_metrics_seq_ = new_max;
  ++rows->second;
  if (rows->second > max_rows) return thin_metrics(job_id);
  return ok_status();
}

Status EtcdJobStore::thin_metrics(const std::string& job_id) {
  // JobStore::kMaxMetricsPerJob: drop every second report by seq, keeping the first and the newest.
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> all, range_all(metrics_prefix(job_id)));
  std::vector<std::string> doomed;
  for (size_t i = 1; i + 1 < all.size(); i += 2) doomed.push_back(all[i].key);
  for (size_t start = 0; start < doomed.size(); start += kMaxOpsPerTxn) {
    etcdserverpb::TxnRequest request;
    for (size_t i = start; i < std::min(doomed.size(), start + kMaxOpsPerTxn); ++i) {
      *request.add_success() = delete_op(doomed[i]);
    }
    COHORT_RETURN_IF_ERROR(write(std::move(request), "thinning the metrics history of job " + job_id));
  }
  metrics_rows_[job_id] = static_cast<int64_t>(all.size() - doomed.size());
  return ok_status();
}

StatusOr<std::vector<MetricsRecord>> EtcdJobStore::load_metrics(const std::string& job_id, int64_t after_seq,
                                                                int attempt) const {
  const std::string prefix = metrics_prefix(job_id);
  std::vector<MetricsRecord> out;
  std::string from = prefix + seq_key(after_seq + 1);
  const std::string end = EtcdClient::prefix_end(prefix);
  while (true) {
    COHORT_ASSIGN_OR_RETURN(RangeResult page, client_->range(from, end, kLoadPageSize));
    for (const KeyValue& kv : page.kvs) {
      etcdstore::StoredMetricsRecord stored;
      if (!stored.ParseFromString(kv.value))
        return data_loss_error("etcd key {}: not a metrics record", kv.key);
      if (attempt != 0 && stored.attempt() != attempt) continue;
      out.push_back(
          MetricsRecord{stored.seq(), stored.attempt(), stored.unix_ms(), from_stored(stored.metrics())});
    }
    if (!page.more || page.kvs.empty()) break;
    from = page.kvs.back().key + std::string(1, '\0');
  }
  return out;
}

StatusOr<std::vector<KeyValue>> EtcdJobStore::range_all(const std::string& prefix) const {
  return client_->range_all(prefix, kLoadPageSize);
}

StatusOr<int64_t> EtcdJobStore::read_counter(const std::string& key) const {
  COHORT_ASSIGN_OR_RETURN(RangeResult read, client_->range(key));
  if (read.kvs.empty()) return int64_t{0};
  return parse_counter(key, read.kvs.front().value);
}

Status EtcdJobStore::delete_job(const std::string& job_id) {
  COHORT_ASSIGN_OR_RETURN(RangeResult job, client_->range(job_key(job_id)));
  if (job.kvs.empty()) return ok_status();
  COHORT_ASSIGN_OR_RETURN(Job decoded, decode_job(job.kvs.front()));
  // The highest seqs of what goes: ids and seqs are never handed out again (Snapshot::retired_*).
  int64_t max_event = 0;
  for (const std::string& prefix : {prefix_ + "/events/" + job_id + "/", metrics_prefix(job_id)}) {
    COHORT_ASSIGN_OR_RETURN(RangeResult last, client_->range(prefix, EtcdClient::prefix_end(prefix)));
    for (const KeyValue& kv : last.kvs) {
      COHORT_ASSIGN_OR_RETURN(int64_t seq, parse_counter(kv.key, kv.key.substr(kv.key.rfind('/') + 1)));
      max_event = std::max(max_event, seq);
    }
  }
  COHORT_ASSIGN_OR_RETURN(int64_t retired_job, read_counter(prefix_ + "/meta/retired_job_seq"));
  COHORT_ASSIGN_OR_RETURN(int64_t retired_event, read_counter(prefix_ + "/meta/retired_event_seq"));
  etcdserverpb::TxnRequest request;
  *request.add_success() =
      put_op(prefix_ + "/meta/retired_job_seq", std::to_string(std::max(retired_job, decoded.seq)));
  *request.add_success() =
      put_op(prefix_ + "/meta/retired_event_seq", std::to_string(std::max(retired_event, max_event)));
  const std::string events = prefix_ + "/events/" + job_id + "/";
  *request.add_success() = delete_op(events, EtcdClient::prefix_end(events));
  *request.add_success() = delete_op(metrics_prefix(job_id), EtcdClient::prefix_end(metrics_prefix(job_id)));
  *request.add_success() =
      delete_op(rendezvous_prefix(job_id), EtcdClient::prefix_end(rendezvous_prefix(job_id)));
  *request.add_success() = delete_op(job_key(job_id));
  COHORT_RETURN_IF_ERROR(write(std::move(request), "deleting job " + job_id));
  metrics_rows_.erase(job_id);
  return ok_status();
}

Status EtcdJobStore::put_node(const coordinator::NodeInfo& node) {
  etcdstore::StoredNode stored;
  stored.set_node_id(node.node_id);
  stored.set_address(node.address);
  stored.set_hostname(node.hostname);
  stored.set_cores(node.cores);
  stored.set_memory_bytes(node.memory_bytes);
  for (const coordinator::GpuInfo& gpu : node.gpus) {
    etcdstore::StoredGpu* out = stored.add_gpus();
    out->set_index(gpu.index);
    out->set_model(gpu.model);
    out->set_memory_bytes(gpu.memory_bytes);
  }
  stored.set_slots(node.slots);
  std::string bytes;
  if (!stored.SerializeToString(&bytes))
    return internal_error("node '{}': cannot serialize its record", node.node_id);
  etcdserverpb::TxnRequest request;
  *request.add_success() = put_op(node_key(node.node_id), bytes);
  return write(std::move(request), "writing the record of node " + node.node_id);
}

Status EtcdJobStore::delete_node(const std::string& node_id) {
  etcdserverpb::TxnRequest request;
  *request.add_success() = delete_op(node_key(node_id));
  return write(std::move(request), "deleting the record of node " + node_id);
}

StatusOr<coordinator::JobStore::Snapshot> EtcdJobStore::load_all() const {
  Snapshot snapshot;
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> jobs, range_all(prefix_ + "/jobs/"));
  for (const KeyValue& kv : jobs) {
    COHORT_ASSIGN_OR_RETURN(Job job, decode_job(kv));
    snapshot.jobs.push_back(std::move(job));
  }
  std::sort(snapshot.jobs.begin(), snapshot.jobs.end(),
            [](const Job& a, const Job& b) { return a.seq < b.seq; });
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> events, range_all(prefix_ + "/events/"));
  for (const KeyValue& kv : events) {
    COHORT_ASSIGN_OR_RETURN(JobEvent event, decode_event(kv));
    snapshot.events.push_back(std::move(event));
  }
  std::sort(snapshot.events.begin(), snapshot.events.end(),
            [](const JobEvent& a, const JobEvent& b) { return a.seq < b.seq; });
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> nodes, range_all(prefix_ + "/nodes/"));
  for (const KeyValue& kv : nodes) {  // key order: by node id
    COHORT_ASSIGN_OR_RETURN(coordinator::NodeInfo node, decode_node(kv));
    snapshot.nodes.push_back(std::move(node));
  }
  COHORT_ASSIGN_OR_RETURN(snapshot.max_metrics_seq, read_counter(prefix_ + "/meta/max_metrics_seq"));
  COHORT_ASSIGN_OR_RETURN(snapshot.retired_job_seq, read_counter(prefix_ + "/meta/retired_job_seq"));
  COHORT_ASSIGN_OR_RETURN(snapshot.retired_event_seq, read_counter(prefix_ + "/meta/retired_event_seq"));
  return snapshot;
}

}  // namespace cohort::etcd
