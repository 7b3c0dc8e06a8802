#include "worker/comm/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>

#include <spdlog/spdlog.h>

#include "worker/comm/algorithms/algorithm_selector.h"
#include "worker/comm/algorithms/collectives.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/flight_recorder_registry.h"
#include "worker/comm/reduce/reduce_kernels.h"
#include "worker/comm/shm/shared_memory_engine.h"
#include "worker/comm/transport/nccl/device_memory.h"

namespace cohort::comm {
namespace {

// Store key of the job-wide context id counter; context 0 is the world communicator.
constexpr const char* kContextCounterKey = "cohort/comm/next_context_id";
// Fixed size of a collective's signature in COHORT_DEBUG=detail cross-checks.
constexpr size_t kSignatureBytes = 160;
std::string describe(DataType dtype, size_t count) {
  return fmt::format("{} x {}", data_type_name(dtype), count);
}

bool env_debug_detail() {
  const char* value = std::getenv("COHORT_DEBUG");
  return value != nullptr && std::string_view(value) == "detail";
}

[[gnu::noinline, gnu::cold]] Status null_buffer_error(size_t count, const char* name) {
  return invalid_argument_error("{} buffer is null but count is {}", name, count);
}

// Inline, with the error out of line: every collective checks its buffers on the hot path.
inline Status check_buffer(const void* buf, size_t count, const char* name) {
  if (count > 0 && buf == nullptr) return null_buffer_error(count, name);
  return ok_status();
}

// True when a buffer the call passes is device memory (a few microseconds per buffer in a CUDA
// build, nothing in a CPU-only one). Decided from the pointers, not this rank's byte counts, so a
// rank with an empty block takes the same path as its peers. Callers skip calls that are empty
// on every rank.
bool any_device(const void* send, const void* recv) {
  // In place (the usual gradient allreduce) asks the driver once.
  return is_device_memory(send) || (recv != send && is_device_memory(recv));
}

// Copies into / out of host staging memory from a buffer that may be device or host memory.
Status stage_in(void* host, const void* from, size_t bytes) {
  if (bytes == 0) return ok_status();
  if (is_device_memory(from)) return copy_to_host(host, from, bytes);
  std::memcpy(host, from, bytes);
  return ok_status();
}

Status stage_out(void* to, const void* host, size_t bytes) {
  if (bytes == 0) return ok_status();
  if (is_device_memory(to)) return copy_to_device(to, host, bytes);
  std::memcpy(to, host, bytes);
  return ok_status();
}

std::vector<size_t> to_bytes(const std::vector<size_t>& counts, size_t element_bytes) {
  std::vector<size_t> bytes(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * element_bytes;
  return bytes;
}

// A send argument that is never read (scatter off its root), distinct from null ("in place").
const uint8_t kNoInputByte = 0;
const void* const kNoInput = &kNoInputByte;

// A transfer that failed before reaching the transport.
class FailedTransferWork final : public TransportWork {
 public:
  explicit FailedTransferWork(Status status) : status_(std::move(status)) {}
  using Work::wait;
  Status wait(Duration) override { return status_; }
  bool is_completed() override { return true; }
  Status error() override { return status_; }
  void cancel(Status) override {}
  size_t received_bytes() const override { return 0; }

 private:
  const Status status_;
};

// A point-to-point transfer of a device buffer over a host transport, through a host copy it
// owns: a send copied the buffer before posting; a receive lands in the copy, which goes to the
// device buffer once the transfer completes (on the first wait() or is_completed() to see it).
class StagedTransferWork final : public TransportWork {
 public:
  // `device` is the receive's destination; null for a send.
  StagedTransferWork(std::shared_ptr<TransportWork> inner, std::unique_ptr<std::vector<uint8_t>> host,
                     void* device)
      : inner_(std::move(inner)), host_(std::move(host)), device_(device) {}
  // Dropped unfinished: the transport must let go of the host copy before it is freed.
  ~StagedTransferWork() override {
    if (!inner_->is_completed())
      inner_->cancel(cancelled_error("staged transfer dropped before it completed"));
  }

  using Work::wait;
  Status wait(Duration timeout) override {
    Status status = inner_->wait(timeout);
    if (status.code() == StatusCode::kDeadlineExceeded) return status;
    return finish(status);
  }
  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    finish(inner_->error()).ignore_error();
    return true;
  }
  Status error() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return result_.value_or(inner_->error());
  }
  void cancel(Status reason) override { inner_->cancel(std::move(reason)); }
  size_t received_bytes() const override { return inner_->received_bytes(); }

 private:
  // Copies a completed receive to the device, once; the final status.
  Status finish(const Status& transfer) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!result_.has_value()) {
      result_ = transfer;
      if (transfer.ok() && device_ != nullptr) {
        result_ = copy_to_device(device_, host_->data(), inner_->received_bytes())
                      .with_context("staging a received message to the device");
      }
    }
    return *result_;
  }

  const std::shared_ptr<TransportWork> inner_;
  const std::unique_ptr<std::vector<uint8_t>> host_;
  void* const device_;
  std::mutex mutex_;
  std::optional<Status> result_;
};

// COHORT_DEBUG=detail on point to point: what a send announces just ahead of its payload, on the
// same wire tag (the transports match FIFO per peer and tag, so it meets the receive's header).
struct P2PSignature {
  static constexpr uint32_t kMagic = 0x43503250;  // "P2PC"
  uint32_t magic = kMagic;
  int32_t rank = -1;   // the sender's rank in the communicator
  int32_t dtype = -1;  // a DataType value
  uint32_t tag = 0;
  uint64_t count = 0;  // elements

  std::string describe() const {
    const DataType type = static_cast<DataType>(dtype);
    return fmt::format("{} x {} ({} bytes, tag {})", data_type_name(type), count, count * element_size(type),
                       tag);
  }
};

// The check transfers of a checked send or receive, and what this side posted. The send's
// signature travels ahead of the payload (header); the receive's travels back to the sender as
// soon as it is posted (reply, p2p_check_reply_tag), so both sides can compare.
struct P2PCheck {
  std::shared_ptr<TransportWork> header;
  std::unique_ptr<P2PSignature> buffer;  // the send's signature, or where the receive's lands
  std::shared_ptr<TransportWork> reply;  // the receive's signature: sent back, or received by the sender
  std::unique_ptr<P2PSignature> reply_buffer;
  P2PSignature posted;                   // this side's own signature
  int peer = -1;                         // the other side's rank in the communicator
  bool is_send = false;
  std::string description;  // the communicator's, for messages
};

