#include "daemon/etcd/leader_election.h"

#include <algorithm>
#include <utility>

#include <spdlog/spdlog.h>

namespace cohort::etcd {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// One Campaign call's bound. A candidate still waiting then campaigns again (its key is dropped
// and written anew, so it goes to the back of the queue, which only reorders standbys).
constexpr milliseconds kCampaignRoundTimeout{60000};
// Pause after a failed lease grant or campaign (etcd unreachable) before the next try.
constexpr milliseconds kRetryPause{500};
// What stop() gives etcd to take the resignation and the lease revocation (shared by the members:
// a hung one cannot take it all). A daemon stopping while etcd is gone or cut off must not wait
// out the whole call timeout for each (the HA chaos test saw coordinators still draining 3 s after
// SIGTERM); a resignation that does not land costs the standby at most one lease TTL.
constexpr milliseconds kStopBudget{1500};

}  // namespace

LeaderElection::LeaderElection(EtcdClient* client, LeaderElectionOptions options)
    : client_(client), options_(std::move(options)) {}

LeaderElection::~LeaderElection() { stop(); }

Status LeaderElection::start() {
  if (options_.name.empty())
    return invalid_argument_error("leader election: the election name (key prefix) is empty");
  if (options_.value.empty()) {
    return invalid_argument_error(
        "leader election '{}': this candidate's value (its advertised address) is empty", options_.name);
  }
  if (options_.lease_ttl < std::chrono::seconds(2)) {
    return invalid_argument_error("leader election '{}': lease_ttl {} s is below the minimum of 2 s",
                                  options_.name, options_.lease_ttl.count());
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (started_) return failed_precondition_error("leader election '{}' already started", options_.name);
  started_ = true;
  campaign_thread_ = std::thread([this] { campaign_loop(); });
  keep_alive_thread_ = std::thread([this] { keep_alive_loop(); });
  return ok_status();
}

void LeaderElection::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  changed_.notify_all();
  campaign_canceller_.cancel();
  // A renewal in flight to a hung member would hold the join below for up to the call timeout.
  keep_alive_canceller_.cancel();
  if (campaign_thread_.joinable()) campaign_thread_.join();
  if (keep_alive_thread_.joinable()) keep_alive_thread_.join();
}

bool LeaderElection::is_leader() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return leadership_.has_value();
}

std::optional<LeaderKey> LeaderElection::leadership() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return leadership_;
}

std::string LeaderElection::leader_address() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return leader_address_;
}

int LeaderElection::terms() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return terms_;
}

bool LeaderElection::wait_until_leader(milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return leadership_.has_value() || stopping_; }) &&
         leadership_.has_value();
}

bool LeaderElection::sleep_unless_stopped(milliseconds duration) {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, duration, [&] { return stopping_; });
  return !stopping_;
}

void LeaderElection::set_leader_address(const std::string& address) {
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    changed = leader_address_ != address;
    leader_address_ = address;
  }
  if (changed && options_.on_leader_changed) options_.on_leader_changed(address);
}

void LeaderElection::step_down(const Status& why) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!leadership_) return;
    leadership_.reset();
    leader_address_.clear();
  }
  changed_.notify_all();
  spdlog::warn("leader election '{}': {} steps down: {}", options_.name, options_.value, why.to_string());
  if (options_.on_lost) options_.on_lost(why);
  if (options_.on_leader_changed) options_.on_leader_changed("");
}

