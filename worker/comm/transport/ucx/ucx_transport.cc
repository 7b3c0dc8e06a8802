#include "worker/comm/transport/ucx/ucx_transport.h"

#include <sched.h>

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

#include <ucp/api/ucp.h>

#include "worker/base/process_liveness.h"
#include "worker/comm/transport/ucx/ucx_check.h"

namespace cohort::comm {
namespace {

// Wire tag layout: the cohort tag above, the source rank in the low bits. Receives match the
// whole tag, so a message is only ever matched by a receive for its source and cohort tag.
constexpr int kRankBits = 64 - kTransportTagBits;
constexpr int64_t kMaxRanks = int64_t{1} << kRankBits;
constexpr ucp_tag_t kFullTagMask = ~ucp_tag_t{0};

// Most progress calls that drain arrived messages once a peer is found dead.
constexpr int kDrainProgressCalls = 64;
// A published worker address starts with the publisher's identity (ProcessIdentity): pid (int64),
// start time, pid namespace inode (uint64 each), then its boot id, NUL-padded to kBootIdBytes.
constexpr size_t kBootIdBytes = 40;
constexpr size_t kIdentityBytes = 24 + kBootIdBytes;

std::string encode_identity(const ProcessIdentity& process) {
  std::string out(kIdentityBytes, '\0');
  const int64_t pid = process.pid;
  std::memcpy(out.data(), &pid, sizeof(pid));
  std::memcpy(out.data() + 8, &process.start_time, sizeof(uint64_t));
  std::memcpy(out.data() + 16, &process.pid_namespace, sizeof(uint64_t));
  std::memcpy(out.data() + 24, process.boot_id.data(), std::min(process.boot_id.size(), kBootIdBytes));
  return out;
}

ProcessIdentity decode_identity(const std::string& in) {
  ProcessIdentity process;
  int64_t pid = 0;
  std::memcpy(&pid, in.data(), sizeof(pid));
  process.pid = static_cast<int>(pid);
  std::memcpy(&process.start_time, in.data() + 8, sizeof(uint64_t));
  std::memcpy(&process.pid_namespace, in.data() + 16, sizeof(uint64_t));
  process.boot_id.assign(in.data() + 24, strnlen(in.data() + 24, kBootIdBytes));
  return process;
}

ucp_tag_t wire_tag(uint64_t tag, int source) { return (tag << kRankBits) | static_cast<ucp_tag_t>(source); }

// UCX wants a valid pointer even for zero-byte messages.
char zero_byte_buffer[1];

const char* direction(bool is_send) { return is_send ? "send to" : "receive from"; }

// The idle-progress thread's longest period once a rank has been quiet for a while: cheap
// (~30 wakeups a second) and still well inside the keepalive interval.
constexpr Duration kMaxIdleProgressPeriod = std::chrono::milliseconds(32);

// Sets UCX configuration `name` (without the UCX_ prefix) unless UCX_<name> is in the environment.
Status set_unless_in_environment(ucp_config_t* config, const std::string& name, const std::string& value) {
  if (std::getenv(("UCX_" + name).c_str()) != nullptr) return ok_status();
  return COHORT_UCX_CHECK(ucp_config_modify(config, name.c_str(), value.c_str()));
}

// CMA cannot revoke a peer's access to a buffer after a failure (UCX's "memory invalidate"), so
// UCX 1.13 keeps it off endpoints with peer error handling unless told it may. We tell it: a
// transfer is only taken back from UCX once its endpoint is closed (the peer died, or cancel()
// disconnected it), so the residual risk, a disconnected but live peer reading a buffer its owner
// gave up on (UCX's rendezvous over CMA is a GET by the receiver), is accepted for single-copy
// rendezvous. UCX reads this memory-domain setting only
// from the environment (ucp_config_modify does not reach it), so it is exported once per process,
// before the first context; an explicit UCX_CMA_MEMORY_INVALIDATE wins. glibc's setenv never
// frees an environment array another thread may be reading.
void export_cma_memory_invalidate() {
  static std::once_flag once;
  std::call_once(once, [] { ::setenv("UCX_CMA_MEMORY_INVALIDATE", "y", /*overwrite=*/0); });
}

}  // namespace

// One send or receive. While UCX owns it (request_ set), the work keeps itself alive through
// self_ and sits in its peer's in-flight list; both are guarded by the engine's mutex. The result
// is written once, before done_ is released, so waiters that see done_ read it without the lock.
class UcxWork final : public TransportWork {
 public:
  UcxWork(std::shared_ptr<UcxEngine> engine, int peer, uint64_t tag, bool is_send, size_t bytes)
      : engine_(std::move(engine)), peer_(peer), tag_(tag), is_send_(is_send), bytes_(bytes) {}

  using TransportWork::wait;
  Status wait(Duration timeout) override;
  bool is_completed() override;
  Status error() override { return done() ? result_ : ok_status(); }
  void cancel(Status reason) override;
  size_t received_bytes() const override { return done() ? received_ : 0; }