// A point-to-point transfer bounded by its deadline: waiting past it cancels the transfer and
// names the peer, tag and time waited. It records its end in the flight recorder once, and with a
// check (COHORT_DEBUG=detail) compares the signatures both sides posted: a receive against the
// sender's header, a send against the receive's reply, so both calls fail naming both sides.
class P2PWork final : public Work {
 public:
  P2PWork(bool is_send, std::shared_ptr<TransportWork> inner, Deadline deadline, std::string what,
          std::shared_ptr<FlightRecorder> recorder, uint64_t record, std::unique_ptr<P2PCheck> check)
      : is_send_(is_send),
        inner_(std::move(inner)),
        deadline_(deadline),
        what_(std::move(what)),
        recorder_(std::move(recorder)),
        record_(record),
        check_(std::move(check)) {}
  // A receive dropped unfinished (its owner gave up before waiting, e.g. on an exception between
  // irecv and wait) is cancelled, so the transport lets go of the buffer its owner is about to
  // free (transport.h), and its message is left to the next receive on the tag instead of being
  // taken into freed memory. The flight recorder shows it cancelled rather than in flight.
  // A send dropped unfinished goes on, as MPI_Request_free lets a send complete and a
  // torch.distributed isend whose request is dropped still arrives: its buffer is the caller's,
  // to keep until the message is out. Cancelling it instead would lose a message the peer waits
  // for (and UCX, which cannot take back a send under way, disconnects the peer after
  // cancel_grace).
  ~P2PWork() override {
    if (is_send_) {
      // The debug check's header (a send) and the reply's receive are part of the message: they
      // go on too, with the buffers they use, until all of it is done.
      if (check_ && !(check_->header->is_completed() && check_->reply->is_completed())) {
        keep_until_done(inner_, std::move(check_), deadline_);
      } else if (!inner_->is_completed()) {
        keep_until_done(inner_, nullptr, deadline_);
      }
      return;
    }
    if (!inner_->is_completed()) {
      const Status dropped = cancelled_error("{} dropped before it completed", what_);
      inner_->cancel(dropped);
      finish(dropped).ignore_error();
    }
    if (!check_) return;
    for (const auto& transfer : {check_->header, check_->reply}) {
      if (!transfer->is_completed()) transfer->cancel(cancelled_error("{} dropped", what_));
    }
  }

  Status wait(Duration timeout) override {
    const bool bounded_by_deadline = timeout >= deadline_.remaining();
    const Deadline wait_deadline = Deadline::after(std::min(timeout, deadline_.remaining()));
    Status status = ok_status();
    if (check_) {
      status = check_->header->wait(wait_deadline.remaining());
      // A send learns what the receive posted from its reply, sent when the receive was posted.
      if (status.ok() && check_->is_send) status = check_->reply->wait(wait_deadline.remaining());
      if (status.ok()) status = compare();
    }
    if (status.ok() || status.code() == StatusCode::kInvalidArgument) {
      // A mismatch still drains the payload (the receive does; the send waits for that), so
      // neither side is left to time out.
      Status payload = inner_->wait(wait_deadline.remaining());
      if (status.ok()) {
        status = payload;
      } else if (!inner_->is_completed()) {
        inner_->cancel(status);  // the mismatch is the answer; stop draining
      }
    }
    // A receive does not wait for its own reply: it is the sender's diagnostic, not this call's
    // result. It has left by now in practice (UCX sends 24 bytes eagerly; loopback matched it
    // when the sender posted its receive, before the payload this receive got); the destructor
    // cancels it otherwise (a sender without the check posts no receive for it).
    if (status.code() == StatusCode::kDeadlineExceeded) {
      if (!bounded_by_deadline) return status;  // the caller's shorter wait; still running
      inner_->cancel(status);
      if (check_) {
        check_->header->cancel(status);
        check_->reply->cancel(status);
      }
      status =
          deadline_exceeded_error("{}: timed out after {}; is the peer alive and issuing the matching call?",
                                  what_, format_duration(deadline_.budget()));
      return finish(status);
    }
    return finish(status.ok() || status.code() == StatusCode::kInvalidArgument ? status
                                                                               : status.with_context(what_));
  }
  bool is_completed() override {
    if (check_ && !check_->header->is_completed()) return false;
    if (check_ && check_->is_send && !check_->reply->is_completed()) return false;
    if (!inner_->is_completed()) return false;
    finish(final_status()).ignore_error();
    return true;
  }
  Status error() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (result_) return *result_;
    }
    if (check_) {
      // What compare() needs: the header, and for a send the receive's reply. (A receive's own
      // reply is not: a failed or pending one does not change what the receive got.)
      std::vector<std::shared_ptr<TransportWork>> needed{check_->header};
      if (check_->is_send) needed.push_back(check_->reply);
      for (const auto& transfer : needed) {
        Status status = transfer->error();
        if (!status.ok()) return status.with_context(what_);
        if (!transfer->is_completed()) return status;
      }
      Status mismatch = compare();
      if (!mismatch.ok()) return mismatch;
    }
    Status status = inner_->error();
    return status.ok() ? status : status.with_context(what_);
  }

 private:
  // Every transfer completed: the outcome.
  Status final_status() {
    if (check_) {
      Status header = check_->header->error();
      if (!header.ok()) return header.with_context(what_);
      if (check_->is_send) {
        Status reply = check_->reply->error();
        if (!reply.ok()) return reply.with_context(what_);
      }
      COHORT_RETURN_IF_ERROR(compare());
    }
    Status status = inner_->error();
    return status.ok() ? status : status.with_context(what_);
  }

  // The peer's signature against what this side posted: a receive's against the send's header, a
  // send's against the receive's reply (OK when they agree).
  Status compare() const {
    if (!check_) return ok_status();
    const P2PSignature& mine = check_->posted;
    const std::shared_ptr<TransportWork>& arrived = check_->is_send ? check_->reply : check_->header;
    const P2PSignature& theirs = check_->is_send ? *check_->reply_buffer : *check_->buffer;
    if (arrived->received_bytes() != sizeof(P2PSignature) || theirs.magic != P2PSignature::kMagic) {
      return invalid_argument_error(
          "point-to-point check (COHORT_DEBUG=detail) on {}: the {} from rank {} (tag {}) carried no "
          "signature; set COHORT_DEBUG=detail on every rank, or on none",
          check_->description, check_->is_send ? "reply to a send" : "message", check_->peer, mine.tag);
    }
    if (theirs.dtype == mine.dtype && theirs.count == mine.count) return ok_status();
    if (check_->is_send) {
      return invalid_argument_error(
          "point-to-point mismatch on {}: rank {} sent {} to rank {}, but rank {} posted recv of {}; a send and "
          "its receive must agree on dtype and size",
          check_->description, mine.rank, mine.describe(), theirs.rank, theirs.rank, theirs.describe());
    }
    return invalid_argument_error(
        "point-to-point mismatch on {}: rank {} posted recv of {} from rank {}, but rank {}'s send is {}; "
        "a send and its receive must agree on dtype and size",
        check_->description, mine.rank, mine.describe(), theirs.rank, theirs.rank, theirs.describe());
  }

  Status finish(Status status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!result_) {
      result_ = status;
      recorder_->finish(record_, status);
    }
    return *result_;
  }

  const bool is_send_;
  const std::shared_ptr<TransportWork> inner_;
  const Deadline deadline_;
  const std::string what_;
  const std::shared_ptr<FlightRecorder> recorder_;
  const uint64_t record_;
  std::unique_ptr<P2PCheck> check_;
  std::mutex mutex_;
  std::optional<Status> result_;

  // Dropped sends still under way (with their debug checks' transfers and buffers), kept until
  // done or, at their deadline, cancelled as a wait() past it would (swept at each call, so a send
  // whose receive never comes is not kept for ever).
  struct DroppedSend {
    std::shared_ptr<TransportWork> inner;
    std::unique_ptr<P2PCheck> check;
    Deadline deadline;
    bool done() const {
      return inner->is_completed() && (!check || (check->header->is_completed() && check->reply->is_completed()));
    }
  };
  static void keep_until_done(std::shared_ptr<TransportWork> inner, std::unique_ptr<P2PCheck> check,
                              Deadline deadline) {
    static std::mutex mutex;
    static auto* kept = new std::vector<DroppedSend>();  // never destroyed: sends may outlive main
    std::lock_guard<std::mutex> lock(mutex);
    kept->erase(std::remove_if(kept->begin(), kept->end(),
                               [](DroppedSend& k) {
                                 if (k.done()) return true;
                                 if (!k.deadline.expired()) return false;
                                 const Status late = deadline_exceeded_error(
                                     "a dropped send timed out after {}", format_duration(k.deadline.budget()));
                                 k.inner->cancel(late);
                                 if (k.check) {
                                   k.check->header->cancel(late);
                                   k.check->reply->cancel(late);
                                 }
                                 return true;
                               }),
                kept->end());
    kept->push_back(DroppedSend{std::move(inner), std::move(check), deadline});
  }
};

}  // namespace

