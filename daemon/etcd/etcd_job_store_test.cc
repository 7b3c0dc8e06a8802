// EtcdJobStore against a real 3-member etcd 3.4 cluster with TLS client certificates: round trip,
// metrics history bound, deletion with retired seqs, fencing (a deposed leader's write is refused
// and changes nothing), and the etcd requests one job start costs a Coordinator on this store.

#include "daemon/etcd/etcd_job_store.h"

#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/coordinator/coordinator.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/etcd/etcd_rendezvous_journal.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::etcd {
namespace {

using coordinator::Job;
using coordinator::JobEvent;
using coordinator::JobState;
using coordinator::JobStateMachine;
using coordinator::JobStore;
using coordinator::KvStore;
using coordinator::MetricsRecord;
using coordinator::testing::valid_spec;
using testing::EtcdCluster;

Job make_job(const std::string& id, int64_t seq) {
  Job job;
  job.id = id;
  job.owner = "alice";
  job.seq = seq;
  job.spec = valid_spec("mlp", 2, 2);
  job.submit_unix_ms = 1000 + seq;
  coordinator::NodeAssignment node;
  node.node_id = "node-a";
  node.address = "10.0.0.1:7071";
  node.node_rank = 0;
  node.first_rank = 0;
  node.num_ranks = 2;
  node.gpus = {0, 1};
  job.placement.nodes.push_back(node);
  return job;
}

JobEvent submitted(const Job& job, int64_t seq) {
  JobEvent event;
  event.seq = seq;
  event.job_id = job.id;
  event.unix_ms = 2000 + seq;
  event.change = coordinator::JobTransition{JobState::kPending, JobState::kPending, 0, "submitted"};
  return event;
}

// Writes `id` as placed for `attempt` (the save PENDING -> PLACED that opens the attempt's
// rendezvous journal). `seq`: the event's.
Status place(JobStore* store, const std::string& id, int attempt, int64_t seq) {
  Job job = make_job(id, 1);
  COHORT_ASSIGN_OR_RETURN(job.machine, JobStateMachine::restore(JobState::kPlaced, attempt, "placed", 3));
  JobEvent placed = submitted(job, seq);
  placed.change = coordinator::JobTransition{JobState::kPending, JobState::kPlaced, attempt, "placed"};
  return store->save(job, placed);
}

class EtcdJobStoreTest : public testing::EtcdClusterTest {
 protected:
  void SetUp() override {
    EtcdClusterTest::SetUp();
    // Each test its own prefix: one cluster serves the suite.
    prefix_ = "/test/" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  std::unique_ptr<EtcdJobStore> open_store() {
    auto store = EtcdJobStore::open(client_.get(), prefix_);
    EXPECT_TRUE(store.ok()) << store.status().to_string();
    return store.ok() ? std::move(store).value() : nullptr;
  }

  // A leader of the test's election (`value`, a fresh 10 s lease) and a store fenced on its key;
  // revoking `lease` deposes it. `store` is null when etcd refused (the failure is recorded).
  struct Leader {
    int64_t lease = 0;
    std::unique_ptr<EtcdJobStore> store;
  };
  Leader lead(const std::string& value) {
    Leader leader;
    auto lease = client_->lease_grant(std::chrono::seconds(10));
    EXPECT_TRUE(lease.ok()) << lease.status().to_string();
    if (!lease.ok()) return leader;
    auto key = client_->campaign(prefix_ + "/election", *lease, value, std::chrono::milliseconds(5000));
    EXPECT_TRUE(key.ok()) << key.status().to_string();
    if (!key.ok()) return leader;
    leader.lease = *lease;
    leader.store = open_store();
    if (leader.store != nullptr) leader.store->set_fence(*key);
    return leader;
  }

  // A Coordinator on this test's prefix (another instance on the same prefix is a coordinator
  // taking over), fenced on `fence` when given.
  std::unique_ptr<coordinator::Coordinator> open_coordinator(const coordinator::Clock* clock,
                                                             std::optional<LeaderKey> fence = std::nullopt) {
    coordinator::CoordinatorOptions options;
    EtcdClient* client = client_.get();
    const std::string prefix = prefix_;
    options.open_store = [client, prefix, fence]() -> StatusOr<std::unique_ptr<JobStore>> {
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<EtcdJobStore> store, EtcdJobStore::open(client, prefix));
      store->set_fence(fence);
      return std::unique_ptr<JobStore>(std::move(store));
    };
    auto opened = coordinator::Coordinator::open(options, clock);
    EXPECT_TRUE(opened.ok()) << opened.status().to_string();
    return opened.ok() ? std::move(opened).value() : nullptr;
  }