 private:
  friend class UcxEngine;

  bool done() const { return done_.load(std::memory_order_acquire); }
  void finish(Status result, size_t received) {
    result_ = std::move(result);
    received_ = received;
    done_.store(true, std::memory_order_release);
  }

  const std::shared_ptr<UcxEngine> engine_;
  const int peer_;
  const uint64_t tag_;
  const bool is_send_;
  const size_t bytes_;

  // Guarded by the engine's mutex.
  void* request_ = nullptr;        // the UCX request while in flight
  std::shared_ptr<UcxWork> self_;  // set while in flight: UCX's callback needs the object
  UcxWork* prev_ = nullptr;        // the peer's in-flight list
  UcxWork* next_ = nullptr;
  bool linked_ = false;
  bool cancelled_ = false;
  Status cancel_reason_;

  Status result_;
  size_t received_ = 0;
  std::atomic<bool> done_{false};
};

// The UCX state of one transport: context, worker, endpoints and the bookkeeping of transfers in
// flight. One mutex guards all of it and every UCX call (the worker runs in SERIALIZED mode):
// per-peer failure handling must be atomic with the UCX calls anyway, so UCX's own MULTI-mode
// lock would only add a second lock on the hot path. Completion callbacks run inside
// ucp_worker_progress, i.e. with the mutex held.
class UcxEngine : public std::enable_shared_from_this<UcxEngine> {
 public:
  UcxEngine(int rank, int size, const UcxOptions& options)
      : rank_(rank), size_(size), options_(options), peers_(size) {
    for (int r = 0; r < size; ++r) {
      peers_[r].engine = this;
      peers_[r].rank = r;
    }
  }
  ~UcxEngine() { shutdown(); }

  Status init(Store& store);
  std::shared_ptr<TransportWork> post(bool is_send, int peer, uint64_t tag, void* data, size_t bytes);
  Status wait(UcxWork* work, Duration timeout);
  bool poll(UcxWork* work);
  void cancel(UcxWork* work, const Status& reason);
  Status peer_status(int peer);
  std::string describe_endpoint(int peer);
  std::string describe_pending();
  void shutdown();

 private:
  struct Peer {
    UcxEngine* engine = nullptr;
    int rank = -1;
    ucp_ep_h ep = nullptr;
    Status failure;                // OK while the peer is believed alive
    UcxWork* in_flight = nullptr;  // head of the list of works UCX still owns
    // The peer's process, published with its address; `local` when it runs under this rank's
    // kernel and pid namespace, so that wait() can tell when it has exited. Set in init,
    // read-only after.
    ProcessIdentity process;
    bool local = false;
  };

  static void send_callback(void* request, ucs_status_t status, void* user_data);
  static void recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                            void* user_data);
  static void error_callback(void* arg, ucp_ep_h ep, ucs_status_t status);

  std::string key(int rank) const { return options_.key_prefix + std::to_string(rank); }
  Status create_context();
  Status exchange_addresses(Store& store, std::vector<std::string>* addresses);
  // Fails `peer` (UNAVAILABLE) if it runs on this host and its process has exited; true if it did.
  bool fail_if_exited(int peer);

  // Everything below runs with mutex_ held.
  unsigned progress_locked();
  void complete_locked(UcxWork* work, ucs_status_t status, size_t received);
  Status result_locked(const UcxWork& work, ucs_status_t status, size_t received) const;
  void link_locked(UcxWork* work);
  void unlink_locked(UcxWork* work);
  void abandon_locked(UcxWork* work, const Status& status);
  void fail_peer_locked(int peer, const Status& failure);
  // Records `peer`'s failure (the first one reported wins); progress_locked drains what it sent
  // while alive and then fails it. Safe inside UCX's callbacks.
  void report_failure_locked(int peer, Status failure);
  bool has_unexpected_locked(int peer, uint64_t tag);
  void close_endpoint_locked(Peer& peer, bool force);
  void reap_closing_locked();
  bool any_in_flight_locked() const;

  void idle_progress_loop();
  void stop_idle_progress();

  const int rank_;
  const int size_;
  const UcxOptions options_;
  const std::string name_ = fmt::format("cohort-rank-{}", rank_);

  std::mutex mutex_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  bool shut_down_ = false;
  std::vector<Peer> peers_;        // sized once: error handlers keep pointers into it
  std::vector<int> failed_peers_;  // reported by error_callback, handled after progress
  std::vector<void*> closing_;     // ucp_ep_close_nbx requests not yet complete
  std::atomic<int> sleepers_{0};   // threads asleep on efd_; progress wakes them
  uint64_t progress_calls_ = 0;    // guarded by mutex_; the idle thread's "did anyone progress?"

  std::thread idle_thread_;
  std::mutex idle_mutex_;
  std::condition_variable idle_cv_;
  bool stop_idle_ = false;  // guarded by idle_mutex_
};

// ---------------------------------------------------------------------------------------------
// Setup

