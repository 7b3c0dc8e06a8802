#include "daemon/coordinator/coordinator.h"

#include <string.h>  // sigabbrev_np

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "daemon/coordinator/job_spec_validation.h"

namespace cohort::coordinator {

namespace {

SlotRequest request_of(const cohort::v1::JobSpec& spec) {
  return SlotRequest{spec.nodes(), spec.procs_per_node(), spec.gpus_per_proc()};
}

bool exited_cleanly(const TaskExit& exit) { return exit.signal == 0 && exit.exit_code == 0; }

// "rank 3 on node node-b exited with code 1" / "... was killed by signal 9 (SIGKILL)".
// With the agent's detail, what it saw: "rank 1 on node node-a: pid 42 stopped ... for 5.0 s; ...".
std::string describe_exit(const TaskExit& exit) {
  if (!exit.detail.empty()) return fmt::format("rank {} on node {}: {}", exit.rank, exit.node_id, exit.detail);
  if (exit.signal != 0) {
    const char* abbrev = sigabbrev_np(exit.signal);
    return fmt::format("rank {} on node {} was killed by signal {}{}", exit.rank, exit.node_id, exit.signal,
                       abbrev != nullptr ? fmt::format(" (SIG{})", abbrev) : "");
  }
  return fmt::format("rank {} on node {} exited with code {}", exit.rank, exit.node_id, exit.exit_code);
}

}  // namespace

// ---- construction and recovery ----

StatusOr<std::unique_ptr<Coordinator>> Coordinator::open(CoordinatorOptions options, const Clock* clock) {
  if (clock == nullptr) return invalid_argument_error("Coordinator::open: clock is null");
  if (options.data_dir.empty() && !options.open_store) {
    return invalid_argument_error("the coordinator needs a data directory for its job records (--data-dir)");
  }
  COHORT_RETURN_IF_ERROR(validate_path_roots(options.allowed_path_roots));
  if (options.start_timeout <= Duration(0)) {
    return invalid_argument_error("CoordinatorOptions::start_timeout is {} ms; it must be positive (daemon config "
                                  "start_timeout_ms)",
                                  options.start_timeout.count());
  }
  COHORT_RETURN_IF_ERROR(validate_allowed_commands(options.allowed_commands));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<JobStore> store,
                          options.open_store ? options.open_store() : JobStore::open(options.data_dir));
  if (store == nullptr) return invalid_argument_error("CoordinatorOptions::open_store returned no store");
  COHORT_ASSIGN_OR_RETURN(JobStore::Snapshot snapshot, store->load_all());
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(options), clock, std::move(store)));
  {
    std::lock_guard<std::mutex> lock(coordinator->mu_);
    COHORT_RETURN_IF_ERROR(coordinator->recover_locked(std::move(snapshot)));
  }
  return coordinator;
}

Coordinator::Coordinator(CoordinatorOptions options, const Clock* clock, std::unique_ptr<JobStore> store)
    : options_(std::move(options)), clock_(clock), store_(std::move(store)), nodes_(options_.node_lease) {}

Coordinator::~Coordinator() { shutdown(); }

Status Coordinator::recover_locked(JobStore::Snapshot snapshot) {
  // Metrics reports took event seqs too; new events must come after them.
  next_event_seq_ = std::max(next_event_seq_, snapshot.max_metrics_seq + 1);
  // Jobs deleted after their retention period keep their ids and seqs: never hand them out again.
  next_event_seq_ = std::max(next_event_seq_, snapshot.retired_event_seq + 1);
  next_job_seq_ = std::max(next_job_seq_, snapshot.retired_job_seq + 1);
  for (JobEvent& event : snapshot.events) {
    next_event_seq_ = std::max(next_event_seq_, event.seq + 1);
    publish_locked(std::move(event));
  }
  for (Job& job : snapshot.jobs) {
    next_job_seq_ = std::max(next_job_seq_, job.seq + 1);
    const std::string id = job.id;
    jobs_.emplace(id, std::move(job));
  }
  // Nodes known from the store's records (a takeover on a shared store): listed at once, each with
  // a fresh lease, so one that died during the failover is lost one lease from now.
  for (NodeInfo& node : snapshot.nodes) {
    const std::string id = node.node_id;
    Status restored = nodes_.restore_node(node, clock_->now());
    if (!restored.ok()) {
      spdlog::warn("coordinator: ignoring the stored record of node {}: {}", id, restored.to_string());
      continue;
    }
    stored_nodes_.emplace(id, std::move(node));
  }
  if (!stored_nodes_.empty()) {
    spdlog::info("coordinator: restored {} node(s) from {}; each takes new work once its agent registers",
                 stored_nodes_.size(), store_->path());
  }
  AgentOrders unused;  // no node is registered yet, so there is nobody to send stops to
  for (auto& item : jobs_) {
    Job& job = item.second;
    switch (job.state()) {
      case JobState::kPending:
        COHORT_RETURN_IF_ERROR(scheduler_.enqueue(job.id, job.seq, request_of(job.spec)));
        break;
      case JobState::kPlaced:
      case JobState::kRunning: {
        if (job.placement.nodes.empty()) {
          COHORT_RETURN_IF_ERROR(fail_attempt_locked(
              job,
              fmt::format("the coordinator restarted while attempt {} was {} and its placement was not stored",
                          job.attempt(), job_state_name(job.state())),
              unused));
          break;
        }
        // Its tasks may still run: it waits for its nodes to register and report it (register_node)
        // instead of being failed and relaunched while its old workers still write. Its slots are
        // reserved as each node comes back.
        LiveAttempt live;
        live.placement = job.placement;
        for (const NodeAssignment& node : live.placement.nodes) {
          for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank)
            live.live_ranks.insert(rank);
        }
        live.rendezvous = recover_rendezvous_locked(job, live.placement);
        // Its tasks may hold slots on restored nodes; the node's registration reserves them anew.
        for (const NodeAssignment& node : live.placement.nodes) {
          if (!nodes_.contains(node.node_id)) continue;
          Status reserved = nodes_.reserve(node.node_id, node.num_ranks, node.gpus);
          if (!reserved.ok()) {
            spdlog::warn("coordinator: job {} attempt {}: cannot reserve its slots on restored node {}: {}", job.id,
                         job.attempt(), node.node_id, reserved.to_string());
          }
        }
        const Duration window = options_.reconcile_window.count() > 0 ? options_.reconcile_window : nodes_.lease();
        live.reconcile_deadline = clock_->now() + window;
        attempts_.emplace(AttemptKey{job.id, job.attempt()}, std::move(live));
        spdlog::info("coordinator: job {} attempt {} was {}; waiting up to {} for its nodes ({}) to report it",
                     job.id, job.attempt(), job_state_name(job.state()), format_duration(window),
                     job.placement.node_list());
        break;
      }
      default:
        break;
    }
  }
  if (!jobs_.empty()) {
    spdlog::info("coordinator: recovered {} job(s) from {}, {} queued", jobs_.size(), store_->path(),
                 scheduler_.size());
  }
  return ok_status();
}