  std::string prefix_;
};

TEST_F(EtcdJobStoreTest, RoundTripsJobsEventsAndMetrics) {
  auto store = open_store();
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(store->path().rfind("etcd://127.0.0.1:", 0), 0u) << store->path();
  Job second = make_job("mlp-2", 2);
  Job first = make_job("mlp-1", 1);
  ASSERT_TRUE(store->save(second, submitted(second, 3)).ok());
  ASSERT_TRUE(store->save(first, submitted(first, 1)).ok());
  auto running = JobStateMachine::restore(JobState::kRunning, 1, "started", 0);
  ASSERT_TRUE(running.ok());
  first.machine = *running;
  first.start_unix_ms = 5000;
  coordinator::Metrics metrics;
  metrics.step = 7;
  metrics.loss = 0.5;
  metrics.rank = 1;
  metrics.total_steps = 90;
  metrics.total_epochs = 3;
  metrics.samples_per_step = 64;
  metrics.comm_wait_s = 2.5;
  metrics.comm_wait_ratio = 0.25;
  first.last_metrics = metrics;
  ASSERT_TRUE(store->upsert_job(first).ok());
  JobEvent started = submitted(first, 2);
  started.change = coordinator::JobTransition{JobState::kPlaced, JobState::kRunning, 1, "started"};
  ASSERT_TRUE(store->append_event(started).ok());
  ASSERT_TRUE(store->append_metrics("mlp-1", MetricsRecord{10, 1, 123, metrics}).ok());
  coordinator::Metrics later = metrics;
  later.comm_wait_s = 4.0;  // each report keeps its own communication wait
  later.comm_wait_ratio = 0.5;
  ASSERT_TRUE(store->append_metrics("mlp-1", MetricsRecord{12, 2, 124, later}).ok());
  EXPECT_EQ(store->append_metrics("nope-9", MetricsRecord{13, 1, 125, metrics}).code(),
            StatusCode::kNotFound);
  JobEvent metrics_event = started;
  metrics_event.kind = JobEvent::Kind::kMetrics;
  EXPECT_EQ(store->append_event(metrics_event).code(), StatusCode::kInvalidArgument);

  // A new store (another coordinator taking over) reads it all back.
  auto reader = open_store();
  auto snapshot = reader->load_all();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  ASSERT_EQ(snapshot->jobs.size(), 2u);
  EXPECT_EQ(snapshot->jobs[0].id, "mlp-1");  // submission order
  EXPECT_EQ(snapshot->jobs[0].state(), JobState::kRunning);
  EXPECT_EQ(snapshot->jobs[0].attempt(), 1);
  EXPECT_EQ(snapshot->jobs[0].owner, "alice");
  EXPECT_EQ(snapshot->jobs[0].start_unix_ms, 5000);
  ASSERT_TRUE(snapshot->jobs[0].last_metrics.has_value());
  EXPECT_EQ(snapshot->jobs[0].last_metrics->step, 7);
  EXPECT_EQ(snapshot->jobs[0].last_metrics->total_steps, 90);
  EXPECT_EQ(snapshot->jobs[0].last_metrics->total_epochs, 3);
  EXPECT_EQ(snapshot->jobs[0].last_metrics->samples_per_step, 64);
  EXPECT_DOUBLE_EQ(snapshot->jobs[0].last_metrics->comm_wait_s, 2.5);
  EXPECT_DOUBLE_EQ(snapshot->jobs[0].last_metrics->comm_wait_ratio, 0.25);
  EXPECT_EQ(snapshot->jobs[0].spec.SerializeAsString(), first.spec.SerializeAsString());
  ASSERT_EQ(snapshot->jobs[0].placement.nodes.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].placement.nodes[0].address, "10.0.0.1:7071");
  EXPECT_EQ(snapshot->jobs[0].placement.nodes[0].gpus, (std::vector<int>{0, 1}));
  ASSERT_EQ(snapshot->events.size(), 3u);
  EXPECT_EQ(snapshot->events[0].seq, 1);  // sequence order across jobs
  EXPECT_EQ(snapshot->events[1].seq, 2);
  EXPECT_EQ(snapshot->events[1].change.to, JobState::kRunning);
  EXPECT_EQ(snapshot->events[2].seq, 3);
  EXPECT_EQ(snapshot->max_metrics_seq, 12);
  auto all = reader->load_metrics("mlp-1");
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[1].seq, 12);
  EXPECT_DOUBLE_EQ((*all)[0].metrics.comm_wait_s, 2.5);
  EXPECT_DOUBLE_EQ((*all)[0].metrics.comm_wait_ratio, 0.25);
  EXPECT_DOUBLE_EQ((*all)[1].metrics.comm_wait_s, 4.0);
  EXPECT_DOUBLE_EQ((*all)[1].metrics.comm_wait_ratio, 0.5);
  EXPECT_EQ((*all)[1].metrics.total_steps, 90);
  auto after = reader->load_metrics("mlp-1", 10);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(after->size(), 1u);
  auto attempt1 = reader->load_metrics("mlp-1", 0, 1);
  ASSERT_TRUE(attempt1.ok());
  ASSERT_EQ(attempt1->size(), 1u);
  EXPECT_EQ((*attempt1)[0].seq, 10);
}