Communicator::Communicator(std::string kind, std::shared_ptr<CommWorld> world, std::vector<int> global_ranks,
                           int rank, uint64_t context_id, CommunicatorOptions options)
    : kind_(std::move(kind)),
      world_(std::move(world)),
      global_ranks_(std::move(global_ranks)),
      rank_(rank),
      context_id_(context_id),
      options_(options),
      algorithm_(options.algorithm),
      debug_checks_(options.debug_checks || env_debug_detail()),
      recorder_(std::make_shared<FlightRecorder>(options.flight_recorder_size)),
      // Device memory queries and pinned allocations on the executor then use the rank's GPU's
      // context (cuda_device_ is set below, before any collective is issued).
      runner_([this] { set_current_cuda_device(cuda_device_); }) {
  cuda_device_ = options.cuda_device >= 0 ? options.cuda_device : default_cuda_device();
  description_ =
      fmt::format("{} communicator (context {}, rank {} of {})", kind_, context_id_, rank_, size());
  // Nodes in order of their lowest rank; ranks within a node in rank order.
  std::vector<std::string> nodes;
  const std::string& my_node = world_->node_ids[global_ranks_[rank_]];
  intra_size_ = 0;
  for (int r = 0; r < size(); ++r) {
    const std::string& node = world_->node_ids[global_ranks_[r]];
    if (std::find(nodes.begin(), nodes.end(), node) == nodes.end()) nodes.push_back(node);
    if (node == my_node) {
      if (r < rank_) ++intra_rank_;
      ++intra_size_;
    }
  }
  inter_size_ = static_cast<int>(nodes.size());
  inter_rank_ = static_cast<int>(std::find(nodes.begin(), nodes.end(), my_node) - nodes.begin());
  // An unparsable COHORT_ALGO is reported by the collectives' selector; here it just forces nothing.
  if (const char* value = std::getenv(kAlgorithmEnvironmentVariable); value != nullptr && *value != '\0') {
    StatusOr<Algorithm> parsed = parse_algorithm(value);
    if (parsed.ok()) environment_algorithm_ = *parsed;
  }
  if (is_path_choice(algorithm_)) {
    path_choice_ = algorithm_;
  } else if (algorithm_ == Algorithm::kAuto && is_path_choice(environment_algorithm_)) {
    path_choice_ = environment_algorithm_;
  }
  register_flight_recorder(recorder_, global_ranks_[rank_], context_id_, description_);
  install_flight_recorder_signal_from_environment();
}

Communicator::~Communicator() { stop_executor(); }

void Communicator::stop_executor() { runner_.stop(); }

const std::string& Communicator::description() const { return description_; }

Algorithm Communicator::algorithm_for(Collective collective) const {
  // A forced algorithm applies to the collectives it implements; the others keep the selector's
  // choice (which also honours COHORT_ALGO the same way), so forcing "ring" never breaks broadcast.
  if (is_path_choice(algorithm_)) return Algorithm::kAuto;
  return implements(collective, algorithm_) ? algorithm_ : Algorithm::kAuto;
}

Communicator::ShmRoute Communicator::shm_route(Collective collective) const {
  if (size() < 2 || size() > kShmMaxRanks || inter_size_ != 1 || path_choice_ == Algorithm::kTransport) {
    return ShmRoute::kTransport;
  }
  if (path_choice_ == Algorithm::kShm) return ShmRoute::kForced;
  // A forced transport algorithm keeps the collectives it implements on the transport.
  if (algorithm_ != Algorithm::kAuto && implements(collective, algorithm_)) return ShmRoute::kTransport;
  if (algorithm_ == Algorithm::kAuto && environment_algorithm_ != Algorithm::kAuto &&
      !is_path_choice(environment_algorithm_) && implements(collective, environment_algorithm_)) {
    return ShmRoute::kTransport;
  }
  // Loopback ranks are threads of this process: nothing to gain, and their fault tests
  // simulate failures the transport knows about.
  if (world_->transport->name() == "loopback") return ShmRoute::kTransport;
  return ShmRoute::kBySize;
}

StatusOr<SharedMemoryEngine*> Communicator::shared_memory(Collective collective, size_t bytes,
                                                          Deadline deadline) {
  if (shm_state_ == ShmState::kUnavailable) return nullptr;
  ShmRoute& route = shm_routes_[static_cast<size_t>(collective)];
  if (route == ShmRoute::kUnknown) route = shm_route(collective);  // once per collective
  if (route == ShmRoute::kTransport) return nullptr;
  const bool forced = route == ShmRoute::kForced;
  if (!forced) {
    static const AlgorithmSelector selector;
    if (!selector.prefer_shared_memory(collective, bytes, size())) return nullptr;
  }
  if (shm_state_ == ShmState::kUndecided) {
    shm_state_ = ShmState::kUnavailable;  // until it works; a failed setup is not retried
    using Body = std::function<Status(CollectiveContext&)>;
    StatusOr<std::unique_ptr<SharedMemoryEngine>> created = SharedMemoryEngine::create(
        rank_, size(), description_,
        [&](const Body& body) { return run_collective("shared-memory setup", deadline, body); }, deadline);
    if (!created.ok()) {
      if (created.status().code() != StatusCode::kFailedPrecondition) return created.status();
      // Every rank got this answer together: all use the transport from now on.
      spdlog::warn("{}: intra-node shared memory unavailable, using the transport: {}", description_,
                   created.status().message());
      return nullptr;
    }
    shm_ = std::move(*created);
    shm_state_ = ShmState::kReady;
  }
  if (!forced && shm_->in_process()) return nullptr;
  return shm_.get();
}

Deadline Communicator::deadline_for(const CallOptions& call) const {
  return Deadline::after(call.timeout.value_or(options_.timeout));
}

uint8_t* Communicator::staging(size_t bytes) {
  if (staging_.size() < bytes) staging_.resize(bytes);
  return staging_.data();
}

Status Communicator::check_root(int root) const {
  if (root < 0 || root >= size()) {
    return invalid_argument_error("root {} is out of range for {} (valid: 0..{})", root, description(),
                                  size() - 1);
  }
  return ok_status();
}