std::shared_ptr<Rendezvous> Coordinator::recover_rendezvous_locked(const Job& job,
                                                                   const Placement& placement) {
  if (Status opened = store_->open_rendezvous_journal(job.id, job.attempt()); !opened.ok()) {
    // Only an attempt placed without an open journal (an older coordinator) is hurt: its journal
    // writes are refused, its ranks' store calls get UNAVAILABLE until they time out, and the job
    // restarts by its policy. One placed by this version is open already (etcd: one Txn that finds it).
    spdlog::warn("coordinator: job {} attempt {}: its rendezvous journal in {} could not be opened: {}",
                 job.id, job.attempt(), store_->path(), opened.to_string());
  }
  auto rendezvous = std::make_shared<Rendezvous>(job.id, job.attempt(), placement,
                                                 store_->rendezvous_journal(job.id, job.attempt()));
  StatusOr<RendezvousState> state = store_->load_rendezvous(job.id, job.attempt());
  Status restored = state.ok() ? rendezvous->restore(*state) : state.status();
  if (!restored.ok()) {
    // Ranks that join again still meet; only what they had already told each other is gone.
    spdlog::warn(
        "coordinator: job {} attempt {}: its rendezvous could not be restored from {}; it starts empty: {}",
        job.id, job.attempt(), store_->path(), restored.to_string());
  } else if (!state->empty()) {
    spdlog::info(
        "coordinator: job {} attempt {}: rendezvous restored from {} ({} of {} rank(s) joined, {} "
        "barrier(s) opened, {} store key(s))",
        job.id, job.attempt(), store_->path(), state->progress.joined.size(), placement.world_size(),
        state->progress.barrier_generation, state->data.size());
  }
  return rendezvous;
}

// ---- nodes ----

StatusOr<AgentOrders> Coordinator::register_node(NodeInfo info, const std::vector<RunningAttempt>& running,
                                                 AgentOrders* unsent) {
  COHORT_RETURN_IF_ERROR(NodeRegistry::validate(info));
  AgentOrders orders;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = register_node_locked(std::move(info), running, orders);
  }
  if (status.ok()) return orders;
  // A later write failed after earlier ones were stored (an exit taken, an attempt failed): the
  // stops those decided must still go out, or that attempt's tasks on other nodes run on.
  if (unsent != nullptr) *unsent = std::move(orders);
  return status;
}

Status Coordinator::register_node_locked(NodeInfo info, const std::vector<RunningAttempt>& running,
                                         AgentOrders& orders) {
  // Reconciliation may fail attempts; the agent registers again until the store takes writes.
  COHORT_RETURN_IF_ERROR(check_store_locked());
  const std::string id = info.node_id;
  const std::string address = info.address;
  // A node only restored from the store's records registers for the first time with this coordinator.
  const bool was_alive = nodes_.registered(id);
  // What the agent runs that is not ours (not placed on this node, or its ranks there already
  // counted as exited) is stopped: a fenced or partitioned agent may return with tasks of an
  // attempt that has since failed and been relaunched elsewhere. Attempts whose tasks there all
  // ended need nothing; what it reports of ours is accounted for below.
  std::map<AttemptKey, const RunningAttempt*> reported;
  for (const RunningAttempt& attempt : running) {
    const AttemptKey key{attempt.job_id, attempt.attempt};
    reported[key] = &attempt;
    if (attempt.ranks.empty() || has_live_rank_on_locked(key, id)) continue;
    spdlog::warn("coordinator: node {} still runs job {} attempt {}, which the coordinator no longer runs there; "
                 "stopping it",
                 id, attempt.job_id, attempt.attempt);
    orders.stops.push_back(StopOrder{id, address, attempt.job_id, attempt.attempt,
                                     fmt::format("node {} registered with job {} attempt {}, which is no longer "
                                                 "placed there (fencing)",
                                                 id, attempt.job_id, attempt.attempt)});
  }
  // Every rank this coordinator counts as live here is accounted for: still running (kept), exited
  // as the agent saw it (the exit may have happened while this coordinator restarted or took over,
  // with no report it heard of: taken now, code and all, so a failure is never lost and a finished
  // node is never taken for a lost one), or else lost with the tasks the agent no longer knows (it
  // restarted or forgot them). The exits and losses count without releasing slots: the node's
  // registration below starts from a clean record.
  std::vector<AttemptKey> placed_here;
  for (const auto& item : attempts_) {
    if (item.second.placement.find_node(id) != nullptr) placed_here.push_back(item.first);
  }
  std::set<AttemptKey> kept;
  for (const AttemptKey& key : placed_here) {
    const NodeAssignment node = *attempts_.at(key).placement.find_node(id);
    auto found = reported.find(key);
    const RunningAttempt* report = found != reported.end() ? found->second : nullptr;
    auto runs = [&](int rank) {
      return report != nullptr && std::find(report->ranks.begin(), report->ranks.end(), rank) != report->ranks.end();
    };
    for (const TaskExit& seen : report != nullptr ? report->exited : std::vector<TaskExit>()) {
      if (!node.holds_rank(seen.rank) || runs(seen.rank)) continue;
      auto it = attempts_.find(key);
      if (it == attempts_.end()) break;  // every rank accounted for
      if (it->second.live_ranks.count(seen.rank) == 0) continue;
      TaskExit exit = seen;
      exit.node_id = id;
      exit.job_id = key.first;
      exit.attempt = key.second;
      spdlog::info("coordinator: node {} registered with job {} attempt {}'s exit it had not heard of: {}", id,
                   key.first, key.second, describe_exit(exit));
      // Stored first: when the write fails, nothing here changed and the agent registers again.
      COHORT_RETURN_IF_ERROR(take_exit_locked(key, exit, /*node_is_gone=*/true, orders));
    }
    auto it = attempts_.find(key);
    if (it == attempts_.end()) continue;
    std::vector<int> lost_ranks;
    bool runs_here = false;
    for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
      if (it->second.live_ranks.count(rank) == 0) continue;
      if (runs(rank)) {
        runs_here = true;
      } else {
        lost_ranks.push_back(rank);
      }
    }
    if (!lost_ranks.empty()) {
      const bool fails = is_active_locked(key);
      const std::string reason =
          was_alive ? fmt::format("node {} re-registered without job {} attempt {}'s rank(s) {}: its agent restarted "
                                  "or stopped them",
                                  id, key.first, key.second, fmt::join(lost_ranks, ", "))
                    : fmt::format("the coordinator restarted and node {} registered without job {} attempt {}'s "
                                  "rank(s) {}: they no longer run there",
                                  id, key.first, key.second, fmt::join(lost_ranks, ", "));
      // Stored first: when the write fails, nothing here changed and the agent registers again.
      if (fails) COHORT_RETURN_IF_ERROR(record_attempt_failure_locked(jobs_.at(key.first), reason));
      for (int rank : lost_ranks) rank_exited_locked(key, rank, /*node_is_gone=*/true);
      if (fails) attempt_failed_locked(jobs_.at(key.first), key.second, reason, orders);
    }
    // Nothing of it here is unknown any more: after a restart the node counts as reconciled, whether
    // its ranks still run or ended.
    LiveAttempt& live = attempts_.at(key);
    if (live.reconcile_deadline.has_value()) {
      live.adopted_nodes.insert(id);
      if (live.adopted_nodes.size() == live.placement.nodes.size()) {
        live.reconcile_deadline.reset();
        spdlog::info("coordinator: job {} attempt {} re-adopted from its {} node(s) after a restart", key.first,
                     key.second, live.placement.nodes.size());
      }
    }
    if (runs_here) {
      kept.insert(key);
    } else {
      forget_if_drained_locked(key);
    }
  }
  COHORT_RETURN_IF_ERROR(nodes_.register_node(std::move(info), clock_->now()));
  sync_node_records_locked();
  // The kept attempts hold their slots on the new record, as when they were placed.
  for (const AttemptKey& key : kept) {
    LiveAttempt& live = attempts_.at(key);
    const NodeAssignment& node = *live.placement.find_node(id);
    Status reserved = nodes_.reserve(id, node.num_ranks, node.gpus);
    if (!reserved.ok()) {
      spdlog::error("coordinator: node {}: cannot reserve job {} attempt {}'s slots again: {}", id, key.first,
                    key.second, reserved.to_string());
    }
    live.started_nodes.insert(id);
    // A failed write leaves it PLACED; tick() retries once the store takes writes again.
    maybe_running_locked(key).ignore_error();
    if (is_active_locked(key)) continue;
    // Over (cancelled, failed, superseded by a restart) while its tasks here still run: the stop
    // sent when it ended may never have arrived, and nothing else would stop them. Its slots stay
    // held until their exits are reported.
    auto to_here = [&](const StopOrder& stop) {
      return stop.node_id == id && stop.job_id == key.first && stop.attempt == key.second;
    };
    if (std::any_of(orders.stops.begin(), orders.stops.end(), to_here)) continue;
    const Job& job = jobs_.at(key.first);
    const std::string why =
        job.attempt() != key.second
            ? fmt::format("job {} is at attempt {} now", key.first, job.attempt())
            : fmt::format("the job is {}: {}", job_state_name(job.state()), job.machine.reason());
    spdlog::warn("coordinator: node {} still runs job {} attempt {}, which is over ({}); stopping it", id, key.first,
                 key.second, why);
    orders.stops.push_back(StopOrder{
        id, address, key.first, key.second,
        fmt::format("node {} registered still running job {} attempt {}, which is over ({})", id, key.first,
                    key.second, why)});
  }
  spdlog::info("coordinator: node {} {} ({} running attempt(s) kept, {} stop order(s))", id,
               was_alive ? "registered again" : "registered", kept.size(), orders.stops.size());
  return Status();
}