TEST_F(EtcdJobStoreTest, MetricsHistoryIsBoundedAndDeletionRetiresSeqs) {
  auto store = open_store();
  Job job = make_job("mlp-4", 4);
  ASSERT_TRUE(store->save(job, submitted(job, 40)).ok());
  coordinator::Metrics metrics;
  for (int64_t seq = 41; seq <= 52; ++seq) {
    ASSERT_TRUE(store->append_metrics("mlp-4", MetricsRecord{seq, 1, seq, metrics}, /*max_rows=*/8).ok());
  }
  auto kept = store->load_metrics("mlp-4");
  ASSERT_TRUE(kept.ok());
  EXPECT_LE(kept->size(), 8u);
  EXPECT_GE(kept->size(), 4u);
  EXPECT_EQ(kept->front().seq, 41);  // the first and the newest are kept
  EXPECT_EQ(kept->back().seq, 52);

  ASSERT_TRUE(store->delete_job("mlp-4").ok());
  ASSERT_TRUE(store->delete_job("mlp-4").ok());  // unknown: OK
  auto snapshot = store->load_all();
  ASSERT_TRUE(snapshot.ok());
  EXPECT_TRUE(snapshot->jobs.empty());
  EXPECT_TRUE(snapshot->events.empty());
  EXPECT_EQ(snapshot->retired_job_seq, 4);
  EXPECT_EQ(snapshot->retired_event_seq, 52);
  EXPECT_TRUE(store->load_metrics("mlp-4")->empty());
}

TEST_F(EtcdJobStoreTest, ADeposedLeadersWriteIsRefusedAndChangesNothing) {
  Leader old = lead("old:1");
  ASSERT_NE(old.store, nullptr);
  EtcdJobStore* old_leader = old.store.get();
  Job job = make_job("mlp-1", 1);
  ASSERT_TRUE(old_leader->save(job, submitted(job, 1)).ok()) << "the leader's own write";

  // The old leader's lease is gone (it hung past its TTL); a new leader is elected and writes.
  ASSERT_TRUE(client_->lease_revoke(old.lease).ok());
  Leader current = lead("new:2");
  ASSERT_NE(current.store, nullptr);
  EtcdJobStore* new_leader = current.store.get();
  auto cancelled = JobStateMachine::restore(JobState::kCancelled, 1, "cancelled by the new leader", 0);
  ASSERT_TRUE(cancelled.ok());
  Job by_new = job;
  by_new.machine = *cancelled;
  ASSERT_TRUE(new_leader->upsert_job(by_new).ok());

  // The old leader wakes up and writes: refused, and the new leader's record stands.
  auto running = JobStateMachine::restore(JobState::kRunning, 1, "stale", 0);
  Job by_old = job;
  by_old.machine = *running;
  Status stale = old_leader->upsert_job(by_old);
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition) << stale.to_string();
  EXPECT_NE(stale.message().find("no longer leads"), std::string::npos) << stale.message();
  EXPECT_EQ(old_leader->append_event(submitted(job, 9)).code(), StatusCode::kFailedPrecondition);
  coordinator::Metrics metrics;
  EXPECT_EQ(old_leader->append_metrics("mlp-1", MetricsRecord{10, 1, 1, metrics}).code(),
            StatusCode::kFailedPrecondition);
  auto snapshot = new_leader->load_all();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->jobs.size(), 1u);
  EXPECT_EQ(snapshot->jobs[0].state(), JobState::kCancelled);
  EXPECT_EQ(snapshot->events.size(), 1u);
  EXPECT_EQ(snapshot->max_metrics_seq, 0);
  ASSERT_TRUE(client_->lease_revoke(current.lease).ok());
}

coordinator::NodeInfo node_info(const std::string& id, int slots, int gpus = 0) {
  coordinator::NodeInfo info;
  info.node_id = id;
  info.address = id + ":7071";
  info.hostname = id + ".example";
  info.cores = 8;
  info.memory_bytes = int64_t{16} << 30;
  info.slots = slots;
  for (int i = 0; i < gpus; ++i) info.gpus.push_back(coordinator::GpuInfo{i, "test-gpu", int64_t{1} << 30});
  return info;
}