Status UcxEngine::create_context() {
  ucp_config_t* config = nullptr;
  COHORT_UCX_RETURN_IF_ERROR(ucp_config_read(nullptr, nullptr, &config));
  std::unique_ptr<ucp_config_t, void (*)(ucp_config_t*)> config_owner(config, ucp_config_release);
  // The environment wins over options, as UCX users expect (UCX_TLS=tcp to rule out shared memory).
  if (std::getenv("UCX_TLS") == nullptr && !options_.transports.empty()) {
    COHORT_UCX_RETURN_IF_ERROR(ucp_config_modify(config, "TLS", options_.transports.c_str()));
  }
  std::string interval = fmt::format("{}ms", std::max<int64_t>(1, options_.keepalive_interval.count()));
  COHORT_RETURN_IF_ERROR(set_unless_in_environment(config, "KEEPALIVE_INTERVAL", interval));
  // UCX's registration cache installs mmap hooks at ucp_init; in freshly forked ranks that install
  // was seen to block forever on UCM's internal lock (ucm_event_enter_exclusive), which would make
  // communicator creation hang. Shared-memory and CMA lanes do not need registered memory, so the
  // cache is off unless UCX_RCACHE_ENABLE says otherwise.
  COHORT_RETURN_IF_ERROR(set_unless_in_environment(config, "RCACHE_ENABLE", "n"));
  if (options_.rendezvous_threshold > 0) {
    COHORT_RETURN_IF_ERROR(
        set_unless_in_environment(config, "RNDV_THRESH", std::to_string(options_.rendezvous_threshold)));
  }
  if (options_.shared_memory_error_handling) {
    // Shared memory notices a dead peer through keepalive (is the process still there?), which
    // is what peer error handling needs; UCX 1.13 only hides the capability by default.
    COHORT_RETURN_IF_ERROR(set_unless_in_environment(config, "MM_ERROR_HANDLING", "y"));
    export_cma_memory_invalidate();
  }

  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_NAME;
  // WAKEUP: waiters sleep on the worker's event fd instead of spinning.
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.estimated_num_eps = static_cast<size_t>(size_);
  params.name = name_.c_str();
  COHORT_UCX_RETURN_IF_ERROR(ucp_init(&params, config, &context_));

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE | UCP_WORKER_PARAM_FIELD_FLAGS;
  worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  // Requests abandoned to a dead peer are released with the worker; no warning about them.
  worker_params.flags = UCP_WORKER_FLAG_IGNORE_REQUEST_LEAK;
  COHORT_UCX_RETURN_IF_ERROR(ucp_worker_create(context_, &worker_params, &worker_));
  COHORT_UCX_RETURN_IF_ERROR(ucp_worker_get_efd(worker_, &efd_));
  return ok_status();
}

Status UcxEngine::exchange_addresses(Store& store, std::vector<std::string>* addresses) {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  COHORT_UCX_RETURN_IF_ERROR(ucp_worker_get_address(worker_, &address, &length));
  // Published with this process's identity in front (kIdentityBytes), for the peers' liveness
  // checks (fail_if_exited).
  const ProcessIdentity self = this_process();
  std::string own = encode_identity(self);
  own.append(reinterpret_cast<const char*>(address), length);
  ucp_worker_release_address(worker_, address);
  COHORT_RETURN_IF_ERROR(
      store.set(key(rank_), own)
          .with_context(fmt::format("rank {}: publishing the UCX worker address under store key \"{}\"",
                                    rank_, key(rank_))));

  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) keys.push_back(key(r));
  }
  Status waited = store.wait(keys, options_.connect_timeout);
  if (!waited.ok()) {
    if (waited.code() != StatusCode::kDeadlineExceeded) {
      return waited.with_context(fmt::format("rank {}: waiting for the peers' UCX worker addresses", rank_));
    }
    std::vector<int> missing;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      StatusOr<bool> present = store.check({key(r)});
      if (!present.ok() || !*present) missing.push_back(r);
    }
    return deadline_exceeded_error(
        "rank {}: rank(s) {} did not publish a UCX worker address within {} (store keys \"{}<rank>\"); did "
        "they "
        "start, and do all {} ranks use the same store and key prefix?",
        rank_, fmt::join(missing, ", "), format_duration(options_.connect_timeout), options_.key_prefix,
        size_);
  }
  addresses->assign(size_, std::string());
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    COHORT_ASSIGN_OR_RETURN(std::string value, store.get(key(r), options_.connect_timeout));
    if (value.size() <= kIdentityBytes) {
      return invalid_argument_error(
          "rank {}: store key \"{}\" holds {} bytes, not a UCX worker address; do all {} ranks run the same "
          "cohort version, and is the key prefix \"{}\" used by this job only?",
          rank_, key(r), value.size(), size_, options_.key_prefix);
    }
    peers_[r].process = decode_identity(value);
    // Same kernel and pid namespace: its pid can be looked up here (even if it has exited by
    // now, which wait() then reports). Otherwise only UCX's keepalive tells that it died.
    peers_[r].local = self.same_pid_space(peers_[r].process);
    (*addresses)[r] = value.substr(kIdentityBytes);
  }
  return ok_status();
}