void Coordinator::expire_unreconciled_locked(AgentOrders& orders) {
  const TimePoint now = clock_->now();
  std::vector<AttemptKey> expired;
  for (const auto& item : attempts_) {
    if (item.second.reconcile_deadline.has_value() && now >= *item.second.reconcile_deadline)
      expired.push_back(item.first);
  }
  for (const AttemptKey& key : expired) {
    LiveAttempt& live = attempts_.at(key);
    std::vector<const NodeAssignment*> missing;
    std::vector<std::string> missing_ids;
    for (const NodeAssignment& node : live.placement.nodes) {
      if (live.adopted_nodes.count(node.node_id) != 0) continue;
      missing.push_back(&node);
      missing_ids.push_back(node.node_id);
    }
    const bool fails = is_active_locked(key) && !missing.empty();
    const std::string reason = fmt::format(
        "the coordinator restarted and node(s) {} did not report attempt {}'s tasks within the reconcile window",
        fmt::join(missing_ids, ", "), key.second);
    // Stored first: when the write fails, the deadline stays and the next tick tries again.
    if (fails && !record_attempt_failure_locked(jobs_.at(key.first), reason).ok()) return;
    live.reconcile_deadline.reset();
    // Never registered since the restart: no slots are held for them (a restored node's reservation
    // goes when its agent registers, which starts a clean record, or when its lease ends).
    for (const NodeAssignment* node : missing) {
      for (int rank = node->first_rank; rank < node->first_rank + node->num_ranks; ++rank)
        rank_exited_locked(key, rank, /*node_is_gone=*/true);
    }
    if (fails) attempt_failed_locked(jobs_.at(key.first), key.second, reason, orders);
    forget_if_drained_locked(key);
  }
}

void Coordinator::expire_unstarted_locked(AgentOrders& orders) {
  const TimePoint now = clock_->now();
  std::vector<AttemptKey> expired;
  for (auto& item : attempts_) {
    LiveAttempt& live = item.second;
    if (!live.start_deadline.has_value()) continue;
    if (live.started_nodes.size() == live.placement.nodes.size()) {
      live.start_deadline.reset();  // every node started it
    } else if (now >= *live.start_deadline) {
      expired.push_back(item.first);
    }
  }
  for (const AttemptKey& key : expired) {
    LiveAttempt& live = attempts_.at(key);
    std::vector<NodeAssignment> missing;
    std::vector<std::string> missing_ids;
    for (const NodeAssignment& node : live.placement.nodes) {
      bool has_live_rank = false;
      for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank)
        has_live_rank = has_live_rank || live.live_ranks.count(rank) != 0;
      // A node whose ranks all exited (its launch failed, or was skipped) has nothing to report.
      if (live.started_nodes.count(node.node_id) != 0 || !has_live_rank) continue;
      missing.push_back(node);
      missing_ids.push_back(node.node_id);
    }
    live.start_deadline.reset();
    if (missing.empty()) continue;
    const bool fails = is_active_locked(key);
    const std::string reason = fmt::format(
        "node(s) {} did not report attempt {}'s tasks started within {} of its placement (the launch or its "
        "report was lost; see the coordinator's log for that node)",
        fmt::join(missing_ids, ", "), key.second, format_duration(options_.start_timeout));
    spdlog::warn("coordinator: job {}: {}", key.first, reason);
    // Stored first: when the write fails, nothing changed; the deadline is set again so that the
    // next tick once the store writes tries again.
    if (fails && !record_attempt_failure_locked(jobs_.at(key.first), reason).ok()) {
      live.start_deadline = now;
      continue;
    }
    // Stops to every node with live ranks, the missing ones included: their tasks may have started
    // after all, with only the report lost.
    if (fails) {
      attempt_failed_locked(jobs_.at(key.first), key.second, reason, orders);
    } else {
      for (const NodeAssignment& node : missing)
        orders.stops.push_back(StopOrder{node.node_id, node.address, key.first, key.second, reason});
    }
    // Their ranks count as exited, so their slots are free again (no exit report would ever come
    // for tasks that never started).
    for (const NodeAssignment& node : missing) {
      for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank)
        rank_exited_locked(key, rank, /*node_is_gone=*/false);
    }
    forget_if_drained_locked(key);
  }
}

Status Coordinator::heartbeat(const std::string& node_id, bool unschedulable) {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_.heartbeat(node_id, clock_->now(), unschedulable);
}

// Reconciliation on every heartbeat: the bounded StopTasks retries of the dispatch thread are the
// fast path; this is the backstop for a stop that never arrived while the node stays registered.
//
// Ordering, so that a launch in flight is never stopped (a heartbeat's list is the agent's
// snapshot at some time S, judged here under mu_ at a later time J):
//  - Only what the agent reported is judged, and nothing follows from what it left out. An attempt
//    this coordinator just PLACED, whose launch order has not reached the agent or is being carried
//    out there (the agent leaves launches under way out of its list), is not in the list, so it is
//    neither stopped nor taken for lost (the start deadline and the launch's own report cover that).
//  - A reported attempt that is active here (PLACED or RUNNING, a live rank on this node) is kept,
//    also when this node's "tasks started" report has not come yet: the agent may have started the
//    tasks and listed them before the dispatch thread got the LaunchTasks answer.
//  - Only judgments that are final whoever leads order a stop: the job is known and terminal, the
//    attempt is older than the job's current one, or the job is PLACED or RUNNING at the attempt and
//    none of its ranks placed on this node is live (the placement of an attempt never changes, and an
//    exited rank never becomes live again). A leader's records are what its store held, and a
//    successor only moves a job on from there, so whatever happened between S and J, and whoever
//    leads by then, those tasks must not run.
//  - Not final, so nothing is ordered: the job unknown, an attempt number beyond the job's current
//    one, or the job PENDING at the reported attempt. This coordinator never launches such an
//    attempt (it sends a launch only after the attempt is PLACED in memory, under mu_), but another
//    one may have: a deposed leader that has not yet noticed its lost lease (its gate still says
//    leading) answers a heartbeat that the agent's LeaderChannel sent it after one failed call to the
//    new leader, and what the new leader launched since (a new job, the next attempt, the placement
//    of a job PENDING here) is exactly what the deposed one does not know. Heartbeats write nothing,
//    so the store's fence would not catch such a stop. Tasks that really are no coordinator's (a
//    restored store, a job deleted after its retention) are stopped by the node's next registration
//    (register_node stops what is not its own), which every restored or restarted coordinator
//    makes each node do.
// HA: only a leader answers heartbeats (LeaderGate refuses standbys, and CoordinatorService drops the
// stops of a heartbeat during which this coordinator noticed it lost its leadership); a leader that
// has not noticed yet orders only the final stops above, which its successor would order too.
StatusOr<std::vector<StopOrder>> Coordinator::heartbeat(const std::string& node_id, bool unschedulable,
                                                        const std::vector<RunningAttempt>& running) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_RETURN_IF_ERROR(nodes_.heartbeat(node_id, clock_->now(), unschedulable));
  std::vector<StopOrder> stops;
  if (shutting_down_) return stops;
  for (const RunningAttempt& attempt : running) {
    if (attempt.ranks.empty()) continue;  // nothing of it runs there
    const AttemptKey key{attempt.job_id, attempt.attempt};
    const std::string why = over_on_node_locked(key, node_id);
    if (why.empty()) continue;
    // Info, not a warning: a heartbeat during an ordinary stop's grace period lands here too.
    spdlog::info("coordinator: node {}'s heartbeat reports job {} attempt {} running (rank(s) {}), which it must "
                 "not run: {}; stopping it",
                 node_id, key.first, key.second, fmt::join(attempt.ranks, ", "), why);
    stops.push_back(StopOrder{node_id, "", key.first, key.second,
                              fmt::format("node {} still runs job {} attempt {}: {}", node_id, key.first,
                                          key.second, why)});
  }
  return stops;
}