const coordinator::NodeStatus* find_node(const std::vector<coordinator::NodeStatus>& nodes, const std::string& id) {
  for (const coordinator::NodeStatus& node : nodes) {
    if (node.info.node_id == id) return &node;
  }
  return nullptr;
}

// Issue 16: the node registry's records live in etcd. The leader writes a node's record when it
// registers (once: heartbeats and unchanged re-registrations write nothing) and deletes it when the
// node is lost or removed; a coordinator taking over lists the nodes at once, each with a fresh
// lease, reserves the slots of the attempts it recovers on them, and gives them new work once their
// agents register.
TEST_F(EtcdJobStoreTest, ACoordinatorTakingOverKnowsTheNodesItsPredecessorRegistered) {
  coordinator::FakeClock clock;
  auto first = open_coordinator(&clock);
  ASSERT_NE(first, nullptr);
  client_->reset_request_counts();
  ASSERT_TRUE(first->register_node(node_info("node-a", 3, 2)).ok());
  ASSERT_TRUE(first->register_node(node_info("node-b", 2)).ok());
  ASSERT_TRUE(first->register_node(node_info("node-c", 1)).ok());
  EXPECT_EQ(client_->total_requests(), 3) << "one Txn per registration";
  client_->reset_request_counts();
  ASSERT_TRUE(first->heartbeat("node-a").ok());
  ASSERT_TRUE(first->register_node(node_info("node-b", 2)).ok());  // the same info again
  first->tick();
  EXPECT_EQ(client_->total_requests(), 0) << "heartbeats and unchanged registrations write nothing";
  first->remove_node("node-c", "its certificate was revoked");
  EXPECT_EQ(client_->total_requests(), 1) << "the removed node's record is deleted";

  // A job runs on node-a; node-b is idle.
  auto id = first->submit(valid_spec("mlp", 1, 2));
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  coordinator::AgentOrders orders = first->tick();
  ASSERT_EQ(orders.launches.size(), 1u);
  ASSERT_EQ(orders.launches[0].node.node_id, "node-b");  // best fit: the fewest free slots
  ASSERT_TRUE(first->report_tasks_started("node-b", *id, 1).ok());

  // The leader dies; another coordinator opens the same records 10 s later.
  first.reset();
  clock.advance(std::chrono::seconds(10));
  auto second = open_coordinator(&clock);
  ASSERT_NE(second, nullptr);
  std::vector<coordinator::NodeStatus> nodes = second->list_nodes();
  ASSERT_EQ(nodes.size(), 2u) << "node-c was removed; its record with it";
  const coordinator::NodeStatus* a = find_node(nodes, "node-a");
  const coordinator::NodeStatus* b = find_node(nodes, "node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(a->info, node_info("node-a", 3, 2)) << "every field of the record";
  EXPECT_TRUE(a->awaiting_registration);
  EXPECT_FALSE(a->schedulable());
  EXPECT_EQ(a->lease_expiry, clock.now() + coordinator::kDefaultNodeLease) << "a fresh lease from the takeover";
  // A submission right after the takeover is checked against the restored nodes, not refused.
  EXPECT_TRUE(second->check_capacity(valid_spec("mlp", 2, 2), coordinator::CapacityRequest{}).ok());

  // Heartbeats are refused until the agent registers (its registration reconciles its tasks).
  EXPECT_EQ(second->heartbeat("node-b").code(), StatusCode::kNotFound);
  auto queued = second->submit(valid_spec("next", 1, 2));
  ASSERT_TRUE(queued.ok()) << queued.status().to_string();
  EXPECT_TRUE(second->tick().launches.empty()) << "no new work before the agents register";
  EXPECT_NE(second->get_job(*queued)->waiting_for.find("node node-a is restored from the job store"),
            std::string::npos)
      << second->get_job(*queued)->waiting_for;

  // node-b's agent registers with the attempt it still runs: re-adopted, its slots held.
  auto registered = second->register_node(node_info("node-b", 2), {coordinator::RunningAttempt{*id, 1, {0, 1}}});
  ASSERT_TRUE(registered.ok()) << registered.status().to_string();
  EXPECT_TRUE(registered->stops.empty());
  EXPECT_EQ(second->get_job(*id)->state(), JobState::kRunning);
  b = find_node(second->list_nodes(), "node-b");
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(b->schedulable());
  EXPECT_EQ(b->free_slots, 0) << "the re-adopted attempt holds both slots";

  // node-a died during the failover: it never registers and is lost one lease after the takeover,
  // its record deleted.
  clock.advance(coordinator::kDefaultNodeLease - std::chrono::seconds(1));
  ASSERT_TRUE(second->heartbeat("node-b").ok());
  clock.advance(std::chrono::seconds(2));
  second->tick();
  ASSERT_EQ(second->list_nodes().size(), 1u);
  auto snapshot = open_store()->load_all();
  ASSERT_TRUE(snapshot.ok()) << snapshot.status().to_string();
  ASSERT_EQ(snapshot->nodes.size(), 1u);
  EXPECT_EQ(snapshot->nodes[0], node_info("node-b", 2));
}

TEST_F(EtcdJobStoreTest, ADeposedLeaderCannotWriteOrDeleteNodeRecords) {
  Leader leader = lead("old:1");
  ASSERT_NE(leader.store, nullptr);
  EtcdJobStore* store = leader.store.get();
  ASSERT_TRUE(store->put_node(node_info("node-a", 1)).ok());
  ASSERT_TRUE(client_->lease_revoke(leader.lease).ok());
  EXPECT_EQ(store->put_node(node_info("node-b", 1)).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->delete_node("node-a").code(), StatusCode::kFailedPrecondition);
  auto snapshot = open_store()->load_all();
  ASSERT_TRUE(snapshot.ok());
  ASSERT_EQ(snapshot->nodes.size(), 1u);
  EXPECT_EQ(snapshot->nodes[0].node_id, "node-a");
  // Unfenced (a single coordinator), deleting works, and deleting a missing record is OK.
  store->set_fence(std::nullopt);
  EXPECT_TRUE(store->delete_node("node-a").ok());
  EXPECT_TRUE(store->delete_node("node-a").ok());
  EXPECT_TRUE(open_store()->load_all()->nodes.empty());
}

// Issue 16: a placed attempt's rendezvous journal round-trips through etcd (progress, store keys
// with any bytes, answered request ids in order, forgotten ones gone), and a deposed leader's
// journal write is refused and changes nothing.
TEST_F(EtcdJobStoreTest, ARendezvousJournalRoundTripsAndADeposedLeadersWriteIsRefused) {
  Leader leader = lead("old:1");
  ASSERT_NE(leader.store, nullptr);
  EtcdJobStore* store = leader.store.get();
  ASSERT_TRUE(place(store, "mlp-1", 1, 1).ok());
  auto journal = store->rendezvous_journal("mlp-1", 1);
  ASSERT_NE(journal, nullptr);
  coordinator::RendezvousProgress progress;
  progress.joined = {0, 1, 2};
  progress.barrier_generation = 2;
  progress.left = {1};
  ASSERT_TRUE(journal->write_progress(progress).ok());
  const std::string binary("ucx\0addr\xff", 9);
  ASSERT_TRUE(journal->write_key("addr/0/ucx", binary, {}, {}).ok());
  ASSERT_TRUE(journal->write_key("n", "2", {"req-1", "2"}, {}).ok());
  ASSERT_TRUE(journal->write_key("n", "3", {"req-2", "3"}, {"req-1"}).ok());
  ASSERT_TRUE(journal->write_key("gone", "x", {}, {}).ok());
  ASSERT_TRUE(journal->write_key("gone", std::nullopt, {"req-3", "1"}, {}).ok());
  // Another attempt's journal is its own (a job placed under another id here: one job has one
  // attempt placed at a time).
  ASSERT_TRUE(place(store, "mlp-2", 2, 2).ok());
  ASSERT_TRUE(store->rendezvous_journal("mlp-2", 2)->write_key("n", "99", {}, {}).ok());

  auto reader = open_store();
  auto state = reader->load_rendezvous("mlp-1", 1);
  ASSERT_TRUE(state.ok()) << state.status().to_string();
  EXPECT_EQ(state->progress, progress);
  EXPECT_EQ(state->data, (std::map<std::string, std::string>{{"addr/0/ucx", binary}, {"n", "3"}}));
  ASSERT_EQ(state->answered.size(), 2u);
  EXPECT_EQ(state->answered[0], (coordinator::AnsweredRequest{"req-2", "3"})) << "oldest first";
  EXPECT_EQ(state->answered[1], (coordinator::AnsweredRequest{"req-3", "1"}));
  auto other = reader->load_rendezvous("mlp-2", 2);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->data, (std::map<std::string, std::string>{{"n", "99"}}));
  // An attempt never placed has no journal to write to.
  Status unplaced = store->rendezvous_journal("mlp-1", 2)->write_key("n", "1", {}, {});
  EXPECT_EQ(unplaced.code(), StatusCode::kFailedPrecondition) << unplaced.to_string();
  EXPECT_TRUE(reader->load_rendezvous("mlp-1", 2)->empty());
  auto none = reader->load_rendezvous("mlp-1", 3);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());

  // Deposed: its lease is gone. Nothing it journals lands.
  ASSERT_TRUE(client_->lease_revoke(leader.lease).ok());
  Status stale = journal->write_key("n", "4", {"req-4", "4"}, {});
  EXPECT_EQ(stale.code(), StatusCode::kFailedPrecondition) << stale.to_string();
  EXPECT_NE(stale.message().find("no longer leads"), std::string::npos) << stale.message();
  EXPECT_EQ(journal->write_progress(coordinator::RendezvousProgress{}).code(),
            StatusCode::kFailedPrecondition);
  auto after = reader->load_rendezvous("mlp-1", 1);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->progress, progress);
  EXPECT_EQ(after->data.at("n"), "3");
  EXPECT_EQ(after->answered.size(), 2u);
}