Status Communicator::check_counts(const std::vector<size_t>& counts, const char* what) const {
  if (static_cast<int>(counts.size()) != size()) {
    return invalid_argument_error("{} has {} entries but {} has {} ranks", what, counts.size(), description(),
                                  size());
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Execution: inline or queued (runner_), recording and error context.

template <typename Body>
std::shared_ptr<Work> Communicator::submit(const OpInfo& info, const CallOptions& call, Body&& body) {
  const Duration timeout = call.timeout.value_or(options_.timeout);
  // A blocking call with nothing queued runs here (see ordered_runner.h for why issue order holds).
  if (call.blocking && runner_.try_run_inline()) {
    // One clock reading starts the deadline, the record and the blocked time; one ends them.
    const Clock::time_point start = clock_.now();
    Clock::time_point end;
    Status status = run_recorded(sequence_, info, timeout, start, body, &end);
    // Under the token (see inline_blocked_ns_); never negative, as clock_ never goes back.
    inline_blocked_ns_.store(inline_blocked_ns_.load(std::memory_order_relaxed) +
                                 std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count(),
                             std::memory_order_relaxed);
    runner_.end_inline();
    return status.ok() ? completed_ok_work() : completed_work(std::move(status));
  }
  // The deadline starts when the operation starts running, not when it is queued: a bucket queued
  // behind others must not time out for waiting its turn.
  auto work = std::make_shared<CompletionWork>(blocked_ns_);
  std::function<Status()> task = [this, info, timeout, body = std::forward<Body>(body)] {
    return run_recorded(sequence_, info, timeout, clock_.now(), body, nullptr);
  };
  if (Status queued = runner_.enqueue(std::move(task), work); !queued.ok()) {
    return completed_work(queued.with_context(fmt::format("{} ({}) on {}", info.op, info.detail(), description())));
  }
  if (call.blocking) work->wait().ignore_error();
  return work;
}

template <typename Body>
Status Communicator::run_recorded(uint64_t sequence_hint, const OpInfo& info, Duration timeout,
                                  Clock::time_point start, const Body& body, Clock::time_point* end) {
  const Deadline deadline = Deadline::after(timeout, start);
  // The run token's holder is the collectives' only recorder: the lock-free lane.
  uint64_t id = recorder_->start_exclusive(sequence_hint, info, start);
  Status status;
  if (debug_checks_) status = cross_check(info.signature(), deadline);
  if (status.ok()) status = body(deadline);
  const Clock::time_point finished = clock_.now();
  if (end != nullptr) *end = finished;
  recorder_->finish_exclusive(id, status, finished);
  if (status.ok()) return status;
  std::string suffix = failed_peers();
  if (status.code() == StatusCode::kDeadlineExceeded) {
    // A timeout explains itself: the error carries the flight recorder (also logged, for
    // operators who never see the exception).
    std::string dump = recorder_->dump();
    spdlog::error("{} #{} on {} timed out; last operations of this communicator:\n{}", info.op, sequence_hint,
                  description(), dump);
    suffix += "\nlast operations of this communicator:\n" + dump;
    dump_flight_recorders_on_timeout();
  }
  return status
      .with_context(fmt::format("{} #{} ({}) on {}", info.op, sequence_hint, info.detail(), description()))
      .with_suffix(suffix);
}

std::string Communicator::failed_peers() const {
  // A rank often fails while waiting on a neighbour that itself failed because of a dead rank
  // further away; naming every peer the transport knows is dead points at the real cause.
  std::string dead;
  for (int r = 0; r < size(); ++r) {
    if (r == rank_) continue;
    Status peer = world_->transport->peer_status(global_ranks_[r]);
    if (!peer.ok()) dead += fmt::format("{}{}", dead.empty() ? "" : ", ", r);
  }
  return dead.empty() ? "" : fmt::format(" [ranks known to have failed: {}]", dead);
}

Status Communicator::cross_check(const std::string& signature, Deadline deadline) {
  std::vector<char> mine(kSignatureBytes, '\0');
  std::memcpy(mine.data(), signature.data(), std::min(signature.size(), kSignatureBytes - 1));
  std::vector<char> all(kSignatureBytes * size());
  uint64_t sequence = sequence_;
  COHORT_RETURN_IF_ERROR(run_collective("debug cross-check", deadline, [&](CollectiveContext& ctx) {
    return run_allgatherv(ctx, mine.data(), all.data(), std::vector<size_t>(size(), kSignatureBytes));
  }));
  for (int r = 0; r < size(); ++r) {
    std::string theirs(all.data() + r * kSignatureBytes);
    if (theirs != mine.data()) {
      return invalid_argument_error(
          "collective mismatch at sequence {}: rank {} called {} but rank {} called {} (every rank must "
          "issue the "
          "same collectives in the same order)",
          sequence, rank_, mine.data(), r, theirs);
    }
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Collectives.

Status Communicator::allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op,
                                        Deadline deadline) {
  return run_collective("allreduce", deadline, [&](CollectiveContext& ctx) {
    return run_allreduce(ctx, buf, count, dtype, op, algorithm_for(Collective::kAllreduce));
  });
}

bool DeviceCall::all_device() const {
  bool send_ok = in_place() || send_bytes == 0 || is_device_memory(send);
  bool recv_ok = recv_bytes == 0 || is_device_memory(recv);
  return send_ok && recv_ok;
}

Status DeviceCall::check_all_device(const std::string& who) const {
  if (all_device()) return ok_status();
  bool send_on_host = !in_place() && send_bytes > 0 && !is_device_memory(send);
  return invalid_argument_error(
      "{} on {}: the {} buffer is host memory while the call has device buffers; this kind runs device calls "
      "on "
      "NCCL, which needs every buffer in device memory (copy it to the GPU, or pass host buffers only)",
      collective_name(collective), who, send_on_host ? "send" : "receive");
}

Status Communicator::device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host) {
  // One pinned buffer: recv's host copy, then send's. Host buffers among the arguments are copied
  // with memcpy, so host and device buffers may be mixed.
  const bool in_place = call.in_place();
  const size_t send_bytes = in_place ? 0 : call.send_bytes;
  if (pinned_ == nullptr) pinned_ = std::make_unique<PinnedBuffer>();
  COHORT_ASSIGN_OR_RETURN(void* base, pinned_->reserve(call.recv_bytes + send_bytes));
  uint8_t* host_recv = static_cast<uint8_t*>(base);
  uint8_t* host_send = host_recv + call.recv_bytes;
  if (in_place || !call.recv_is_output) {
    COHORT_RETURN_IF_ERROR(stage_in(host_recv, call.recv, call.recv_bytes).with_context("staging to host"));
  }
  if (send_bytes > 0)
    COHORT_RETURN_IF_ERROR(stage_in(host_send, call.send, send_bytes).with_context("staging to host"));
  COHORT_RETURN_IF_ERROR(host(in_place ? nullptr : host_send, host_recv));
  if (!call.recv_is_output) return ok_status();
  return stage_out(call.recv, host_recv, call.recv_bytes).with_context("staging back to the device");
}

std::shared_ptr<TransportWork> Communicator::device_transfer(bool is_send, int peer, uint64_t wire_tag,
                                                             void* buf, size_t bytes) {
  auto host = std::make_unique<std::vector<uint8_t>>(bytes);
  if (is_send) {
    // The send is posted with the device buffer's values as of now, like a host send.
    Status staged = copy_to_host(host->data(), buf, bytes);
    if (!staged.ok())
      return std::make_shared<FailedTransferWork>(staged.with_context("staging a send to host"));
    auto inner = world_->transport->isend(global_ranks_[peer], wire_tag, host->data(), bytes);
    return std::make_shared<StagedTransferWork>(std::move(inner), std::move(host), nullptr);
  }
  auto inner = world_->transport->irecv(global_ranks_[peer], wire_tag, host->data(), bytes);
  return std::make_shared<StagedTransferWork>(std::move(inner), std::move(host), buf);
}

std::shared_ptr<Work> Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                                              ReduceOp op, const CallOptions& call) {
  Status valid = check_reduce_op(dtype, op);
  if (valid.ok()) valid = check_buffer(recv, count, "allreduce receive");
  if (!valid.ok()) return completed_work(valid.with_context("allreduce on " + description()));
  size_t bytes = count * element_size(dtype);
  return submit(OpInfo{"allreduce", static_cast<int>(dtype), count, "", static_cast<int>(op), -1}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* s, void* r) -> Status {
                    ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kAllreduce, bytes, deadline));
                    if (shm != nullptr) {
                      COHORT_RETURN_IF_ERROR(shm->allreduce(s, r, count, dtype, base, -1, deadline));
                      if (op == ReduceOp::kAvg) scale_for_average(r, count, dtype, size());
                      return ok_status();
                    }
                    if (s != nullptr && s != r && bytes > 0) std::memcpy(r, s, bytes);
                    COHORT_RETURN_IF_ERROR(allreduce_sum_like(r, count, dtype, base, deadline));
                    if (op == ReduceOp::kAvg) scale_for_average(r, count, dtype, size());
                    return ok_status();
                  };
                  if (bytes == 0 || !any_device(send, recv)) return host(send, recv);
                  DeviceCall device{
                      Collective::kAllreduce, send, recv, count, {}, {}, dtype, op, -1, bytes, bytes};
                  return device_collective(device, deadline, host);
                });
}