std::vector<NodeStatus> Coordinator::list_nodes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_.list();
}

// ---- jobs ----

JobSpecValidationOptions Coordinator::validation_options() const {
  JobSpecValidationOptions options;
  options.allowed_path_roots = options_.allowed_path_roots;
  options.allowed_commands = options_.allowed_commands;
  return options;
}

StatusOr<std::string> Coordinator::submit(const cohort::v1::JobSpec& spec, const std::string& owner) {
  COHORT_RETURN_IF_ERROR(validate_job_spec(spec, validation_options()));
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_)
    return unavailable_error("the coordinator is shutting down; submit again once it is back");
  if (draining_) {
    return unavailable_error(
        "the coordinator is draining (stopping on SIGTERM) and accepts no new jobs; submit again once it "
        "is back");
  }
  COHORT_RETURN_IF_ERROR(check_store_locked());
  Job job;
  job.seq = next_job_seq_++;
  job.id = fmt::format("{}-{}", spec.name(), job.seq);
  job.owner = owner;
  job.spec = spec;
  job.machine = JobStateMachine(spec.restart_policy().max_restarts());
  job.submit_unix_ms = clock_->unix_millis();

  JobEvent event;
  event.seq = next_event_seq_++;
  event.job_id = job.id;
  event.unix_ms = job.submit_unix_ms;
  event.change = JobTransition{JobState::kPending, JobState::kPending, job.attempt(), job.machine.reason()};
  // Durable before acknowledged: a job the client was told about survives a crash.
  Status stored = store_->save(job, event);
  if (!stored.ok()) {
    // No answer (an etcd write during a leader change: UNAVAILABLE or DEADLINE_EXCEEDED) does not
    // mean nothing was written. The client is told the submit failed and submits again, so a
    // record that did land must go: otherwise it loads as PENDING at the next start or takeover
    // and the job runs twice. Deleted now, or else before the store counts as writable again.
    if (stored.code() == StatusCode::kUnavailable || stored.code() == StatusCode::kDeadlineExceeded) {
      Status deleted = store_->delete_job(job.id);
      if (!deleted.ok()) {
        spdlog::warn("coordinator: job {}'s record may have been stored by a save that got no answer and "
                     "could not be deleted yet ({}); it is deleted before the store takes changes again",
                     job.id, deleted.to_string());
        unrecorded_jobs_.push_back(job.id);
      }
    }
    return store_failed_locked(stored.with_context(
        fmt::format("cannot record job {} (it was not submitted; submit it again)", job.id)));
  }
  COHORT_RETURN_IF_ERROR(scheduler_.enqueue(job.id, job.seq, request_of(job.spec)));
  const std::string id = job.id;
  jobs_.emplace(id, std::move(job));
  publish_locked(std::move(event));
  return id;
}

StatusOr<Job> Coordinator::get_job(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return not_found_error("no job '{}'; `cohort list` shows the known jobs", job_id);
  return it->second;
}

std::vector<Job> Coordinator::list_jobs() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Job> jobs;
  jobs.reserve(jobs_.size());
  for (const auto& item : jobs_) jobs.push_back(item.second);
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.seq < b.seq; });
  return jobs;
}

JobPage Coordinator::list_jobs_page(int64_t after_seq, size_t limit,
                                    const std::function<bool(const Job&)>& keep) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<const Job*> matching;
  for (const auto& item : jobs_) {
    const Job& job = item.second;
    if (job.seq > after_seq && (!keep || keep(job))) matching.push_back(&job);
  }
  std::sort(matching.begin(), matching.end(), [](const Job* a, const Job* b) { return a->seq < b->seq; });
  JobPage page;
  limit = std::max<size_t>(limit, 1);
  for (size_t i = 0; i < matching.size() && i < limit; ++i) page.jobs.push_back(*matching[i]);
  if (matching.size() > limit) page.next_after_seq = page.jobs.back().seq;
  return page;
}

namespace {

std::string format_bytes(int64_t bytes) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  return fmt::format("{:.1f} GiB ({} bytes)", static_cast<double>(bytes) / kGiB, bytes);
}

}  // namespace

Status Coordinator::check_capacity(const cohort::v1::JobSpec& spec, const CapacityRequest& request) const {
  const int64_t ranks_per_node = spec.procs_per_node();
  if (request.estimated_bytes_per_rank > kMaxEstimatedBytesPerRank) {
    return resource_exhausted_error(
        "the model needs an estimated {} per rank (parameters, gradients, optimizer state and "
        "activations of a batch), more than any rank may use: {} (kMaxEstimatedBytesPerRank in "
        "daemon/coordinator/coordinator.h); make the layers or batch_size smaller",
        format_bytes(request.estimated_bytes_per_rank), format_bytes(kMaxEstimatedBytesPerRank));
  }
  const std::vector<NodeStatus> nodes = list_nodes();
  const int64_t gpus_per_node = ranks_per_node * spec.gpus_per_proc();
  int qualifying = 0;
  int max_slots = 0;
  int64_t max_memory = 0;  // of the nodes that qualify
  for (const NodeStatus& node : nodes) {
    max_slots = std::max(max_slots, node.info.slots);
    if (node.info.slots < ranks_per_node || static_cast<int64_t>(node.info.gpus.size()) < gpus_per_node)
      continue;
    ++qualifying;
    max_memory = std::max(max_memory, node.info.memory_bytes);
  }
  if (!request.wait_for_capacity && qualifying < spec.nodes()) {
    const std::string gpus = gpus_per_node > 0 ? fmt::format(" and {} GPU(s)", gpus_per_node) : "";
    return resource_exhausted_error(
        "the job needs {} node(s) with {} slot(s){} each, but the cluster has {} live node(s), {} of them "
        "that large (the largest has {} slot(s)); lower nodes or procs_per_node, add nodes, or submit "
        "with --wait-for-capacity to queue it until enough nodes join",
        spec.nodes(), ranks_per_node, gpus, nodes.size(), qualifying, max_slots);
  }
  if (request.estimated_bytes_per_rank > 0 && max_memory > 0 &&
      request.estimated_bytes_per_rank * ranks_per_node > max_memory) {
    return resource_exhausted_error(
        "the job's {} rank(s) per node need an estimated {} each ({} together: parameters, gradients, "
        "optimizer state and activations of a batch), but the largest node that fits has {} of memory; "
        "make the model or batch_size smaller, or lower procs_per_node",
        ranks_per_node, format_bytes(request.estimated_bytes_per_rank),
        format_bytes(request.estimated_bytes_per_rank * ranks_per_node), format_bytes(max_memory));
  }
  return ok_status();
}