// The journal goes with the write that ends the attempt (no request of its own), and with the job.
TEST_F(EtcdJobStoreTest, TheSaveThatEndsAnAttemptDropsItsRendezvousJournal) {
  auto store = open_store();
  Job job = make_job("mlp-1", 1);
  ASSERT_TRUE(store->save(job, submitted(job, 1)).ok());
  Status unplaced = store->rendezvous_journal("mlp-1", 1)->write_key("k", "v", {}, {});
  EXPECT_EQ(unplaced.code(), StatusCode::kFailedPrecondition) << "journaled before the attempt was placed";
  client_->reset_request_counts();
  ASSERT_TRUE(place(store.get(), "mlp-1", 1, 2).ok());
  EXPECT_EQ(client_->total_requests(), 1) << "one Txn: the job, its event and the journal's opening";
  auto late_journal = store->rendezvous_journal("mlp-1", 1);
  ASSERT_TRUE(late_journal->write_key("k", "v", {}, {}).ok());
  auto running = JobStateMachine::restore(JobState::kRunning, 1, "started", 0);
  ASSERT_TRUE(running.ok());
  job.machine = *running;
  JobEvent started = submitted(job, 3);
  started.change = coordinator::JobTransition{JobState::kPlaced, JobState::kRunning, 1, "started"};
  ASSERT_TRUE(store->save(job, started).ok());
  EXPECT_EQ(store->load_rendezvous("mlp-1", 1)->data.size(), 1u) << "RUNNING keeps it";

  auto succeeded = JobStateMachine::restore(JobState::kSucceeded, 1, "done", 0);
  ASSERT_TRUE(succeeded.ok());
  job.machine = *succeeded;
  JobEvent done = submitted(job, 4);
  done.change = coordinator::JobTransition{JobState::kRunning, JobState::kSucceeded, 1, "done"};
  client_->reset_request_counts();
  ASSERT_TRUE(store->save(job, done).ok());
  EXPECT_EQ(client_->total_requests(), 1) << "one Txn: the job, its event and the journal's deletion";
  EXPECT_TRUE(store->load_rendezvous("mlp-1", 1)->empty());
  auto left = client_->range_prefix(store->rendezvous_prefix("mlp-1"), 1);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->count, 0) << "keys left under " << store->rendezvous_prefix("mlp-1");

  // A store write and a leave still in flight when the attempt ended (the rendezvous closes only
  // once they return): refused, naming the ended attempt, and no key comes back.
  Status late = late_journal->write_key("late", "v", {"req-9", "1"}, {});
  EXPECT_EQ(late.code(), StatusCode::kFailedPrecondition) << late.to_string();
  EXPECT_NE(late.message().find("has ended"), std::string::npos) << late.message();
  coordinator::RendezvousProgress leaving;
  leaving.left = {1};
  EXPECT_EQ(late_journal->write_progress(leaving).code(), StatusCode::kFailedPrecondition);
  left = client_->range_prefix(store->rendezvous_prefix("mlp-1"), 1);
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->count, 0) << "a late write recreated keys under " << store->rendezvous_prefix("mlp-1");
  ASSERT_TRUE(store->delete_job("mlp-1").ok());
  EXPECT_TRUE(store->load_rendezvous("mlp-1", 1)->empty());
}