Status UcxEngine::init(Store& store) {
  COHORT_RETURN_IF_ERROR(create_context().with_context(
      fmt::format("rank {}: creating the UCX context and worker (UCX_TLS={})", rank_,
                  std::getenv("UCX_TLS") != nullptr ? std::getenv("UCX_TLS") : options_.transports)));
  std::vector<std::string> addresses;
  COHORT_RETURN_IF_ERROR(exchange_addresses(store, &addresses));

  std::lock_guard<std::mutex> lock(mutex_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                        UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.address = reinterpret_cast<const ucp_address_t*>(addresses[r].data());
    // PEER: a failed peer fails its endpoint's requests and calls error_callback instead of
    // aborting the process; the worker stays usable for the other peers.
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &UcxEngine::error_callback;
    params.err_handler.arg = &peers_[r];
    Status connected = COHORT_UCX_CHECK(ucp_ep_create(worker_, &params, &peers_[r].ep));
    if (!connected.ok()) {
      // A peer that already sent what it had and exited (its shared-memory FIFO is gone) fails
      // this rank's transfers with it, naming it, not the whole transport: what it sent while
      // alive is in our FIFO and still delivered (see has_unexpected_locked).
      peers_[r].ep = nullptr;
      peers_[r].failure = unavailable_error("peer rank {} failed: rank {} could not connect to it ({}); has it "
                                            "exited or crashed?",
                                            r, rank_, connected.message());
    }
  }
  if (options_.idle_progress_interval > Duration::zero() && size_ > 1) {
    idle_thread_ = std::thread([this] { idle_progress_loop(); });
  }
  return ok_status();
}

void UcxEngine::idle_progress_loop() {
  uint64_t seen = 0;
  Duration period = options_.idle_progress_interval;
  std::unique_lock<std::mutex> idle_lock(idle_mutex_);
  while (!idle_cv_.wait_for(idle_lock, period, [this] { return stop_idle_; })) {
    // Never block a caller: skip the round if the worker is busy, or was progressed recently.
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || worker_ == nullptr) continue;
    if (progress_calls_ != seen) {
      seen = progress_calls_;
      period = options_.idle_progress_interval;
      continue;
    }
    unsigned events = 0;
    for (int round = 0; round < 64; ++round) {
      unsigned found = progress_locked();
      if (found == 0) break;
      events += found;
    }
    seen = progress_calls_;
    // Protocol leftovers show up within a few rounds of the last activity; a rank idle for
    // longer only needs keepalive, so the thread backs off to kMaxIdleProgressPeriod.
    bool quiet = events == 0 && !any_in_flight_locked();
    period = quiet ? std::min<Duration>(2 * period,
                                        std::max(options_.idle_progress_interval, kMaxIdleProgressPeriod))
                   : options_.idle_progress_interval;
  }
}

void UcxEngine::stop_idle_progress() {
  {
    std::lock_guard<std::mutex> lock(idle_mutex_);
    stop_idle_ = true;
  }
  idle_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
}

// ---------------------------------------------------------------------------------------------
// Transfers

std::shared_ptr<TransportWork> UcxEngine::post(bool is_send, int peer, uint64_t tag, void* data,
                                               size_t bytes) {
  auto work = std::make_shared<UcxWork>(shared_from_this(), peer, tag, is_send, bytes);
  if (peer < 0 || peer >= size_ || peer == rank_) {
    work->finish(invalid_argument_error("rank {}: {} peer rank {} is not another rank of this {}-rank group",
                                        rank_, direction(is_send), peer, size_),
                 0);
    return work;
  }
  if (tag > kTransportTagMask) {
    work->finish(invalid_argument_error("rank {}: tag {} of a {} rank {} does not fit in {} bits", rank_, tag,
                                        direction(is_send), peer, kTransportTagBits),
                 0);
    return work;
  }
  if (data == nullptr) data = zero_byte_buffer;

  ucp_request_param_t param;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  param.user_data = work.get();
  if (is_send) {
    param.cb.send = &UcxEngine::send_callback;
  } else {
    // UCX 1.13 completes a receive of an already arrived eager message in place without filling
    // recv_info, so the received length would be unknown: take the callback path every time (it
    // may run inside ucp_tag_recv_nbx).
    param.op_attr_mask |= UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    param.cb.recv = &UcxEngine::recv_callback;
  }

  std::lock_guard<std::mutex> lock(mutex_);
  if (shut_down_) {
    work->finish(failed_precondition_error("rank {}: the UCX transport was destroyed", rank_), 0);
    return work;
  }
  Peer& target = peers_[peer];
  if (!target.failure.ok() && (is_send || !has_unexpected_locked(peer, tag))) {
    work->finish(target.failure, 0);
    return work;
  }
  ucs_status_ptr_t request =
      is_send ? ucp_tag_send_nbx(target.ep, data, bytes, wire_tag(tag, rank_), &param)
              : ucp_tag_recv_nbx(worker_, data, bytes, wire_tag(tag, peer), kFullTagMask, &param);
  if (request == nullptr) {
    // Completed in place: an eager send whose data is already copied out.
    work->finish(ok_status(), 0);
  } else if (UCS_PTR_IS_ERR(request)) {
    work->finish(result_locked(*work, UCS_PTR_STATUS(request), 0), 0);
  } else if (work->done()) {
    // The callback already ran inside the call (and released the request).
  } else {
    work->request_ = request;
    work->self_ = work;
    link_locked(work.get());
    if (!target.failure.ok()) {
      // Matched a dead peer's message that is not all here (a rendezvous announcement whose data
      // would have to be fetched from it): give it what has arrived, then fail it now, naming the
      // peer, instead of letting it wait out its timeout. The endpoint is closed: no data moves.
      for (int i = 0; i < kDrainProgressCalls && !work->done(); ++i) progress_locked();
      if (!work->done()) abandon_locked(work.get(), target.failure);
    }
  }
  return work;
}