StatusOr<AgentOrders> Coordinator::cancel(const std::string& job_id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(job_id));
  COHORT_RETURN_IF_ERROR(check_store_locked());
  if (is_terminal(job->state())) {
    return failed_precondition_error("job {} already finished: {} ({})", job_id, job_state_name(job->state()),
                                     job->machine.reason());
  }
  const std::string why = reason.empty() ? "cancelled by a client" : reason;
  const AttemptKey key{job->id, job->attempt()};
  const JobState before = job->state();
  AgentOrders orders;
  COHORT_RETURN_IF_ERROR(
      transition_locked(*job, JobState::kCancelled, why, [](Job& next) { next.waiting_for.clear(); }));
  if (before == JobState::kPending) {
    scheduler_.remove(job_id);
  } else {
    stop_attempt_locked(key, cancelled_error("job {} was cancelled: {}", job_id, why), orders);
  }
  return orders;
}

AgentOrders Coordinator::remove_node(const std::string& node_id, const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  AgentOrders orders;
  if (!nodes_.remove(node_id)) return orders;
  spdlog::warn("coordinator: node {} removed: {}", node_id, reason);
  node_lost_locked(node_id, fmt::format("node {} removed: {}", node_id, reason), orders);
  // The node is no longer trusted: nothing is sent to it.
  auto to_node = [&](const auto& order) { return order.node_id == node_id; };
  orders.stops.erase(std::remove_if(orders.stops.begin(), orders.stops.end(), to_node), orders.stops.end());
  sync_node_records_locked();
  place_locked(orders);
  return orders;
}

AgentOrders Coordinator::tick() {
  std::lock_guard<std::mutex> lock(mu_);
  AgentOrders orders;
  if (shutting_down_) return orders;
  // Nothing changes while the store cannot be written; once it can, finish what was deferred.
  if (!retry_store_locked()) return orders;
  const std::map<std::string, std::string> deferred = std::move(lost_nodes_);
  lost_nodes_.clear();
  for (const auto& item : deferred) node_lost_locked(item.first, item.second, orders);
  for (const auto& item : attempts_) maybe_running_locked(item.first).ignore_error();
  for (const std::string& node_id : nodes_.expire(clock_->now())) {
    spdlog::warn("coordinator: node {} lost (no heartbeat for {})", node_id, format_duration(nodes_.lease()));
    node_lost_locked(
        node_id, fmt::format("node {} lost: no heartbeat for {}", node_id, format_duration(nodes_.lease())),
        orders);
  }
  expire_unreconciled_locked(orders);
  expire_unstarted_locked(orders);
  sync_node_records_locked();
  delete_expired_jobs_locked();
  place_locked(orders);
  return orders;
}

void Coordinator::sync_node_records_locked() {
  std::vector<std::string> gone;
  for (const auto& item : stored_nodes_) {
    if (!nodes_.contains(item.first)) gone.push_back(item.first);
  }
  Status failed = ok_status();
  for (const std::string& id : gone) {
    Status deleted = store_->delete_node(id);
    if (deleted.ok()) {
      stored_nodes_.erase(id);
    } else {
      failed = deleted.with_context("cannot delete the record of node " + id);
    }
  }
  for (const NodeStatus& node : nodes_.list()) {
    if (node.awaiting_registration) continue;  // its record is where it came from
    auto stored = stored_nodes_.find(node.info.node_id);
    if (stored != stored_nodes_.end() && stored->second == node.info) continue;
    Status written = store_->put_node(node.info);
    if (written.ok()) {
      stored_nodes_[node.info.node_id] = node.info;
    } else {
      failed = written.with_context("cannot store the record of node " + node.info.node_id);
    }
  }
  if (!failed.ok() && !node_sync_failing_) {
    spdlog::warn("coordinator: node records are behind the registry (tried again every tick; a coordinator "
                 "taking over meanwhile learns those nodes when their agents register): {}",
                 failed.to_string());
  }
  node_sync_failing_ = !failed.ok();
}

void Coordinator::delete_expired_jobs_locked() {
  const int64_t now_ms = clock_->unix_millis();
  std::vector<std::string> expired;
  for (const auto& [id, job] : jobs_) {
    if (!is_terminal(job.state()) || job.end_unix_ms == 0) continue;
    if (now_ms - job.end_unix_ms < options_.job_retention.count()) continue;
    // An attempt still draining holds slots and gets exit reports: keep the job until it is gone.
    const auto attempt = attempts_.lower_bound(AttemptKey{id, 0});
    if (attempt != attempts_.end() && attempt->first.first == id) continue;
    expired.push_back(id);
  }
  for (const std::string& id : expired) {
    if (Status deleted = store_->delete_job(id); !deleted.ok()) {
      spdlog::warn("coordinator: cannot delete job {} after its retention period: {}", id, deleted.to_string());
      continue;
    }
    jobs_.erase(id);
    job_events_.erase(id);
    spdlog::info("coordinator: deleted job {}: it ended more than {} ago (job_retention)", id,
                 format_duration(options_.job_retention));
  }
}

Status Coordinator::report_tasks_started(const std::string& node_id, const std::string& job_id, int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  nodes_.launch_succeeded(node_id);  // its agent answered a call: an unreachable streak ends
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(job_id));
  COHORT_RETURN_IF_ERROR(check_attempt_locked(*job, attempt));
  const AttemptKey key{job_id, attempt};
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return ok_status();  // the attempt is over; nothing to start
  if (it->second.placement.find_node(node_id) == nullptr) {
    return invalid_argument_error("job {} attempt {} has no tasks on node {} (its nodes: {})", job_id,
                                  attempt, node_id, it->second.placement.node_list());
  }
  it->second.started_nodes.insert(node_id);
  // The start is taken even when RUNNING cannot be stored now: tick() stores it once it can.
  maybe_running_locked(key).ignore_error();
  return ok_status();
}

StatusOr<AgentOrders> Coordinator::report_task_exit(const TaskExit& exit) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(exit.job_id));
  COHORT_RETURN_IF_ERROR(check_attempt_locked(*job, exit.attempt));
  // Refused (the agent reports it again) rather than taken without its transition.
  COHORT_RETURN_IF_ERROR(check_store_locked());
  AgentOrders orders;
  const AttemptKey key{exit.job_id, exit.attempt};
  auto it = attempts_.find(key);
  // Forgotten attempts (every rank accounted for, or from before a coordinator restart) need nothing.
  if (it == attempts_.end()) return orders;
  LiveAttempt& live = it->second;
  const NodeAssignment* node = live.placement.find_node(exit.node_id);
  if (node == nullptr || !node->holds_rank(exit.rank)) {
    const NodeAssignment* owner = live.placement.node_of_rank(exit.rank);
    return invalid_argument_error(
        "task exit report for job {} attempt {}: rank {} is not placed on node {} ({})", exit.job_id,
        exit.attempt, exit.rank, exit.node_id,
        owner != nullptr ? "it runs on node " + owner->node_id : "no such rank");
  }
  // A repeated report (or one the node's registration already carried) finds the rank exited.
  COHORT_RETURN_IF_ERROR(take_exit_locked(key, exit, /*node_is_gone=*/false, orders));
  return orders;
}

