#pragma once

// LeaderElection: one coordinator among several leads, chosen by etcd's election API under a lease
// (Kubernetes' and etcd's own pattern). Each candidate holds a lease of `lease_ttl`, renewed by a
// keep-alive thread, and campaigns under `name` with its advertised address as the value; etcd
// makes the oldest candidate the leader. The leader's key lives as long as its lease: a leader
// that dies, or cannot reach etcd, loses it within the TTL, and the next candidate leads.
//
//   LeaderElectionOptions options;
//   options.name = "/cohort/leader";
//   options.value = "10.0.0.5:7070";                 // what standbys point clients to
//   options.on_elected = [&](const etcd::LeaderKey& key) { coordinator.become_leader(key); };
//   options.on_lost = [&](const Status& why) { coordinator.step_down(why); };
//   LeaderElection election(client, options);
//   election.start();
//
// Stepping down: the keep-alive thread renews every lease_ttl/4. A leader whose last successful
// renewal is older than lease_ttl - lease_ttl/4 (etcd unreachable, partitioned, too slow) steps
// down *before* etcd can expire its lease and elect another, so two coordinators never both believe
// they lead for longer than clock skew; a renewal that reports the lease gone steps down at once.
// The job store fences writes on the leader key's create revision (EtcdClient::leader_compare) as
// well, so a deposed leader's late write fails in etcd instead of overwriting its successor's.
//
// Callbacks run on the election's own threads, never under its lock; they must not call stop().
// Every public method is thread-safe and non-blocking, except stop() (joins the threads, bounded
// by the client's call timeout) and wait_until_leader() (bounded by its timeout).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd {

// The default lease: a dead leader is replaced within about this long.
inline constexpr std::chrono::seconds kDefaultLeaderLeaseTtl{5};
// The election's key prefix when a config names none.
inline constexpr const char* kDefaultElectionName = "/cohort/election";

struct LeaderElectionOptions {
  std::string name = kDefaultElectionName;                  // the election's key prefix in etcd
  std::string value;                                        // this candidate's advertised HOST:PORT
  std::chrono::seconds lease_ttl = kDefaultLeaderLeaseTtl;  // lease of the candidacy (>= 2 s)
  std::function<void(const LeaderKey&)> on_elected;         // this candidate now leads (optional)
  std::function<void(const Status&)> on_lost;               // it no longer does, and why (optional)
  // Called when the known leader's address changes ("" when none leads); optional.
  std::function<void(const std::string&)> on_leader_changed;
};

class LeaderElection {
 public:
  // `client` must outlive this object.
  LeaderElection(EtcdClient* client, LeaderElectionOptions options);
  ~LeaderElection();  // stop()
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  // Starts campaigning (threads). INVALID_ARGUMENT for an empty value or name, or lease_ttl < 2 s;
  // FAILED_PRECONDITION when already started.
  Status start();
  // Stops campaigning: a leader resigns (the next candidate leads at once, not after the TTL) and
  // the lease is revoked. Idempotent. Blocks until the threads are joined.
  void stop();

  bool is_leader() const;
  // The leader key while this candidate leads (its `rev` is the fencing token), else nullopt.
  std::optional<LeaderKey> leadership() const;
  // The current leader's advertised address as last seen ("" when unknown or none): this
  // candidate's own value while it leads.
  std::string leader_address() const;
  // Blocks until this candidate leads or `timeout` passes; true if it leads.
  bool wait_until_leader(std::chrono::milliseconds timeout) const;
  // How many times this candidate has won (tests).
  int terms() const;

 private:
  void campaign_loop();
  void keep_alive_loop();
  void set_leader_address(const std::string& address);
  void step_down(const Status& why);
  // Sleeps up to `duration` unless stop() is called; false when stopping.
  bool sleep_unless_stopped(std::chrono::milliseconds duration);

  EtcdClient* const client_;
  const LeaderElectionOptions options_;

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  bool started_ = false;
  bool stopping_ = false;
  int64_t lease_ = 0;  // the lease of the current candidacy (0: none)
  std::chrono::steady_clock::time_point last_renewal_;
  std::optional<LeaderKey> leadership_;
  std::string leader_address_;
  int terms_ = 0;
  CallCanceller campaign_canceller_;
  CallCanceller keep_alive_canceller_;  // cancelled by stop(): ends a renewal in flight
  // The etcd member (EtcdClient::preferred_member) the campaign in flight waits on; none between
  // campaigns.
  std::optional<size_t> campaign_member_;
  std::thread campaign_thread_;
  std::thread keep_alive_thread_;
};

}  // namespace cohort::etcd