// Whether a message from `peer` with `tag` has arrived and waits for its receive. A peer that
// sent and then died (or just exited) is failed, but what it sent while alive is still delivered.
bool UcxEngine::has_unexpected_locked(int peer, uint64_t tag) {
  // What has arrived may still be in a transport's FIFO, possibly behind protocol messages: take
  // it in first (probing does not), with every drain call, not only until one finds nothing.
  for (int i = 0; i < kDrainProgressCalls; ++i) ucp_worker_progress(worker_);
  ucp_tag_recv_info_t info;
  return ucp_tag_probe_nb(worker_, wire_tag(tag, peer), kFullTagMask, /*remove=*/0, &info) != nullptr;
}

void UcxEngine::send_callback(void* request, ucs_status_t status, void* user_data) {
  auto* work = static_cast<UcxWork*>(user_data);
  work->request_ = request;
  work->engine_->complete_locked(work, status, 0);
}

void UcxEngine::recv_callback(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                              void* user_data) {
  auto* work = static_cast<UcxWork*>(user_data);
  work->request_ = request;
  work->engine_->complete_locked(work, status, info != nullptr ? info->length : 0);
}

void UcxEngine::complete_locked(UcxWork* work, ucs_status_t status, size_t received) {
  if (work->request_ != nullptr) {
    ucp_request_free(work->request_);
    work->request_ = nullptr;
  }
  unlink_locked(work);
  work->finish(result_locked(*work, status, received), status == UCS_OK ? received : 0);
  // Dropping the self-reference may destroy the work: nothing touches it afterwards.
  std::shared_ptr<UcxWork> keep_until_return = std::move(work->self_);
}

Status UcxEngine::result_locked(const UcxWork& work, ucs_status_t status, size_t received) const {
  if (status == UCS_OK) return ok_status();
  if (work.cancelled_) return work.cancel_reason_;
  const Peer& peer = peers_[work.peer_];
  if (!peer.failure.ok()) return peer.failure;
  if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    std::string sent =
        received > work.bytes_ ? fmt::format("{} bytes", received) : std::string("a longer message");
    return invalid_argument_error(
        "message truncated: rank {} sent {} with tag {} but rank {} posted a {}-byte receive", work.peer_,
        sent, work.tag_, rank_, work.bytes_);
  }
  if (status == UCS_ERR_CANCELED) {
    return cancelled_error("rank {}: UCX cancelled the {} rank {} ({} bytes, tag {})", rank_,
                           direction(work.is_send_), work.peer_, work.bytes_, work.tag_);
  }
  StatusCode code = ucx_status_code(status);
  if (code == StatusCode::kUnavailable) {
    return unavailable_error("peer rank {} failed: {}", work.peer_, ucs_status_string(status));
  }
  return Status(code, fmt::format("rank {}: UCX {} rank {} ({} bytes, tag {}) failed: {}", rank_,
                                  direction(work.is_send_), work.peer_, work.bytes_, work.tag_,
                                  ucs_status_string(status)));
}

void UcxEngine::link_locked(UcxWork* work) {
  Peer& peer = peers_[work->peer_];
  work->prev_ = nullptr;
  work->next_ = peer.in_flight;
  if (peer.in_flight != nullptr) peer.in_flight->prev_ = work;
  peer.in_flight = work;
  work->linked_ = true;
}

void UcxEngine::unlink_locked(UcxWork* work) {
  if (!work->linked_) return;
  Peer& peer = peers_[work->peer_];
  if (work->prev_ != nullptr) {
    work->prev_->next_ = work->next_;
  } else {
    peer.in_flight = work->next_;
  }
  if (work->next_ != nullptr) work->next_->prev_ = work->prev_;
  work->prev_ = work->next_ = nullptr;
  work->linked_ = false;
}