std::shared_ptr<Work> Communicator::reduce(const void* send, void* recv, size_t count, DataType dtype,
                                           ReduceOp op, int root, const CallOptions& call) {
  Status valid = check_reduce_op(dtype, op);
  if (valid.ok()) valid = check_root(root);
  if (valid.ok() && rank_ == root) valid = check_buffer(recv, count, "reduce receive");
  if (valid.ok() && rank_ != root && send == nullptr) valid = check_buffer(recv, count, "reduce send");
  if (!valid.ok()) return completed_work(valid.with_context("reduce on " + description()));
  size_t bytes = count * element_size(dtype);
  // The input, whatever the call's form; recv matters at the root only.
  const void* input = send != nullptr ? send : recv;
  return submit(OpInfo{"reduce", static_cast<int>(dtype), count, "", static_cast<int>(op), root}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* s, void* r) -> Status {
                    const void* in = s != nullptr ? s : r;
                    ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kReduce, bytes, deadline));
                    if (shm != nullptr) {
                      COHORT_RETURN_IF_ERROR(
                          shm->allreduce(in, rank_ == root ? r : nullptr, count, dtype, base, root, deadline));
                      if (op == ReduceOp::kAvg && rank_ == root) scale_for_average(r, count, dtype, size());
                      return ok_status();
                    }
                    // Non-roots reduce in staging so their input is never clobbered.
                    void* buf = rank_ == root ? r : staging(bytes);
                    if (in != buf && bytes > 0) std::memcpy(buf, in, bytes);
                    COHORT_RETURN_IF_ERROR(run_collective("reduce", deadline, [&](CollectiveContext& ctx) {
                      return run_reduce(ctx, buf, count, dtype, base, root,
                                        algorithm_for(Collective::kReduce));
                    }));
                    if (op == ReduceOp::kAvg && rank_ == root) scale_for_average(r, count, dtype, size());
                    return ok_status();
                  };
                  void* out = rank_ == root ? recv : nullptr;
                  if (bytes == 0 || !any_device(input, out)) return host(send, recv);
                  DeviceCall device{Collective::kReduce,
                                    input == recv ? nullptr : input,
                                    recv,
                                    count,
                                    {},
                                    {},
                                    dtype,
                                    op,
                                    root,
                                    bytes,
                                    rank_ == root || input == recv ? bytes : 0};
                  return device_collective(device, deadline, host);
                });
}

std::shared_ptr<Work> Communicator::broadcast(void* buf, size_t count, DataType dtype, int root,
                                              const CallOptions& call) {
  Status valid = check_root(root);
  if (valid.ok()) valid = check_buffer(buf, count, "broadcast");
  if (!valid.ok()) return completed_work(valid.with_context("broadcast on " + description()));
  size_t bytes = count * element_size(dtype);
  return submit(OpInfo{"broadcast", static_cast<int>(dtype), count, "", -1, root}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* /*send*/, void* r) -> Status {
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kBroadcast, bytes, deadline));
                    if (shm != nullptr) return shm->broadcast(r, bytes, root, deadline);
                    return run_collective("broadcast", deadline, [&](CollectiveContext& ctx) {
                      return run_broadcast(ctx, r, bytes, root, algorithm_for(Collective::kBroadcast));
                    });
                  };
                  if (bytes == 0 || !any_device(nullptr, buf)) return host(nullptr, buf);
                  // The root's buffer is input only; the others' output only.
                  DeviceCall device{Collective::kBroadcast,
                                    rank_ == root ? nullptr : kNoInput,
                                    buf,
                                    count,
                                    {},
                                    {},
                                    dtype,
                                    ReduceOp::kSum,
                                    root,
                                    0,
                                    bytes,
                                    rank_ != root};
                  return device_collective(device, deadline, host);
                });
}

// Per-rank element counts as a collective's body reads them, with no allocation on the hot path:
// one count for every rank (allgather, reduce_scatter), the caller's vector for a blocking call
// (its body runs before the call returns), or a copy for an asynchronous one (the caller may free
// its vector first).
class Communicator::RankCounts {
 public:
  static RankCounts uniform(size_t count) {
    RankCounts counts;
    counts.uniform_ = count;
    return counts;
  }
  static RankCounts of(const std::vector<size_t>& counts, bool blocking) {
    RankCounts result;
    if (blocking) {
      result.borrowed_ = &counts;
    } else {
      result.owned_ = counts;
    }
    return result;
  }

  size_t at(int rank) const {
    if (uniform_) return *uniform_;
    return borrowed_ != nullptr ? (*borrowed_)[rank] : owned_[rank];
  }
  // The counts of `ranks` ranks as a vector; the uniform form fills `*scratch` and returns it.
  const std::vector<size_t>& get(int ranks, std::vector<size_t>* scratch) const {
    if (uniform_) {
      scratch->assign(ranks, *uniform_);
      return *scratch;
    }
    return borrowed_ != nullptr ? *borrowed_ : owned_;
  }

 private:
  std::optional<size_t> uniform_;
  const std::vector<size_t>* borrowed_ = nullptr;
  std::vector<size_t> owned_;
};

const std::vector<size_t>& Communicator::byte_counts(const std::vector<size_t>& counts,
                                                     size_t element_bytes) {
  bytes_scratch_.resize(counts.size());
  for (size_t r = 0; r < counts.size(); ++r) bytes_scratch_[r] = counts[r] * element_bytes;
  return bytes_scratch_;
}

std::shared_ptr<Work> Communicator::allgather(const void* send, void* recv, size_t count, DataType dtype,
                                              const CallOptions& call) {
  return allgather_of(send, recv, RankCounts::uniform(count), count * size(), dtype, call);
}

std::shared_ptr<Work> Communicator::allgatherv(const void* send, void* recv,
                                               const std::vector<size_t>& recv_counts, DataType dtype,
                                               const CallOptions& call) {
  Status valid = check_counts(recv_counts, "allgatherv recv_counts");
  if (!valid.ok()) return completed_work(valid.with_context("allgather on " + description()));
  return allgather_of(send, recv, RankCounts::of(recv_counts, call.blocking),
                      std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}), dtype, call);
}