// An attempt placed by a coordinator that did not open its journal in the placement's save (an
// older version, before a rolling upgrade): the coordinator that recovers it opens the journal, so
// its ranks' store writes are journaled, not refused.
TEST_F(EtcdJobStoreTest, ACoordinatorRecoveringAnAttemptPlacedWithoutAnOpenJournalOpensIt) {
  {
    auto store = open_store();
    ASSERT_TRUE(place(store.get(), "old-1", 1, 1).ok());
    const std::string progress = EtcdRendezvousJournal::progress_key(store->rendezvous_prefix("old-1", 1));
    auto removed = client_->delete_range(progress);
    ASSERT_TRUE(removed.ok());
    ASSERT_EQ(*removed, 1);
    EXPECT_EQ(store->rendezvous_journal("old-1", 1)->write_key("k", "v", {}, {}).code(),
              StatusCode::kFailedPrecondition);
  }
  coordinator::FakeClock clock;
  auto coordinator = open_coordinator(&clock);
  ASSERT_NE(coordinator, nullptr);
  auto rendezvous = coordinator->rendezvous("old-1", 1);
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status().to_string();
  Status set = (*rendezvous)->store().set("k", "v");
  ASSERT_TRUE(set.ok()) << set.to_string();
  auto store = open_store();
  auto state = store->load_rendezvous("old-1", 1);
  ASSERT_TRUE(state.ok()) << state.status().to_string();
  EXPECT_EQ(state->data, (std::map<std::string, std::string>{{"k", "v"}}));
  // Opening an open journal keeps its progress.
  coordinator::RendezvousProgress progress;
  progress.barrier_generation = 3;
  ASSERT_TRUE(store->rendezvous_journal("old-1", 1)->write_progress(progress).ok());
  ASSERT_TRUE(store->open_rendezvous_journal("old-1", 1).ok());
  EXPECT_EQ(store->load_rendezvous("old-1", 1)->progress, progress);
}