void LeaderElection::campaign_loop() {
  const milliseconds interval = std::chrono::duration_cast<milliseconds>(options_.lease_ttl) / 4;
  // A leader steps down once its lease may be no more than one renewal interval from expiring.
  const milliseconds step_down_after =
      std::chrono::duration_cast<milliseconds>(options_.lease_ttl) - interval;
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
    }
    const Clock::time_point requested = Clock::now();  // the TTL runs from no earlier than this
    StatusOr<int64_t> lease = client_->lease_grant(options_.lease_ttl);
    if (!lease.ok()) {
      spdlog::warn("leader election '{}': cannot get a lease: {}", options_.name, lease.status().to_string());
      if (!sleep_unless_stopped(kRetryPause)) break;
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) break;
      lease_ = *lease;
      last_renewal_ = requested;
    }
    campaign_canceller_.reset();
    std::optional<LeaderKey> won;
    std::optional<Clock::time_point> stop_deadline;  // set once stop() is seen: resign + revoke share it
    while (!won) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (stopping_ || lease_ != *lease) break;  // stopping, or the keep-alive lost this lease
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        campaign_member_ = client_->preferred_member();
      }
      StatusOr<LeaderKey> key = client_->campaign(options_.name, *lease, options_.value,
                                                  kCampaignRoundTimeout, &campaign_canceller_);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        campaign_member_.reset();
      }
      if (key.ok()) {
        // etcd's Campaign returns once every older candidate is gone; this candidate's own key
        // may have expired meanwhile (its lease lost while it waited): check that it still exists.
        StatusOr<RangeResult> own = client_->range(key->key);
        if (own.ok() && !own->kvs.empty() && own->kvs.front().create_revision == key->rev) {
          won = *key;
        } else {
          spdlog::warn("leader election '{}': won, but the candidate key {} is gone ({}); campaigning again",
                       options_.name, key->key, own.status().to_string());
          break;
        }
      } else if (key.status().code() != StatusCode::kDeadlineExceeded) {
        if (key.status().code() != StatusCode::kCancelled) {
          spdlog::warn("leader election '{}': campaign failed: {}", options_.name, key.status().to_string());
        }
        if (!sleep_unless_stopped(kRetryPause)) break;
        campaign_canceller_.reset();
      }
    }
    if (won) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!stopping_ && lease_ == *lease) {
          leadership_ = *won;
          leader_address_ = options_.value;
          ++terms_;
        } else {
          won.reset();
        }
      }
      if (won) {
        changed_.notify_all();
        spdlog::info("leader election '{}': {} leads (key {}, revision {})", options_.name, options_.value,
                     won->key, won->rev);
        if (options_.on_elected) options_.on_elected(*won);
        if (options_.on_leader_changed) options_.on_leader_changed(options_.value);
        // Lead until stopped, the lease is lost, or it has not been renewed for too long.
        std::unique_lock<std::mutex> lock(mutex_);
        while (!stopping_ && leadership_) {
          // Wake at the step-down deadline itself, not only every renewal interval: checking once
          // per interval let a leader whose renewals stopped lead up to the whole TTL, as long as
          // etcd keeps its lease (the HA chaos test measured 3 s against 2.25 s designed).
          changed_.wait_until(lock, std::min(Clock::now() + interval, last_renewal_ + step_down_after));
          if (!leadership_ || stopping_) break;
          const auto since_renewal = std::chrono::duration_cast<milliseconds>(Clock::now() - last_renewal_);
          if (lease_ != *lease || since_renewal >= step_down_after) {
            lock.unlock();
            step_down(unavailable_error("the etcd lease was not renewed for {} ms (lease TTL {} s)",
                                        since_renewal.count(), options_.lease_ttl.count()));
            lock.lock();
          }
        }
        const bool stopping_now = stopping_;
        lock.unlock();
        if (stopping_now) {
          // Resign so the next candidate leads now rather than after the TTL.
          stop_deadline = Clock::now() + kStopBudget;
          Status resigned = client_->resign(*won, kStopBudget);
          if (!resigned.ok())
            spdlog::warn("leader election '{}': resign: {}", options_.name, resigned.to_string());
          step_down(cancelled_error("leader election stopped"));
        }
      }
    }
    // This candidacy is over (stopped, lost, or its lease expired): drop its lease.
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (lease_ == *lease) lease_ = 0;
    }
    bool stopping_now = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_now = stopping_;
    }
    if (!stopping_now) {
      client_->lease_revoke(*lease).ignore_error();  // gone already if it expired
    } else {
      // What is left of kStopBudget after the resignation; etcd drops the lease after its TTL anyway.
      if (!stop_deadline) stop_deadline = Clock::now() + kStopBudget;
      const auto left = std::chrono::duration_cast<milliseconds>(*stop_deadline - Clock::now());
      if (left > milliseconds(0)) {
        client_->lease_revoke(*lease, left).ignore_error();
      } else {
        spdlog::warn("leader election '{}': stopping without revoking lease {:x} (etcd did not answer within {} "
                     "ms); it expires after its TTL of {} s",
                     options_.name, *lease, kStopBudget.count(), options_.lease_ttl.count());
      }
    }
  }
}

void LeaderElection::keep_alive_loop() {
  const milliseconds interval = std::chrono::duration_cast<milliseconds>(options_.lease_ttl) / 4;
  while (sleep_unless_stopped(interval)) {
    int64_t lease = 0;
    bool leading = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      lease = lease_;
      leading = leadership_.has_value();
    }
    if (lease != 0) {
      // etcd restarts the TTL when the keep-alive reaches it, no earlier than it was sent: count
      // from the send, so a slow answer never stretches the time this leader believes it has.
      const Clock::time_point sent = Clock::now();
      StatusOr<std::chrono::seconds> ttl = client_->lease_keep_alive_once(lease, &keep_alive_canceller_);
      if (ttl.ok()) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (lease_ == lease) last_renewal_ = sent;
        // A standby's campaign waits on one member. When the renewal had to go to another, that
        // one stopped answering (cut off from the others with the leader, or hung), and the
        // campaign would not learn that the leader's key is gone until it answers again: the
        // chaos test saw a takeover wait for the partition's heal. Start over through a member
        // that answers, with a new lease (so a new key): etcd resigns a cancelled campaign's key
        // when its member hears of the cancel, which may come after the same key was reused.
        if (!leading && lease_ == lease && campaign_member_.has_value() &&
            *campaign_member_ != client_->preferred_member()) {
          spdlog::warn("leader election '{}': {}'s campaign waits on etcd member {}, which stopped answering; "
                       "campaigning again through member {} with a new lease",
                       options_.name, options_.value, client_->options().endpoints[*campaign_member_],
                       client_->options().endpoints[client_->preferred_member()]);
          lease_ = 0;
          campaign_canceller_.cancel();
        }
      } else if (ttl.status().code() == StatusCode::kNotFound) {
        // etcd says the lease is gone: whatever this candidate held under it is gone too.
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (lease_ == lease) lease_ = 0;
        }
        if (leading) {
          step_down(ttl.status());
        } else {
          campaign_canceller_.cancel();
        }
        changed_.notify_all();
      } else {
        spdlog::warn("leader election '{}': lease renewal failed: {}", options_.name,
                     ttl.status().to_string());
        std::lock_guard<std::mutex> lock(mutex_);
        // A standby whose lease has surely expired starts over with a new one (the leader's own
        // loop steps down on the same clock).
        if (!leading && lease_ == lease && Clock::now() - last_renewal_ >= options_.lease_ttl) {
          lease_ = 0;
          campaign_canceller_.cancel();
        }
      }
    }
    if (!leading) {
      // Standbys learn who leads, so they can point clients there.
      StatusOr<std::optional<KeyValue>> current = client_->leader(options_.name, &keep_alive_canceller_);
      if (current.ok()) set_leader_address(current->has_value() ? (*current)->value : "");
    }
  }
}

}  // namespace cohort::etcd