std::shared_ptr<Work> Communicator::allgather_of(const void* send, void* recv, RankCounts counts,
                                                 size_t total, DataType dtype, const CallOptions& call) {
  // send == recv is the in-place form (this rank's block of recv is the input), as null send.
  if (send == recv) send = nullptr;
  Status valid = check_buffer(recv, total, "allgather receive");
  if (!valid.ok()) return completed_work(valid.with_context("allgather on " + description()));
  size_t esize = element_size(dtype);
  return submit(
      OpInfo{"allgather", static_cast<int>(dtype), total, " total", -1, -1}, call,
      [=, counts = std::move(counts)](Deadline deadline) -> Status {
        // The body holds the run token: the scratch vectors are this call's.
        const std::vector<size_t>& recv_counts = counts.get(size(), &counts_scratch_);
        const std::vector<size_t>& bytes = byte_counts(recv_counts, esize);
        const size_t offset = std::accumulate(bytes.begin(), bytes.begin() + rank_, size_t{0});
        auto host = [&](const void* s, void* r) -> Status {
          // In place: this rank's block of recv is the input.
          const void* in = s != nullptr ? s : static_cast<const uint8_t*>(r) + offset;
          COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                  shared_memory(Collective::kAllgather, total * esize, deadline));
          if (shm != nullptr) return shm->gatherv(in, r, bytes, -1, deadline);
          return run_collective("allgather", deadline, [&](CollectiveContext& ctx) {
            return run_allgatherv(ctx, in, r, bytes, algorithm_for(Collective::kAllgather));
          });
        };
        if (total == 0 || !any_device(send, recv)) return host(send, recv);
        DeviceCall device{
            Collective::kAllgather, send,         recv, 0, {}, recv_counts, dtype, ReduceOp::kSum, -1,
            bytes[rank_],           total * esize};
        return device_collective(device, deadline, host);
      });
}

std::shared_ptr<Work> Communicator::gather(const void* send, void* recv, size_t count, DataType dtype,
                                           int root, const CallOptions& call) {
  return gatherv(send, recv, std::vector<size_t>(size(), count), dtype, root, call);
}

std::shared_ptr<Work> Communicator::gatherv(const void* send, void* recv,
                                            const std::vector<size_t>& recv_counts, DataType dtype, int root,
                                            const CallOptions& call) {
  Status valid = check_root(root);
  if (valid.ok()) valid = check_counts(recv_counts, "gatherv recv_counts");
  if (!valid.ok()) return completed_work(valid.with_context("gather on " + description()));
  size_t total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  if (rank_ == root) valid = check_buffer(recv, total, "gather receive");
  if (valid.ok()) valid = check_buffer(send, recv_counts[rank_], "gather send");
  if (!valid.ok()) return completed_work(valid.with_context("gather on " + description()));
  size_t esize = element_size(dtype);
  std::vector<size_t> bytes = to_bytes(recv_counts, esize);
  size_t recv_bytes = rank_ == root ? total * esize : 0;
  return submit(OpInfo{"gather", static_cast<int>(dtype), total, " total", -1, root}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* s, void* r) -> Status {
                    // Off the root, only this rank's count is certain: the size rule sees 0.
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kGather, 0, deadline));
                    if (shm != nullptr) return shm->gatherv(s, r, bytes, root, deadline);
                    return run_collective("gather", deadline, [&](CollectiveContext& ctx) {
                      return run_gatherv(ctx, s, r, bytes, root, algorithm_for(Collective::kGather));
                    });
                  };
                  if (total == 0 || !any_device(send, rank_ == root ? recv : nullptr))
                    return host(send, recv);
                  DeviceCall device{Collective::kGather, send,  recv,           0,    {},
                                    recv_counts,         dtype, ReduceOp::kSum, root, bytes[rank_],
                                    recv_bytes};
                  return device_collective(device, deadline, host);
                });
}

std::shared_ptr<Work> Communicator::scatter(const void* send, void* recv, size_t count, DataType dtype,
                                            int root, const CallOptions& call) {
  return scatterv(send, std::vector<size_t>(size(), count), recv, dtype, root, call);
}

std::shared_ptr<Work> Communicator::scatterv(const void* send, const std::vector<size_t>& send_counts,
                                             void* recv, DataType dtype, int root, const CallOptions& call) {
  Status valid = check_root(root);
  if (valid.ok()) valid = check_counts(send_counts, "scatterv send_counts");
  if (!valid.ok()) return completed_work(valid.with_context("scatter on " + description()));
  size_t total = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
  if (rank_ == root) valid = check_buffer(send, total, "scatter send");
  if (valid.ok()) valid = check_buffer(recv, send_counts[rank_], "scatter receive");
  if (!valid.ok()) return completed_work(valid.with_context("scatter on " + description()));
  size_t esize = element_size(dtype);
  std::vector<size_t> bytes = to_bytes(send_counts, esize);
  size_t send_bytes = rank_ == root ? total * esize : 0;
  return submit(OpInfo{"scatter", static_cast<int>(dtype), total, " total", -1, root}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* s, void* r) -> Status {
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kScatter, 0, deadline));
                    if (shm != nullptr) return shm->scatterv(s, r, bytes, root, deadline);
                    return run_collective("scatter", deadline, [&](CollectiveContext& ctx) {
                      return run_scatterv(ctx, s, r, bytes, root, algorithm_for(Collective::kScatter));
                    });
                  };
                  if (total == 0 || !any_device(rank_ == root ? send : nullptr, recv))
                    return host(send, recv);
                  // Off the root there is no input: a non-null placeholder keeps the call out of place.
                  const void* input = rank_ == root ? send : kNoInput;
                  DeviceCall device{
                      Collective::kScatter, input, recv,       0,           send_counts, {}, dtype,
                      ReduceOp::kSum,       root,  send_bytes, bytes[rank_]};
                  return device_collective(device, deadline, host);
                });
}

std::shared_ptr<Work> Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count,
                                                   DataType dtype, ReduceOp op, const CallOptions& call) {
  Status valid = check_reduce_op(dtype, op);
  if (!valid.ok()) return completed_work(valid.with_context("reduce_scatter on " + description()));
  return reduce_scatter_of(send, recv, RankCounts::uniform(recv_count), recv_count * size(), dtype, op, call);
}

std::shared_ptr<Work> Communicator::reduce_scatterv(const void* send, void* recv,
                                                    const std::vector<size_t>& recv_counts, DataType dtype,
                                                    ReduceOp op, const CallOptions& call) {
  Status valid = check_reduce_op(dtype, op);
  if (valid.ok()) valid = check_counts(recv_counts, "reduce_scatter recv_counts");
  if (!valid.ok()) return completed_work(valid.with_context("reduce_scatter on " + description()));
  return reduce_scatter_of(send, recv, RankCounts::of(recv_counts, call.blocking),
                           std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}), dtype, op,
                           call);
}