// The takeover end to end at the Coordinator level: the first leader's ranks joined and wrote to
// their store, then it died with a rank blocked in a get; the next coordinator on the same records
// rebuilds the rendezvous, so a rank joining again is answered at once with its rank, the store
// holds what the ranks wrote, an add sent again is not counted twice, and the blocked get, sent
// again, is answered once the key is set.
TEST_F(EtcdJobStoreTest, ACoordinatorTakingOverContinuesARendezvousInProgress) {
  coordinator::FakeClock clock;
  auto first = open_coordinator(&clock);
  ASSERT_NE(first, nullptr);
  for (const char* node : {"node-a", "node-b"}) ASSERT_TRUE(first->register_node(node_info(node, 1)).ok());
  auto id = first->submit(valid_spec("mlp", 2, 1));
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  coordinator::AgentOrders orders = first->tick();
  ASSERT_EQ(orders.launches.size(), 2u);
  for (const auto& launch : orders.launches)
    ASSERT_TRUE(first->report_tasks_started(launch.node.node_id, launch.job_id, launch.attempt).ok());
  auto rendezvous = first->rendezvous(*id, 1);
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status().to_string();
  std::map<std::string, int> ranks;  // node -> rank
  std::vector<std::thread> joiners;
  std::mutex mu;
  for (const char* node : {"node-a", "node-b"}) {
    joiners.emplace_back([&, node] {
      auto joined = (*rendezvous)->join(node, 0, std::chrono::seconds(10));
      ASSERT_TRUE(joined.ok()) << joined.status().to_string();
      std::lock_guard<std::mutex> lock(mu);
      ranks[node] = joined->rank;
    });
  }
  for (auto& joiner : joiners) joiner.join();
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_TRUE((*rendezvous)->store().set("from0", "hello").ok());
  ASSERT_EQ((*rendezvous)->store().add("arrived", 1, "rank0-1").value_or(-1), 1);
  ASSERT_EQ((*rendezvous)->store().add("arrived", 1, "rank1-1").value_or(-1), 2);
  Status blocked;
  std::thread waiter([&] { blocked = (*rendezvous)->store().get("go", std::chrono::seconds(10)).status(); });

  // The leader dies: its blocked call breaks (here: shutdown closes the rendezvous).
  first.reset();
  waiter.join();
  EXPECT_EQ(blocked.code(), StatusCode::kUnavailable) << blocked.to_string();

  auto second = open_coordinator(&clock);
  ASSERT_NE(second, nullptr);
  auto continued = second->rendezvous(*id, 1);
  ASSERT_TRUE(continued.ok()) << continued.status().to_string();
  auto again = (*continued)->join("node-b", 0, std::chrono::milliseconds(50));  // node-a never joins again
  ASSERT_TRUE(again.ok()) << "the completed join was not carried over: " << again.status().to_string();
  EXPECT_EQ(again->rank, ranks["node-b"]);
  KvStore& store = (*continued)->store();
  EXPECT_EQ(store.get("from0", std::chrono::milliseconds(50)).value_or(""), "hello");
  EXPECT_EQ(store.add("arrived", 1, "rank1-1").value_or(-1), 2) << "an add sent again was counted twice";
  std::thread setter([&] { EXPECT_TRUE(store.set("go", "1").ok()); });
  EXPECT_EQ(store.get("go", std::chrono::seconds(10)).value_or(""), "1") << "the get sent again";
  setter.join();
  EXPECT_EQ(store.add("arrived", 0).value_or(-1), 2);
}