// Takes a work back from UCX without its callback: the request is released (UCX frees it when
// it finishes, without calling back) and the work completes with `status`. Only for peers whose
// endpoint is closed, so no data moves into or out of the buffer any more.
void UcxEngine::abandon_locked(UcxWork* work, const Status& status) {
  if (work->request_ != nullptr) {
    ucp_request_free(work->request_);
    work->request_ = nullptr;
  }
  unlink_locked(work);
  work->finish(work->cancelled_ ? work->cancel_reason_ : status, 0);
  std::shared_ptr<UcxWork> keep_until_return = std::move(work->self_);
}

unsigned UcxEngine::progress_locked() {
  ++progress_calls_;
  unsigned events = ucp_worker_progress(worker_);
  if (!failed_peers_.empty()) {
    // Before failing a dead peer's receives, take in what it sent while alive: keepalive can
    // report the death in a progress call that has not yet read the shared-memory FIFO.
    for (int i = 0; i < kDrainProgressCalls && ucp_worker_progress(worker_) > 0; ++i) ++events;
    std::vector<int> failed;
    failed.swap(failed_peers_);
    for (int peer : failed) fail_peer_locked(peer, peers_[peer].failure);
  }
  if (!closing_.empty()) reap_closing_locked();
  // A thread asleep on the event fd may be waiting for a work this call completed.
  if (events > 0 && sleepers_.load(std::memory_order_relaxed) > 0) {
    COHORT_UCX_CHECK(ucp_worker_signal(worker_)).ignore_error();
  }
  return events;
}

// Spin iterations between two deadline checks in UcxEngine::wait.
constexpr int kClockCheckInterval = 64;
// Idle spins in UcxEngine::wait before each further spin also yields the core.
constexpr int kYieldAfterSpins = 32;

Status UcxEngine::wait(UcxWork* work, Duration timeout) {
  // Anything beyond a century means "no limit" (and keeps time_point arithmetic from overflowing).
  const bool forever = timeout > std::chrono::hours(24 * 365 * 100);
  // The deadline is set at the first clock check, not on entry: a reply that is already on its
  // way arrives within the first few spins, and such a wait reads no clock at all. The timeout
  // then starts at most kYieldAfterSpins progress calls (and one yield) late.
  Clock::time_point deadline = Clock::time_point::min();
  // Waiting on a peer of this host, look every keepalive interval whether its process exited:
  // UCX's keepalive covers only endpoints whose wireup completed, and a peer killed before it
  // progressed its side never completes it, so a send to it would wait out the whole timeout.
  Clock::time_point next_liveness_check = Clock::time_point::max();
  int idle = 0;
  for (;;) {
    bool sleep = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (work->done() || worker_ == nullptr) break;
      unsigned events = progress_locked();
      if (work->done()) break;
      if (events > 0) {
        idle = 0;
      } else if (++idle > options_.spin_iterations) {
        // Sleep only once the worker is armed: arm fails with BUSY while events are pending.
        ucs_status_t armed = ucp_worker_arm(worker_);
        if (armed == UCS_OK) {
          sleep = true;
          sleepers_.fetch_add(1, std::memory_order_relaxed);
        }
      }
    }
    // Past a short spin, give the core away on every idle iteration: with more ranks than cores
    // (4 ranks on 2 here) the peer we wait for may need this very core to make progress.
    if (!sleep && idle > kYieldAfterSpins) sched_yield();
    // Reading the clock costs as much as a progress call on some VMs: while spinning, look at it
    // only every kClockCheckInterval iterations (a few microseconds), and once as soon as the
    // waiter yields (a yield may last another process's timeslice: start the deadline first).
    const bool deadline_set = deadline != Clock::time_point::min();
    if (!sleep && idle % kClockCheckInterval != 0 && (deadline_set || idle <= kYieldAfterSpins)) continue;
    Clock::time_point now = Clock::now();
    if (!deadline_set) {
      deadline = forever ? Clock::time_point::max() : now + std::max(timeout, Duration(0));
      next_liveness_check = now + options_.keepalive_interval;
    } else if (now >= next_liveness_check) {
      next_liveness_check = now + options_.keepalive_interval;
      if (fail_if_exited(work->peer_)) {
        if (sleep) sleepers_.fetch_sub(1, std::memory_order_relaxed);
        continue;  // the work completed with the peer's failure
      }
    }
    if (now >= deadline) {
      if (sleep) sleepers_.fetch_sub(1, std::memory_order_relaxed);
      if (work->done()) break;
      return deadline_exceeded_error(
          "rank {}: UCX {} rank {} ({} bytes, tag {}) still pending after waiting {}", rank_,
          direction(work->is_send_), work->peer_, work->bytes_, work->tag_, format_duration(timeout));
    }
    if (sleep) {
      auto slice = std::min<Clock::duration>(options_.poll_slice, deadline - now);
      auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(slice).count();
      timespec ts{static_cast<time_t>(nanos / 1'000'000'000), static_cast<long>(nanos % 1'000'000'000)};
      pollfd fd{efd_, POLLIN, 0};
      ppoll(&fd, 1, &ts, nullptr);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      // Woken: progress once more; spin again only if that finds events.
      idle = options_.spin_iterations;
    }
  }
  return work->result_;
}