std::shared_ptr<Work> Communicator::reduce_scatter_of(const void* send, void* recv, RankCounts counts,
                                                      size_t total, DataType dtype, ReduceOp op,
                                                      const CallOptions& call) {
  Status valid = check_buffer(send, total, "reduce_scatter send");
  if (valid.ok()) valid = check_buffer(recv, counts.at(rank_), "reduce_scatter receive");
  if (!valid.ok()) return completed_work(valid.with_context("reduce_scatter on " + description()));
  size_t esize = element_size(dtype);
  return submit(
      OpInfo{"reduce_scatter", static_cast<int>(dtype), total, " total", static_cast<int>(op), -1}, call,
      [=, counts = std::move(counts)](Deadline deadline) -> Status {
        // The body holds the run token: the scratch vector is this call's.
        const std::vector<size_t>& recv_counts = counts.get(size(), &counts_scratch_);
        auto host = [&](const void* s, void* r) -> Status {
          ReduceOp base = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
          COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                  shared_memory(Collective::kReduceScatter, total * esize, deadline));
          if (shm != nullptr) {
            COHORT_RETURN_IF_ERROR(shm->reduce_scatterv(s, r, recv_counts, dtype, base, deadline));
            if (op == ReduceOp::kAvg) scale_for_average(r, recv_counts[rank_], dtype, size());
            return ok_status();
          }
          // The algorithm reduces in place over its input; work on a copy.
          uint8_t* buf = staging(total * esize);
          if (total > 0) std::memcpy(buf, s != nullptr ? s : r, total * esize);
          COHORT_RETURN_IF_ERROR(run_collective("reduce_scatter", deadline, [&](CollectiveContext& ctx) {
            return run_reduce_scatter(ctx, buf, r, recv_counts, dtype, base,
                                      algorithm_for(Collective::kReduceScatter));
          }));
          if (op == ReduceOp::kAvg) scale_for_average(r, recv_counts[rank_], dtype, size());
          return ok_status();
        };
        if (total == 0 || !any_device(send, recv)) return host(send, recv);
        // send == recv: recv holds the whole input, so it is staged whole.
        DeviceCall device{Collective::kReduceScatter,
                          send,
                          recv,
                          0,
                          {},
                          recv_counts,
                          dtype,
                          op,
                          -1,
                          total * esize,
                          (send == recv ? total : recv_counts[rank_]) * esize};
        return device_collective(device, deadline, host);
      });
}

std::shared_ptr<Work> Communicator::alltoall(const void* send, void* recv, size_t count, DataType dtype,
                                             const CallOptions& call) {
  std::vector<size_t> counts(size(), count);
  return alltoallv(send, counts, recv, counts, dtype, call);
}

std::shared_ptr<Work> Communicator::alltoallv(const void* send, const std::vector<size_t>& send_counts,
                                              void* recv, const std::vector<size_t>& recv_counts,
                                              DataType dtype, const CallOptions& call) {
  Status valid = check_counts(send_counts, "alltoallv send_counts");
  if (valid.ok()) valid = check_counts(recv_counts, "alltoallv recv_counts");
  size_t send_total = std::accumulate(send_counts.begin(), send_counts.end(), size_t{0});
  size_t recv_total = std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0});
  if (valid.ok()) valid = check_buffer(send, send_total, "alltoall send");
  if (valid.ok()) valid = check_buffer(recv, recv_total, "alltoall receive");
  if (valid.ok() && send == recv && send_total > 0) {
    valid = invalid_argument_error("alltoall cannot run in place: pass distinct send and receive buffers");
  }
  if (!valid.ok()) return completed_work(valid.with_context("alltoall on " + description()));
  size_t esize = element_size(dtype);
  std::vector<size_t> sbytes = to_bytes(send_counts, esize);
  std::vector<size_t> rbytes = to_bytes(recv_counts, esize);
  return submit(OpInfo{"alltoall", static_cast<int>(dtype), send_total, " sent", -1, -1}, call,
                [=](Deadline deadline) -> Status {
                  auto host = [&](const void* s, void* r) -> Status {
                    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm,
                                            shared_memory(Collective::kAlltoall, 0, deadline));
                    if (shm != nullptr) return shm->alltoallv(s, sbytes, r, rbytes, deadline);
                    return run_collective("alltoall", deadline, [&](CollectiveContext& ctx) {
                      return run_alltoallv(ctx, s, sbytes, r, rbytes, algorithm_for(Collective::kAlltoall));
                    });
                  };
                  if (!any_device(send, recv)) return host(send, recv);
                  DeviceCall device{Collective::kAlltoall, send,  recv,           0,  send_counts,
                                    recv_counts,           dtype, ReduceOp::kSum, -1, send_total * esize,
                                    recv_total * esize};
                  return device_collective(device, deadline, host);
                });
}

std::shared_ptr<Work> Communicator::barrier(const CallOptions& call) {
  return submit(OpInfo{"barrier"}, call, [=](Deadline deadline) -> Status {
    COHORT_ASSIGN_OR_RETURN(SharedMemoryEngine * shm, shared_memory(Collective::kBarrier, 0, deadline));
    if (shm != nullptr) return shm->barrier(deadline);
    return run_collective("barrier", deadline, [&](CollectiveContext& ctx) { return run_barrier(ctx); });
  });
}

// ---------------------------------------------------------------------------------------------
// Point to point.

std::shared_ptr<Work> Communicator::p2p(bool is_send, void* buf, size_t count, DataType dtype, int peer,
                                        uint32_t tag, const CallOptions& call) {
  const char* verb = is_send ? "send to" : "receive from";
  if (peer < 0 || peer >= size() || peer == rank_) {
    return completed_work(invalid_argument_error("{} rank {} on {}: the peer must be another rank in 0..{}",
                                                 verb, peer, description(), size() - 1));
  }
  if (tag > kMaxUserTag) {
    return completed_work(
        invalid_argument_error("{} rank {}: tag {} exceeds the maximum {}", verb, peer, tag, kMaxUserTag));
  }
  Status valid = check_buffer(buf, count, is_send ? "send" : "receive");
  if (!valid.ok()) return completed_work(valid);
  size_t bytes = count * element_size(dtype);
  uint64_t wire_tag = p2p_tag(context_id_, tag);
  int global_peer = global_ranks_[peer];
  OpInfo info;
  info.op = is_send ? "send" : "recv";
  info.dtype = static_cast<int>(dtype);
  info.count = count;
  info.peer = peer;
  info.tag = static_cast<int>(tag);
  const uint64_t record = recorder_->start(p2p_sequence_.fetch_add(1, std::memory_order_relaxed), info);
  std::unique_ptr<P2PCheck> check;
  // A checked transfer posts its header and payload back to back: another thread's transfer to
  // the same peer and tag must not slip in between.
  std::unique_lock<std::mutex> post_lock(p2p_post_mutex_, std::defer_lock);
  if (debug_checks_) {
    post_lock.lock();
    // The header goes first on the same tag, so it is matched before the payload.
    check = std::make_unique<P2PCheck>();
    check->is_send = is_send;
    check->peer = peer;
    check->description = description_;
    check->posted.rank = rank_;
    check->posted.dtype = static_cast<int32_t>(dtype);
    check->posted.tag = tag;
    check->posted.count = count;
    check->buffer = std::make_unique<P2PSignature>(check->posted);
    if (!is_send) check->buffer->magic = 0;  // overwritten by a real header
    check->header =
        is_send ? world_->transport->isend(global_peer, wire_tag, check->buffer.get(), sizeof(P2PSignature))
                : world_->transport->irecv(global_peer, wire_tag, check->buffer.get(), sizeof(P2PSignature));
    // The receive's signature goes back at once (it needs nothing from the sender); the send
    // posts its receive before the payload, so the reply never waits on the payload.
    const uint64_t reply_tag = p2p_check_reply_tag(context_id_, tag);
    check->reply_buffer = std::make_unique<P2PSignature>(check->posted);
    if (is_send) check->reply_buffer->magic = 0;  // overwritten by the receive's reply
    check->reply =
        is_send ? world_->transport->irecv(global_peer, reply_tag, check->reply_buffer.get(), sizeof(P2PSignature))
                : world_->transport->isend(global_peer, reply_tag, check->reply_buffer.get(), sizeof(P2PSignature));
  }
  std::shared_ptr<TransportWork> inner;
  if (bytes > 0 && any_device(buf, nullptr)) {
    inner = device_transfer(is_send, peer, wire_tag, buf, bytes);
  } else {
    inner = is_send ? world_->transport->isend(global_peer, wire_tag, buf, bytes)
                    : world_->transport->irecv(global_peer, wire_tag, buf, bytes);
  }
  return std::make_shared<P2PWork>(
      is_send, std::move(inner), deadline_for(call),
      fmt::format("{} rank {} ({}, tag {}) on {}", verb, peer, describe(dtype, count), tag, description()),
      recorder_, record, std::move(check));
}