// The measurement the README quotes: etcd requests for one job start on a Coordinator whose store
// is etcd: submit, placement, both nodes started, every rank's rendezvous and a few store
// operations per rank. The job's state changes (with its placement, i.e. the rank assignments)
// cost one Txn each; the rendezvous journal (issue 16) one Txn for the completed join and one per
// store write (a set and an add per rank here); waits and gets cost nothing.
TEST_F(EtcdJobStoreTest, EtcdRequestsPerJobStart) {
  coordinator::FakeClock clock;
  coordinator::CoordinatorOptions options;
  EtcdClient* client = client_.get();
  const std::string prefix = prefix_;
  options.open_store = [client, prefix]() -> StatusOr<std::unique_ptr<JobStore>> {
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<EtcdJobStore> store, EtcdJobStore::open(client, prefix));
    return std::unique_ptr<JobStore>(std::move(store));
  };
  auto opened = coordinator::Coordinator::open(options, &clock);
  ASSERT_TRUE(opened.ok()) << opened.status().to_string();
  auto& coordinator = *opened;
  for (const std::string node : {"node-a", "node-b"}) {
    coordinator::NodeInfo info;
    info.node_id = node;
    info.address = node + ":7071";
    info.hostname = node;
    info.slots = 2;
    ASSERT_TRUE(coordinator->register_node(info).ok());
  }
  client_->reset_request_counts();
  auto id = coordinator->submit(valid_spec("mlp", 2, 2));
  ASSERT_TRUE(id.ok()) << id.status().to_string();
  const int64_t after_submit = client_->total_requests();
  coordinator::AgentOrders orders = coordinator->tick();
  ASSERT_EQ(orders.launches.size(), 2u);
  for (const auto& launch : orders.launches) {
    ASSERT_TRUE(coordinator->report_tasks_started(launch.node.node_id, launch.job_id, launch.attempt).ok());
  }
  auto rendezvous = coordinator->rendezvous(*id, 1);
  ASSERT_TRUE(rendezvous.ok()) << rendezvous.status().to_string();
  std::vector<std::thread> ranks;
  const int64_t before_rendezvous_start = client_->total_requests();
  for (const std::string node : {"node-a", "node-b"}) {
    for (int slot = 0; slot < 2; ++slot) {
      ranks.emplace_back([&, node, slot] {
        auto assignment = (*rendezvous)->join(node, slot, std::chrono::seconds(10));
        ASSERT_TRUE(assignment.ok()) << assignment.status().to_string();
        auto& kv = (*rendezvous)->store();
        const std::string key = "rank" + std::to_string(assignment->rank);
        ASSERT_TRUE(kv.set(key, "ucx-address").ok());
        ASSERT_TRUE(kv.add("joined", 1).ok());
        ASSERT_TRUE(kv.wait({"rank0", "rank1", "rank2", "rank3"}, std::chrono::seconds(10)).ok());
        ASSERT_TRUE(kv.get("rank0").ok());
      });
    }
  }
  for (auto& rank : ranks) rank.join();
  EXPECT_EQ(coordinator->get_job(*id)->state(), JobState::kRunning);
  const auto counts = client_->request_counts();
  const int64_t total = client_->total_requests();
  const int64_t rendezvous_requests = total - before_rendezvous_start;
  std::string by_kind;
  for (const auto& [rpc, n] : counts) by_kind += " " + rpc + "=" + std::to_string(n);
  std::printf(
      "etcd requests per job start (2 nodes x 2 ranks, submit -> RUNNING + rendezvous with a set and an add "
      "per rank): %lld (submit %lld; state changes %lld; rendezvous journal %lld;%s)\n",
      static_cast<long long>(total), static_cast<long long>(after_submit),
      static_cast<long long>(before_rendezvous_start), static_cast<long long>(rendezvous_requests),
      by_kind.c_str());
  RecordProperty("etcd_requests_per_job_start", static_cast<int>(total));
  // One transaction per state change (submit, placed, running); the rendezvous journal: one for the
  // completed join (not one per rank) and one per store write (4 sets + 4 adds), none per wait/get.
  EXPECT_LE(before_rendezvous_start, 4) << by_kind;
  EXPECT_GE(before_rendezvous_start, 3) << by_kind;
  EXPECT_EQ(rendezvous_requests, 1 + 4 + 4) << by_kind;
  EXPECT_LE(total, 13) << by_kind;
  EXPECT_EQ(counts.count("Range"), 0u) << "a read on the hot path:" << by_kind;
}

}  // namespace
}  // namespace cohort::etcd