Status Coordinator::take_exit_locked(const AttemptKey& key, const TaskExit& exit, bool node_is_gone,
                                     AgentOrders& orders) {
  LiveAttempt& live = attempts_.at(key);
  if (live.live_ranks.count(exit.rank) == 0) return ok_status();
  Job& job = jobs_.at(key.first);
  // A task that exited had started, even if the agent's start report has not arrived yet.
  live.started_nodes.insert(exit.node_id);
  COHORT_RETURN_IF_ERROR(maybe_running_locked(key));
  // The transition is stored before the rank counts as exited: when the write fails, the report is
  // refused with nothing changed, and the agent's retry finds the rank still live.
  const bool active = is_active_locked(key);
  const bool fails = active && !exited_cleanly(exit);
  if (fails) {
    COHORT_RETURN_IF_ERROR(record_attempt_failure_locked(job, describe_exit(exit)));
  } else if (active && live.live_ranks.size() == 1) {
    COHORT_RETURN_IF_ERROR(
        transition_locked(job, JobState::kSucceeded,
                          fmt::format("all {} rank(s) exited with code 0", live.placement.world_size())));
  }
  rank_exited_locked(key, exit.rank, node_is_gone);
  if (fails) attempt_failed_locked(job, key.second, describe_exit(exit), orders);
  forget_if_drained_locked(key);
  return ok_status();
}

StatusOr<AgentOrders> Coordinator::report_launch_failure(const std::string& node_id,
                                                         const std::string& job_id, int attempt,
                                                         const std::string& error, LaunchFailure kind) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(job_id));
  COHORT_RETURN_IF_ERROR(check_attempt_locked(*job, attempt));
  // Needs no store write, and holds whatever becomes of the attempt: the next placement must not
  // pick a node whose agent just did not answer.
  if (kind == LaunchFailure::kUnreachable && nodes_.contains(node_id)) {
    std::string reason = fmt::format("its agent did not answer a launch (job {} attempt {}: {}); ", job_id,
                                     attempt, error);
    const Duration hold = NodeRegistry::suspect_hold(nodes_.unreachable_streak(node_id) + 1);
    if (hold > Duration(0)) {
      // The text is the listing's, so say why the heartbeats it still sends do not clear it.
      reason += fmt::format(
          "it did so again and again while its heartbeats arrive (a one-way partition?): schedulable again at its "
          "first heartbeat {} s from now, lost if none comes within its lease",
          std::chrono::duration_cast<std::chrono::seconds>(hold).count());
    } else {
      reason += "schedulable again at its next heartbeat, lost if none comes within its lease";
    }
    nodes_.mark_suspect(node_id, reason, clock_->now()).status().ignore_error();  // known: contains() above
    spdlog::warn("coordinator: node {} is suspect: {}", node_id, reason);
  }
  COHORT_RETURN_IF_ERROR(check_store_locked());
  AgentOrders orders;
  const AttemptKey key{job_id, attempt};
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return orders;  // the attempt is over
  const NodeAssignment* found = it->second.placement.find_node(node_id);
  if (found == nullptr) {
    return invalid_argument_error("job {} attempt {} has no tasks on node {} (its nodes: {})", job_id,
                                  attempt, node_id, it->second.placement.node_list());
  }
  const NodeAssignment node = *found;
  const bool fails = is_active_locked(key);
  const std::string reason = fmt::format("launching ranks {}..{} on node {} failed: {}", node.first_rank,
                                         node.first_rank + node.num_ranks - 1, node_id, error);
  if (fails) COHORT_RETURN_IF_ERROR(record_attempt_failure_locked(*job, reason));
  // Nothing started there, so the node's ranks are over now and its reservation is free again.
  for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
    rank_exited_locked(key, rank, /*node_is_gone=*/false);
  }
  if (fails) attempt_failed_locked(*job, attempt, reason, orders);
  forget_if_drained_locked(key);
  return orders;
}

Status Coordinator::report_launch_skipped(const std::string& node_id, const std::string& job_id,
                                          int attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(job_id));
  COHORT_RETURN_IF_ERROR(check_attempt_locked(*job, attempt));
  const AttemptKey key{job_id, attempt};
  if (is_active_locked(key)) {
    return failed_precondition_error("job {} attempt {} is still active: its launch on node {} must be sent",
                                     job_id, attempt, node_id);
  }
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return ok_status();  // already drained
  const NodeAssignment* found = it->second.placement.find_node(node_id);
  if (found == nullptr) {
    return invalid_argument_error("job {} attempt {} has no tasks on node {} (its nodes: {})", job_id,
                                  attempt, node_id, it->second.placement.node_list());
  }
  const NodeAssignment node = *found;
  for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
    rank_exited_locked(key, rank, /*node_is_gone=*/false);
  }
  forget_if_drained_locked(key);
  return ok_status();
}

void Coordinator::start_draining() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

Status Coordinator::report_metrics(const std::string& job_id, int attempt, const Metrics& metrics) {
  std::lock_guard<std::mutex> lock(mu_);
  COHORT_ASSIGN_OR_RETURN(Job * job, find_job_locked(job_id));
  COHORT_RETURN_IF_ERROR(check_attempt_locked(*job, attempt));
  // A superseded attempt's late report would mix two runs' numbers.
  if (attempt != job->attempt() || is_terminal(job->state())) return ok_status();
  COHORT_RETURN_IF_ERROR(check_store_locked());
  JobEvent event;
  event.seq = next_event_seq_++;
  event.job_id = job_id;
  event.unix_ms = clock_->unix_millis();
  event.kind = JobEvent::Kind::kMetrics;
  event.metrics = metrics;
  Status stored = store_->append_metrics(job_id, MetricsRecord{event.seq, attempt, event.unix_ms, metrics});
  // Not published either: watchers now and `cohort metrics` after a restart see one history.
  if (!stored.ok()) {
    return store_failed_locked(
        stored.with_context(fmt::format("cannot store job {}'s metrics report {}", job_id, event.seq)));
  }
  job->last_metrics = metrics;
  publish_locked(std::move(event));
  return ok_status();
}

StatusOr<std::vector<MetricsRecord>> Coordinator::metrics_history(const std::string& job_id, int64_t after_seq,
                                                                  int attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (jobs_.count(job_id) == 0) return not_found_error("no job '{}'", job_id);
  return store_->load_metrics(job_id, after_seq, attempt);
}

// ---- rendezvous and events ----

StatusOr<std::shared_ptr<Rendezvous>> Coordinator::rendezvous(const std::string& job_id, int attempt) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return not_found_error("no job '{}'", job_id);
  auto it = attempts_.find(AttemptKey{job_id, attempt});
  if (it == attempts_.end()) {
    return failed_precondition_error("job {} attempt {} has no rendezvous: the job is {} at attempt {} ({})",
                                     job_id, attempt, job_state_name(job->second.state()),
                                     job->second.attempt(), job->second.machine.reason());
  }
  return it->second.rendezvous;
}

StatusOr<std::vector<JobEvent>> Coordinator::events(const std::string& job_id, int64_t after_seq,
                                                    Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (jobs_.count(job_id) == 0) return not_found_error("no job '{}'", job_id);
  auto has_new = [&] {
    auto it = job_events_.find(job_id);
    return it != job_events_.end() && !it->second.empty() && it->second.back().seq > after_seq;
  };
  events_changed_.wait_until(lock, std::chrono::steady_clock::now() + timeout,
                             [&] { return shutting_down_ || has_new(); });
  if (shutting_down_)
    return unavailable_error("the coordinator is shutting down; watch again once it is back");
  std::vector<JobEvent> out;
  auto it = job_events_.find(job_id);
  if (it == job_events_.end()) return out;
  for (const JobEvent& event : it->second) {
    if (event.seq > after_seq) out.push_back(event);
  }
  return out;
}