std::shared_ptr<Work> Communicator::isend(const void* buf, size_t count, DataType dtype, int peer,
                                          uint32_t tag, const CallOptions& call) {
  return p2p(true, const_cast<void*>(buf), count, dtype, peer, tag, call);
}

std::shared_ptr<Work> Communicator::irecv(void* buf, size_t count, DataType dtype, int peer, uint32_t tag,
                                          const CallOptions& call) {
  return p2p(false, buf, count, dtype, peer, tag, call);
}

Status Communicator::send(const void* buf, size_t count, DataType dtype, int peer, uint32_t tag,
                          const CallOptions& call) {
  return isend(buf, count, dtype, peer, tag, call)->wait();
}

Status Communicator::recv(void* buf, size_t count, DataType dtype, int peer, uint32_t tag,
                          const CallOptions& call) {
  return irecv(buf, count, dtype, peer, tag, call)->wait();
}

// ---------------------------------------------------------------------------------------------
// Objects: a length, then the bytes.

StatusOr<std::string> Communicator::bcast_obj(const std::string& value, int root) {
  CallOptions blocking{std::nullopt, true};
  uint64_t length = value.size();
  COHORT_RETURN_IF_ERROR(broadcast(&length, 1, DataType::kInt64, root, blocking)->wait());
  std::string out = rank_ == root ? value : std::string(length, '\0');
  COHORT_RETURN_IF_ERROR(broadcast(out.data(), length, DataType::kUInt8, root, blocking)->wait());
  return out;
}

StatusOr<std::vector<std::string>> Communicator::allgather_obj(const std::string& value) {
  CallOptions blocking{std::nullopt, true};
  int64_t length = static_cast<int64_t>(value.size());
  std::vector<int64_t> lengths(size());
  COHORT_RETURN_IF_ERROR(allgather(&length, lengths.data(), 1, DataType::kInt64, blocking)->wait());
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  std::string all(std::accumulate(counts.begin(), counts.end(), size_t{0}), '\0');
  COHORT_RETURN_IF_ERROR(allgatherv(value.data(), all.data(), counts, DataType::kUInt8, blocking)->wait());
  std::vector<std::string> out;
  size_t offset = 0;
  for (size_t count : counts) {
    out.push_back(all.substr(offset, count));
    offset += count;
  }
  return out;
}

StatusOr<std::vector<std::string>> Communicator::gather_obj(const std::string& value, int root) {
  CallOptions blocking{std::nullopt, true};
  int64_t length = static_cast<int64_t>(value.size());
  std::vector<int64_t> lengths(size());
  COHORT_RETURN_IF_ERROR(gather(&length, lengths.data(), 1, DataType::kInt64, root, blocking)->wait());
  std::vector<size_t> counts(size(), 0);
  if (rank_ == root)
    counts.assign(lengths.begin(), lengths.end());
  else
    counts[rank_] = value.size();
  std::string all(rank_ == root ? std::accumulate(counts.begin(), counts.end(), size_t{0}) : 0, '\0');
  // Non-roots only need their own count right; the root's counts are authoritative.
  COHORT_RETURN_IF_ERROR(gatherv(value.data(), all.data(), counts, DataType::kUInt8, root, blocking)->wait());
  std::vector<std::string> out;
  if (rank_ != root) return out;
  size_t offset = 0;
  for (size_t count : counts) {
    out.push_back(all.substr(offset, count));
    offset += count;
  }
  return out;
}

StatusOr<double> Communicator::allreduce_obj(double value, ReduceOp op) {
  COHORT_RETURN_IF_ERROR(allreduce(&value, &value, 1, DataType::kFloat64, op, {std::nullopt, true})->wait());
  return value;
}

// ---------------------------------------------------------------------------------------------
// Groups.

StatusOr<std::unique_ptr<Communicator>> Communicator::split(int color, int key) {
  return split_as(color, key, kind_);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::split_as(int color, int key, const std::string& kind) {
  if (color < 0 && color != kUndefinedColor) {
    return invalid_argument_error("split color {} is negative; use a color >= 0 or kUndefinedColor", color);
  }
  CallOptions blocking{std::nullopt, true};
  // 1. Every rank learns every (color, key).
  int64_t mine[2] = {color, key};
  std::vector<int64_t> all(2 * size());
  COHORT_RETURN_IF_ERROR(
      allgather(mine, all.data(), 2, DataType::kInt64, blocking)->wait().with_context("split"));
  std::vector<int64_t> colors;
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] != kUndefinedColor) colors.push_back(all[2 * r]);
  }
  std::sort(colors.begin(), colors.end());
  colors.erase(std::unique(colors.begin(), colors.end()), colors.end());
  // 2. Rank 0 reserves one context id per color from the job-wide counter; everyone learns the base.
  int64_t base = 0;
  if (rank_ == 0 && !colors.empty()) {
    COHORT_ASSIGN_OR_RETURN(int64_t last,
                            world_->store->add(kContextCounterKey, static_cast<int64_t>(colors.size())));
    base = last - static_cast<int64_t>(colors.size()) + 1;
  }
  COHORT_RETURN_IF_ERROR(broadcast(&base, 1, DataType::kInt64, 0, blocking)->wait().with_context("split"));
  if (color == kUndefinedColor) return std::unique_ptr<Communicator>();
  // 3. Members of my color, ordered by (key, old rank).
  std::vector<int> members;
  for (int r = 0; r < size(); ++r) {
    if (all[2 * r] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
  std::vector<int> global;
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    global.push_back(global_ranks_[members[i]]);
    if (members[i] == rank_) new_rank = static_cast<int>(i);
  }
  uint64_t context =
      static_cast<uint64_t>(base) + (std::lower_bound(colors.begin(), colors.end(), color) - colors.begin());
  if (context > kMaxContextId) {
    return resource_exhausted_error("too many communicators: context id {} exceeds {}", context,
                                    kMaxContextId);
  }
  // The new communicator works on this rank's GPU, whichever thread calls split.
  CommunicatorOptions options = options_;
  options.cuda_device = cuda_device_;
  return make_communicator(kind, world_, std::move(global), new_rank, context, options);
}

StatusOr<std::unique_ptr<Communicator>> Communicator::new_group(const std::vector<int>& ranks) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return invalid_argument_error("new_group ranks contain duplicates");
  }
  if (!sorted.empty() && (sorted.front() < 0 || sorted.back() >= size())) {
    return invalid_argument_error("new_group rank out of range for {} (valid: 0..{})", description(),
                                  size() - 1);
  }
  auto position = std::find(ranks.begin(), ranks.end(), rank_);
  bool member = position != ranks.end();
  return split(member ? 0 : kUndefinedColor, member ? static_cast<int>(position - ranks.begin()) : 0);
}

}  // namespace cohort::comm