bool UcxEngine::poll(UcxWork* work) {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock() && !work->done() && worker_ != nullptr) progress_locked();
  return work->done();
}

void UcxEngine::cancel(UcxWork* work, const Status& reason) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (work->done()) return;
  work->cancelled_ = true;
  work->cancel_reason_ = reason.ok() ? cancelled_error("rank {}: {} rank {} cancelled", rank_,
                                                       direction(work->is_send_), work->peer_)
                                     : reason;
  // A receive still waiting for its message leaves the expected queue and calls back right here.
  if (work->request_ != nullptr) ucp_request_cancel(worker_, work->request_);
  // Sends and receives already matched to a message cannot be cancelled in UCX: give them a
  // moment to finish (they usually are mid-copy) ...
  const Clock::time_point grace_end = Clock::now() + options_.cancel_grace;
  while (!work->done() && Clock::now() < grace_end) {
    if (progress_locked() == 0) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    }
  }
  if (work->done()) return;
  // ... then close the connection, which is the only way to be sure the buffer is not touched.
  fail_peer_locked(
      work->peer_,
      unavailable_error("rank {} disconnected from peer rank {}: a cancelled {} rank {} ({} bytes, tag {}) "
                        "was still in flight after {}",
                        rank_, work->peer_, direction(work->is_send_), work->peer_, work->bytes_, work->tag_,
                        format_duration(options_.cancel_grace)));
}

// ---------------------------------------------------------------------------------------------
// Failures and shutdown

void UcxEngine::error_callback(void* arg, ucp_ep_h /*ep*/, ucs_status_t status) {
  // Runs inside ucp_worker_progress (mutex held). Record now, act after progress returns: closing
  // endpoints and cancelling requests from inside UCX's callback is not re-entrant.
  auto* peer = static_cast<Peer*>(arg);
  peer->engine->report_failure_locked(
      peer->rank, unavailable_error("peer rank {} failed: {}", peer->rank, ucs_status_string(status)));
}

void UcxEngine::report_failure_locked(int rank, Status failure) {
  Peer& peer = peers_[rank];
  if (peer.failure.ok()) peer.failure = std::move(failure);
  failed_peers_.push_back(rank);
}

bool UcxEngine::fail_if_exited(int peer) {
  const Peer& p = peers_[peer];
  // `local` and `process` are fixed after init; reading /proc needs no lock.
  if (!p.local || !process_gone(p.process)) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  if (worker_ == nullptr) return false;
  if (p.failure.ok()) {
    // Reported as UCX reports a death, so progress_locked takes in what it sent while alive first.
    report_failure_locked(
        peer, unavailable_error("peer rank {} failed: its process (pid {}) on this host has exited", peer, p.process.pid));
    progress_locked();
  }
  return true;
}

void UcxEngine::fail_peer_locked(int rank, const Status& failure) {
  Peer& peer = peers_[rank];
  if (peer.failure.ok()) peer.failure = failure;
  // Receives are posted on the worker, not the endpoint, so UCX does not fail them with it:
  // cancel those still waiting for a message (each calls back with CANCELED → peer.failure).
  for (UcxWork* work = peer.in_flight; work != nullptr;) {
    UcxWork* next = work->next_;
    if (!work->is_send_ && work->request_ != nullptr) ucp_request_cancel(worker_, work->request_);
    work = next;
  }
  // Closing the endpoint fails its sends (and receives already matched to its messages).
  if (peer.ep != nullptr) close_endpoint_locked(peer, /*force=*/true);
  // Whatever UCX still holds can no longer move data: take it back.
  while (peer.in_flight != nullptr) abandon_locked(peer.in_flight, peer.failure);
}

void UcxEngine::close_endpoint_locked(Peer& peer, bool force) {
  ucp_request_param_t param;
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t request = ucp_ep_close_nbx(peer.ep, &param);
  peer.ep = nullptr;
  if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
}

void UcxEngine::reap_closing_locked() {
  closing_.erase(std::remove_if(closing_.begin(), closing_.end(),
                                [](void* request) {
                                  if (ucp_request_check_status(request) == UCS_INPROGRESS) return false;
                                  ucp_request_free(request);
                                  return true;
                                }),
                 closing_.end());
}

bool UcxEngine::any_in_flight_locked() const {
  return std::any_of(peers_.begin(), peers_.end(), [](const Peer& p) { return p.in_flight != nullptr; });
}