void Coordinator::shutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  for (auto& item : attempts_) {
    item.second.rendezvous->close(unavailable_error("the coordinator is shutting down"));
  }
  // Metrics are written with the job's next state change; a job still running has had none since.
  for (const auto& item : jobs_) {
    const Job& job = item.second;
    if (is_terminal(job.state()) || !job.last_metrics) continue;
    Status stored = store_->upsert_job(job);
    if (!stored.ok())
      spdlog::error("coordinator: job {}: could not store its metrics: {}", job.id, stored.to_string());
  }
  events_changed_.notify_all();
}

// ---- internals (mu_ held) ----

StatusOr<Job*> Coordinator::find_job_locked(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return not_found_error("no job '{}'", job_id);
  return &it->second;
}

Status Coordinator::check_attempt_locked(const Job& job, int attempt) const {
  if (attempt < 1 || attempt > job.attempt()) {
    return invalid_argument_error("job {} has no attempt {}; its attempts are 1 .. {}", job.id, attempt,
                                  job.attempt());
  }
  return ok_status();
}

bool Coordinator::is_active_locked(const AttemptKey& key) const {
  auto it = jobs_.find(key.first);
  if (it == jobs_.end() || it->second.attempt() != key.second) return false;
  return it->second.state() == JobState::kPlaced || it->second.state() == JobState::kRunning;
}

bool Coordinator::has_live_rank_on_locked(const AttemptKey& key, const std::string& node_id) const {
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return false;
  const NodeAssignment* node = it->second.placement.find_node(node_id);
  if (node == nullptr) return false;
  for (int rank = node->first_rank; rank < node->first_rank + node->num_ranks; ++rank) {
    if (it->second.live_ranks.count(rank) != 0) return true;
  }
  return false;
}

std::string Coordinator::over_on_node_locked(const AttemptKey& key, const std::string& node_id) const {
  auto it = jobs_.find(key.first);
  // Unknown here, or newer than the attempt known here: perhaps another leader's launch (see above).
  if (it == jobs_.end() || key.second > it->second.attempt()) return "";
  const Job& job = it->second;
  if (key.second < job.attempt()) return fmt::format("job {} is at attempt {} now", key.first, job.attempt());
  if (is_terminal(job.state())) {
    return fmt::format("the job is {}: {}", job_state_name(job.state()), job.machine.reason());
  }
  // PENDING at this attempt: its placement may have been made by another leader (see above).
  if (!is_active_locked(key)) return "";
  if (!has_live_rank_on_locked(key, node_id)) {
    return fmt::format("none of its ranks placed on node {} counts as running any more (placed on {})", node_id,
                       job.placement.node_list());
  }
  return "";
}

Status Coordinator::record_locked(Job& job, Job next, const JobTransition& change) {
  COHORT_RETURN_IF_ERROR(check_store_locked());
  const int64_t now = clock_->unix_millis();
  if (change.to == JobState::kRunning) next.start_unix_ms = now;
  if (is_terminal(change.to)) next.end_unix_ms = now;
  JobEvent event;
  event.seq = next_event_seq_;
  event.job_id = next.id;
  event.unix_ms = now;
  event.change = change;
  Status stored = store_->save(next, event);
  if (!stored.ok()) {
    return store_failed_locked(stored.with_context(fmt::format("cannot record job {} attempt {}: {} -> {}",
                                                               job.id, change.attempt,
                                                               job_state_name(change.from),
                                                               job_state_name(change.to))));
  }
  ++next_event_seq_;
  job = std::move(next);
  spdlog::info("coordinator: job {} attempt {}: {} -> {}: {}", job.id, change.attempt,
               job_state_name(change.from), job_state_name(change.to), change.reason);
  publish_locked(std::move(event));
  return ok_status();
}

Status Coordinator::transition_locked(Job& job, JobState to, std::string reason,
                                      const std::function<void(Job&)>& edit) {
  Job next = job;
  StatusOr<JobTransition> change = next.machine.transition(to, std::move(reason));
  if (!change.ok()) {
    // Callers check the state first; reaching this is a coordinator bug, not a user error.
    spdlog::error("coordinator: job {}: {}", job.id, change.status().to_string());
    return internal_error("job {}: {}", job.id, change.status().message());
  }
  if (edit) edit(next);
  return record_locked(job, std::move(next), *change);
}

Status Coordinator::store_status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return check_store_locked();
}

Status Coordinator::check_store_locked() const {
  if (!store_failure_.has_value()) return ok_status();
  return unavailable_error(
      "the coordinator cannot write its job store ({}), so it accepts no job changes until a write "
      "succeeds again (it retries every {}); free space on or repair its data directory's disk, then "
      "try again",
      store_failure_->message(), format_duration(options_.store_retry_interval));
}

Status Coordinator::store_failed_locked(const Status& error) {
  if (!store_failure_.has_value()) {
    spdlog::error("coordinator: a job store write failed; accepting no job changes until a write succeeds "
                  "again (health NOT_SERVING): {}",
                  error.to_string());
  }
  store_failure_ = error;
  next_store_retry_ = clock_->now() + options_.store_retry_interval;
  return check_store_locked();
}

bool Coordinator::retry_store_locked() {
  if (!store_failure_.has_value()) return true;
  if (clock_->now() < next_store_retry_) return false;
  // The probe rewrites the newest job's record with what the store already holds: job records in
  // memory are exactly the stored ones (every change is written first), so it changes nothing but
  // proves that the store takes writes. With no job at all, no change can have been lost, and the
  // next write tests the store again.
  // First the records of refused submits that may have landed (see submit): the store is not
  // healthy while one could still load as a job nobody was told about.
  while (!unrecorded_jobs_.empty()) {
    Status deleted = store_->delete_job(unrecorded_jobs_.back());
    if (!deleted.ok()) {
      store_failure_ = deleted.with_context("deleting job " + unrecorded_jobs_.back() +
                                            ", whose submit was refused, from the store");
      next_store_retry_ = clock_->now() + options_.store_retry_interval;
      return false;
    }
    unrecorded_jobs_.pop_back();
  }
  const Job* probe = nullptr;
  for (const auto& item : jobs_) {
    if (probe == nullptr || item.second.seq > probe->seq) probe = &item.second;
  }
  Status written = probe != nullptr ? store_->upsert_job(*probe) : ok_status();
  if (!written.ok()) {
    store_failure_ = written.with_context("retrying a write");
    next_store_retry_ = clock_->now() + options_.store_retry_interval;
    return false;
  }
  spdlog::info("coordinator: the job store takes writes again; accepting job changes (health SERVING)");
  store_failure_.reset();
  return true;
}

void Coordinator::publish_locked(JobEvent event) {
  std::deque<JobEvent>& log = job_events_[event.job_id];
  log.push_back(std::move(event));
  while (log.size() > std::max<size_t>(options_.max_events_per_job, 1)) log.pop_front();
  events_changed_.notify_all();
}

void Coordinator::place_locked(AgentOrders& orders) {
  std::vector<NodeCapacity> capacity;
  for (const NodeStatus& node : nodes_.list()) {
    capacity.push_back(NodeCapacity{node.info.node_id, node.info.address, node.free_slots, node.free_gpus});
  }
  ScheduleResult result = scheduler_.schedule(std::move(capacity));
  bool store_failed = false;
  for (ScheduledJob& placed : result.placed) {
    Job& job = jobs_.at(placed.job_id);
    if (store_failed) {  // back in line, in its place (the queue is ordered by seq)
      scheduler_.enqueue(job.id, job.seq, request_of(job.spec)).ignore_error();
      continue;
    }
    // The scheduler placed onto the registry's own free capacity under this lock, so reserving
    // cannot fail; if it ever does, undo and re-queue rather than over-commit a node.
    std::vector<const NodeAssignment*> reserved;
    Status status;
    for (const NodeAssignment& node : placed.placement.nodes) {
      status = nodes_.reserve(node.node_id, node.num_ranks, node.gpus);
      if (!status.ok()) break;
      reserved.push_back(&node);
    }
    if (!status.ok()) {
      spdlog::error("coordinator: job {}: placement could not be reserved: {}", job.id, status.to_string());
      for (const NodeAssignment* node : reserved) nodes_.release(node->node_id, node->num_ranks, node->gpus);
      scheduler_.enqueue(job.id, job.seq, request_of(job.spec)).ignore_error();
      continue;
    }

    const AttemptKey key{job.id, job.attempt()};
    LiveAttempt live;
    live.placement = placed.placement;
    for (const NodeAssignment& node : live.placement.nodes) {
      for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank)
        live.live_ranks.insert(rank);
    }
    Status stored = transition_locked(
        job, JobState::kPlaced,
        fmt::format("placed {} rank(s) on {}", live.placement.world_size(), live.placement.node_list()),
        [&live](Job& next) {
          next.placement = live.placement;
          next.waiting_for.clear();
        });
    if (!stored.ok()) {
      // Not placed after all: the reservation is undone and the job waits in line for the store.
      for (const NodeAssignment& node : live.placement.nodes)
        nodes_.release(node.node_id, node.num_ranks, node.gpus);
      scheduler_.enqueue(job.id, job.seq, request_of(job.spec)).ignore_error();
      store_failed = true;
      continue;
    }
    live.rendezvous = std::make_shared<Rendezvous>(job.id, job.attempt(), live.placement,
                                                   store_->rendezvous_journal(job.id, job.attempt()));
    live.start_deadline = clock_->now() + options_.start_timeout;
    for (const NodeAssignment& node : live.placement.nodes) {
      LaunchOrder launch;
      launch.job_id = job.id;
      launch.attempt = job.attempt();
      launch.node = node;
      launch.world_size = live.placement.world_size();
      launch.num_nodes = static_cast<int>(live.placement.nodes.size());
      launch.master_address = live.rendezvous->master_address();
      launch.spec = job.spec;
      orders.launches.push_back(std::move(launch));
    }
    attempts_.emplace(key, std::move(live));
  }
  // What the head waits for includes the nodes it may not use now, so `cohort status` explains
  // why a job waits while `cohort nodes` lists enough nodes.
  std::string unusable;
  for (const NodeStatus& node : nodes_.list()) {
    if (node.schedulable()) continue;
    const std::string why =
        !node.suspect_reason.empty() ? "suspect: " + node.suspect_reason
        : node.unschedulable         ? std::string("draining")
                                     : std::string("restored from the job store, waiting for its agent to register");
    unusable += fmt::format("; node {} is {}", node.info.node_id, why);
  }
  for (const std::string& id : scheduler_.queued()) {
    if (store_failed) {
      jobs_.at(id).waiting_for = "the coordinator cannot write its job store; placement resumes once it can";
      continue;
    }
    jobs_.at(id).waiting_for =
        id == result.blocked_job_id
            ? result.blocked_reason + unusable
            : fmt::format("queued behind job {} (first in line)", result.blocked_job_id);
  }
}

Status Coordinator::fail_attempt_locked(Job& job, const std::string& reason, AgentOrders& orders) {
  const int attempt = job.attempt();
  COHORT_RETURN_IF_ERROR(record_attempt_failure_locked(job, reason));
  attempt_failed_locked(job, attempt, reason, orders);
  return ok_status();
}

Status Coordinator::record_attempt_failure_locked(Job& job, const std::string& reason) {
  Job next = job;
  StatusOr<JobTransition> change = next.machine.fail_attempt(reason);
  if (!change.ok()) {
    spdlog::error("coordinator: job {}: {}", job.id, change.status().to_string());
    return internal_error("job {}: {}", job.id, change.status().message());
  }
  return record_locked(job, std::move(next), *change);
}

void Coordinator::attempt_failed_locked(Job& job, int attempt, const std::string& reason,
                                        AgentOrders& orders) {
  const AttemptKey key{job.id, attempt};
  stop_attempt_locked(key, aborted_error("job {} attempt {} failed: {}", key.first, key.second, reason),
                      orders);
  if (job.state() == JobState::kPending) {
    Status queued = scheduler_.enqueue(job.id, job.seq, request_of(job.spec));
    if (!queued.ok()) spdlog::error("coordinator: job {}: cannot re-queue: {}", job.id, queued.to_string());
  }
}

void Coordinator::stop_attempt_locked(const AttemptKey& key, const Status& why, AgentOrders& orders) {
  auto it = attempts_.find(key);
  if (it == attempts_.end()) return;
  LiveAttempt& live = it->second;
  // Wake every rank blocked in join, barrier or a store wait: their peers are going away.
  live.rendezvous->close(why);
  for (const NodeAssignment& node : live.placement.nodes) {
    bool has_live_rank = false;
    for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
      has_live_rank = has_live_rank || live.live_ranks.count(rank) != 0;
    }
    if (has_live_rank)
      orders.stops.push_back(StopOrder{node.node_id, node.address, key.first, key.second, why.message()});
  }
}

void Coordinator::node_lost_locked(const std::string& node_id, const std::string& reason,
                                   AgentOrders& orders) {
  std::vector<AttemptKey> affected;
  for (const auto& item : attempts_) {
    if (item.second.placement.find_node(node_id) != nullptr) affected.push_back(item.first);
  }
  for (const AttemptKey& key : affected) {
    const NodeAssignment node = *attempts_.at(key).placement.find_node(node_id);
    const bool fails = is_active_locked(key);
    if (fails && !record_attempt_failure_locked(jobs_.at(key.first), reason).ok()) {
      // Finished by tick() once the store takes writes (this function is idempotent).
      lost_nodes_.emplace(node_id, reason);
      return;
    }
    // Its ranks are gone with it; marking them before the stops keeps orders away from the dead node.
    for (int rank = node.first_rank; rank < node.first_rank + node.num_ranks; ++rank) {
      rank_exited_locked(key, rank, /*node_is_gone=*/true);
    }
    if (fails) attempt_failed_locked(jobs_.at(key.first), key.second, reason, orders);
    forget_if_drained_locked(key);
  }
}

void Coordinator::rank_exited_locked(const AttemptKey& key, int rank, bool node_is_gone) {
  LiveAttempt& live = attempts_.at(key);
  if (live.live_ranks.erase(rank) == 0) return;
  const NodeAssignment* node = live.placement.node_of_rank(rank);
  if (node == nullptr || node_is_gone) return;  // a gone node's capacity left with it
  for (int r = node->first_rank; r < node->first_rank + node->num_ranks; ++r) {
    if (live.live_ranks.count(r) != 0) return;
  }
  // The node's last rank of this attempt exited: its slots and GPUs are free for the next job.
  nodes_.release(node->node_id, node->num_ranks, node->gpus);
}

void Coordinator::forget_if_drained_locked(const AttemptKey& key) {
  auto it = attempts_.find(key);
  if (it == attempts_.end() || !it->second.live_ranks.empty()) return;
  const Job& job = jobs_.at(key.first);
  it->second.rendezvous->close(aborted_error("job {} attempt {} is over (the job is {})", key.first,
                                             key.second, job_state_name(job.state())));
  attempts_.erase(it);
}

Status Coordinator::maybe_running_locked(const AttemptKey& key) {
  if (!is_active_locked(key)) return ok_status();
  Job& job = jobs_.at(key.first);
  const LiveAttempt& live = attempts_.at(key);
  if (job.state() != JobState::kPlaced || live.started_nodes.size() != live.placement.nodes.size())
    return ok_status();
  return transition_locked(job, JobState::kRunning,
                           fmt::format("all {} rank(s) started on {} node(s)", live.placement.world_size(),
                                       live.placement.nodes.size()));
}

}  // namespace cohort::coordinator