void UcxEngine::shutdown() {
  stop_idle_progress();
  std::unique_lock<std::mutex> lock(mutex_);
  if (shut_down_) return;
  shut_down_ = true;
  if (worker_ != nullptr) {
    Status reason =
        cancelled_error("rank {}: the UCX transport was destroyed before this transfer completed", rank_);
    for (Peer& peer : peers_) {
      bool sending = false;
      for (UcxWork* work = peer.in_flight; work != nullptr;) {
        UcxWork* next = work->next_;
        work->cancelled_ = true;
        work->cancel_reason_ = reason;
        if (work->is_send_) sending = true;
        if (!work->is_send_ && work->request_ != nullptr) ucp_request_cancel(worker_, work->request_);
        work = next;
      }
      // A flush would wait for sends nobody may ever receive; those endpoints are torn down.
      if (peer.ep != nullptr) close_endpoint_locked(peer, /*force=*/sending || !peer.failure.ok());
    }
    const Clock::time_point deadline = Clock::now() + options_.close_timeout;
    while ((!closing_.empty() || any_in_flight_locked()) && Clock::now() < deadline) {
      if (progress_locked() == 0) {
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        lock.lock();
      }
    }
    for (Peer& peer : peers_) {
      while (peer.in_flight != nullptr) abandon_locked(peer.in_flight, reason);
    }
    for (void* request : closing_) ucp_request_free(request);
    closing_.clear();
    ucp_worker_destroy(worker_);
    worker_ = nullptr;
  }
  if (context_ != nullptr) {
    ucp_cleanup(context_);
    context_ = nullptr;
  }
}

Status UcxEngine::peer_status(int peer) {
  if (peer < 0 || peer >= size_) {
    return invalid_argument_error("rank {}: peer rank {} is not a rank of this {}-rank group", rank_, peer,
                                  size_);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return peers_[peer].failure;
}

std::string UcxEngine::describe_endpoint(int peer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (peer < 0 || peer >= size_ || peer == rank_)
    return fmt::format("rank {}: no endpoint to rank {}", rank_, peer);
  if (peers_[peer].ep == nullptr) {
    return fmt::format("rank {}: endpoint to rank {} closed ({})", rank_, peer,
                       peers_[peer].failure.message());
  }
  char* text = nullptr;
  size_t length = 0;
  FILE* stream = open_memstream(&text, &length);
  if (stream == nullptr) return "open_memstream failed";
  ucp_ep_print_info(peers_[peer].ep, stream);
  std::fclose(stream);
  std::string description(text, length);
  std::free(text);
  return description;
}

std::string UcxEngine::describe_pending() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  for (const Peer& peer : peers_) {
    if (!peer.failure.ok()) out += fmt::format("rank {}: {}\n", rank_, peer.failure.message());
    for (const UcxWork* work = peer.in_flight; work != nullptr; work = work->next_) {
      char info[256] = "";
      ucp_request_attr_t attr{};
      attr.field_mask = UCP_REQUEST_ATTR_FIELD_INFO_STRING | UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE;
      attr.debug_string = info;
      attr.debug_string_size = sizeof(info);
      if (work->request_ == nullptr || ucp_request_query(work->request_, &attr) != UCS_OK) info[0] = 0;
      out += fmt::format("rank {}: {} rank {}, {} bytes, tag {}: {}\n", rank_, direction(work->is_send_),
                         work->peer_, work->bytes_, work->tag_, info);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// UcxWork

Status UcxWork::wait(Duration timeout) {
  if (done()) return result_;
  return engine_->wait(this, timeout);
}

bool UcxWork::is_completed() { return done() || engine_->poll(this); }

void UcxWork::cancel(Status reason) {
  if (!done()) engine_->cancel(this, reason);
}

// ---------------------------------------------------------------------------------------------
// UcxTransport

StatusOr<std::unique_ptr<UcxTransport>> UcxTransport::create(Store& store, int rank, int size,
                                                             const UcxOptions& options) {
  if (size < 1 || size > kMaxRanks || rank < 0 || rank >= size) {
    return invalid_argument_error("UcxTransport: rank {} of size {} is not valid (size must be 1..{})", rank,
                                  size, kMaxRanks);
  }
  auto engine = std::make_shared<UcxEngine>(rank, size, options);
  COHORT_RETURN_IF_ERROR(engine->init(store));
  return std::unique_ptr<UcxTransport>(new UcxTransport(std::move(engine), rank, size));
}

UcxTransport::UcxTransport(std::shared_ptr<UcxEngine> engine, int rank, int size)
    : engine_(std::move(engine)), rank_(rank), size_(size) {}

UcxTransport::~UcxTransport() { engine_->shutdown(); }

std::shared_ptr<TransportWork> UcxTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  return engine_->post(true, peer, tag, const_cast<void*>(data), bytes);
}

std::shared_ptr<TransportWork> UcxTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  return engine_->post(false, peer, tag, data, bytes);
}

Status UcxTransport::peer_status(int peer) { return engine_->peer_status(peer); }

std::string UcxTransport::describe_endpoint(int peer) { return engine_->describe_endpoint(peer); }

std::string UcxTransport::describe_pending() { return engine_->describe_pending(); }

}  // namespace cohort::comm
