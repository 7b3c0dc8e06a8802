#include "worker/comm/transport/nccl/nccl_transport.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <spdlog/spdlog.h>

#include "worker/comm/reduce/device_reduce.h"
#include "worker/comm/transport/nccl/cuda_check.h"
#include "worker/comm/transport/nccl/device_memory.h"
#include "worker/comm/transport/nccl/nccl_check.h"

namespace cohort::comm {
namespace {

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // SUM, then divided by our kernel (see the header).
    default:
      return ncclSum;
  }
}

// Makes `device` current on the calling thread for its lifetime: NCCL calls and our kernels must
// run with the communicator's device current, whichever thread (executor, caller) issues them.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// The device of NcclOptions::device = -1 (see default_cuda_device).
int default_device(int requested) {
  if (requested >= 0) return requested;
  return std::max(default_cuda_device(), 0);
}

// Byte offsets of consecutive blocks of counts[r] elements; one more entry than counts: the total.
std::vector<size_t> byte_offsets(const std::vector<size_t>& counts, size_t element_bytes) {
  std::vector<size_t> offsets(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) offsets[r + 1] = offsets[r] + counts[r] * element_bytes;
  return offsets;
}

// Enqueues the NCCL calls `body` makes as one group: NCCL launches them together, so sends and
// receives to many peers never wait on each other.
template <typename Body>
Status nccl_group(Body&& body) {
  COHORT_NCCL_RETURN_IF_ERROR(ncclGroupStart());
  Status status = body();
  Status end = COHORT_NCCL_CHECK(ncclGroupEnd());
  return status.ok() ? end : status;
}

// A device-to-device copy of this rank's own block, on the stream.
Status copy_own_block(void* to, const void* from, size_t bytes, cudaStream_t stream) {
  if (bytes == 0 || to == from) return ok_status();
  return COHORT_CUDA_CHECK(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream));
}

}  // namespace

int nccl_data_type(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUInt8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
  }
  return ncclUint8;
}

// ---------------------------------------------------------------------------------------------
// Core: the communicator, its stream and the queue of transfers not yet launched.

// Completion of one launched NCCL group (or collective): an event recorded after it on the stream.
struct LaunchedGroup {
  cudaEvent_t event = nullptr;
  ~LaunchedGroup() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

class NcclTransferWork;

struct NcclTransport::Core {
  int rank = 0;
  int size = 0;
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t default_stream_mark = nullptr;  // recorded on the legacy default stream per launch

  std::mutex mutex;                                    // guards everything below and every NCCL call
  std::optional<Status> aborted;                       // set once the communicator is aborted
  std::deque<std::weak_ptr<NcclTransferWork>> queued;  // posted, not launched, in posting order

  ~Core();

  // Polls ncclCommGetAsyncError until an in-progress call resolves (non-blocking communicators
  // return ncclInProgress from calls still being set up). Holds `mutex`.
  Status settle_locked(const char* what, Deadline deadline);
  // Aborts with `reason` unless already aborted. Holds `mutex`.
  void abort_locked(const Status& reason);
  // Launches every queued transfer as one NCCL group. Holds `mutex`.
  Status flush_locked();
  // Makes the stream wait for the work issued so far on the CUDA legacy default stream (where
  // torch's default stream and cudaMemcpy run), so buffers written there are ready. Holds `mutex`.
  Status follow_default_stream_locked();
  // Records an event after the work enqueued so far. Holds `mutex`.
  StatusOr<std::shared_ptr<LaunchedGroup>> record_locked();
  // One poll of a launched group: OK when done, nullopt while running, the error otherwise
  // (an asynchronous NCCL error aborts the communicator first).
  std::optional<Status> poll(const LaunchedGroup& group);
  // Waits for `group` until `deadline`; on expiry aborts the communicator when `abort_on_timeout`.
  Status wait_group(const LaunchedGroup& group, Deadline deadline, const std::string& what,
                    bool abort_on_timeout);
  // Validates a device buffer argument, and a counts argument (one entry per rank).
  Status check_device(const void* ptr, size_t bytes, const char* what) const;
  Status check_counts(const std::vector<size_t>& counts, const char* what) const;
  // Runs `enqueue` (NCCL calls on the stream) under the mutex, waits until NCCL has settled
  // them (a non-blocking communicator may return ncclInProgress before anything is on the
  // stream), runs `after` (our kernels that follow NCCL's on the stream), then waits for all.
  template <typename Enqueue, typename After>
  Status run(const std::string& what, Deadline deadline, Enqueue&& enqueue, After&& after);
  template <typename Enqueue>
  Status run(const std::string& what, Deadline deadline, Enqueue&& enqueue) {
    return run(what, deadline, std::forward<Enqueue>(enqueue), [] { return ok_status(); });
  }
};

// One isend/irecv. Queued → launched (with the group's event) → completed.
class NcclTransferWork final : public TransportWork, public std::enable_shared_from_this<NcclTransferWork> {
 public:
  NcclTransferWork(std::shared_ptr<NcclTransport::Core> core, bool is_send, int peer, void* data,
                   size_t bytes)
      : core_(std::move(core)), is_send_(is_send), peer_(peer), data_(data), bytes_(bytes) {}

  using Work::wait;
  Status wait(Duration timeout) override {
    Deadline deadline = Deadline::after(timeout);
    COHORT_RETURN_IF_ERROR(launch());
    std::shared_ptr<LaunchedGroup> group = launched_group();
    if (group == nullptr) return final_status();
    // Not aborting on the caller's timeout: the Work contract lets the transfer continue, and the
    // caller cancels (which aborts) when it gives up for good.
    Status status = core_->wait_group(*group, deadline, describe(), /*abort_on_timeout=*/false);
    if (status.code() == StatusCode::kDeadlineExceeded) return status;
    complete(status);
    return final_status();
  }

  bool is_completed() override {
    if (!launch().ok()) return true;
    std::shared_ptr<LaunchedGroup> group = launched_group();
    if (group == nullptr) return true;
    std::optional<Status> status = core_->poll(*group);
    if (!status.has_value()) return false;
    complete(*status);
    return true;
  }

  Status error() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return result_.value_or(ok_status());
  }

  void cancel(Status reason) override {
    std::shared_ptr<LaunchedGroup> group;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (result_.has_value()) return;
      if (group_ == nullptr) {
        // Still queued: it never reaches NCCL (flush skips completed transfers).
        result_ = std::move(reason);
        return;
      }
      group = group_;
    }
    // Finished meanwhile: nothing to stop.
    if (std::optional<Status> status = core_->poll(*group); status.has_value()) {
      complete(*status);
      return;
    }
    // Launched: NCCL cannot cancel one transfer, and the buffer must be free when cancel returns.
    std::lock_guard<std::mutex> lock(core_->mutex);
    core_->abort_locked(reason.with_context("NCCL transfer cancelled, communicator aborted"));
    complete(reason);
  }

  size_t received_bytes() const override { return bytes_; }

  // Called by Core::flush_locked (core mutex held).
  bool pending() {
    std::lock_guard<std::mutex> lock(mutex_);
    return !result_.has_value() && group_ == nullptr;
  }
  Status enqueue_locked() const {
    if (is_send_) {
      return COHORT_NCCL_CHECK(ncclSend(data_, bytes_, ncclUint8, peer_, core_->comm, core_->stream));
    }
    return COHORT_NCCL_CHECK(ncclRecv(data_, bytes_, ncclUint8, peer_, core_->comm, core_->stream));
  }
  void set_group(std::shared_ptr<LaunchedGroup> group) {
    std::lock_guard<std::mutex> lock(mutex_);
    group_ = std::move(group);
  }
  void complete(Status status) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!result_.has_value()) result_ = std::move(status);
  }

 private:
  // Launches the queued transfers (this one among them) if it has not been launched yet.
  Status launch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (result_.has_value() || group_ != nullptr) return ok_status();
    }
    Status status;
    {
      std::lock_guard<std::mutex> lock(core_->mutex);
      status = core_->flush_locked();
    }
    if (!status.ok()) complete(status);
    return status.ok() ? ok_status() : final_status();
  }
  std::shared_ptr<LaunchedGroup> launched_group() {
    std::lock_guard<std::mutex> lock(mutex_);
    return result_.has_value() ? nullptr : group_;
  }
  Status final_status() {
    std::lock_guard<std::mutex> lock(mutex_);
    Status status = result_.value_or(internal_error("NCCL transfer has no result"));
    return status.ok() ? status : status.with_context(describe());
  }
  std::string describe() const {
    return fmt::format("NCCL {} rank {} ({} bytes)", is_send_ ? "send to" : "receive from", peer_, bytes_);
  }

  const std::shared_ptr<NcclTransport::Core> core_;
  const bool is_send_;
  const int peer_;
  void* const data_;
  const size_t bytes_;
  std::mutex mutex_;
  std::shared_ptr<LaunchedGroup> group_;  // set once launched
  std::optional<Status> result_;
};

NcclTransport::Core::~Core() {
  DeviceGuard guard(device);
  if (comm != nullptr) {
    Deadline deadline = Deadline::after(kNcclFinalizeTimeout);
    Status status = COHORT_NCCL_CHECK(ncclCommFinalize(comm));
    if (status.ok()) status = settle_locked("ncclCommFinalize", deadline);
    if (status.ok()) {
      ncclCommDestroy(comm);
    } else {
      spdlog::warn("NCCL rank {}: finalize failed ({}); aborting the communicator", rank, status.to_string());
      ncclCommAbort(comm);
    }
    comm = nullptr;
  }
  if (default_stream_mark != nullptr) cudaEventDestroy(default_stream_mark);
  if (stream != nullptr) cudaStreamDestroy(stream);
}

Status NcclTransport::Core::follow_default_stream_locked() {
  COHORT_CUDA_RETURN_IF_ERROR(cudaEventRecord(default_stream_mark, cudaStreamLegacy));
  return COHORT_CUDA_CHECK(cudaStreamWaitEvent(stream, default_stream_mark, 0));
}

Status NcclTransport::Core::settle_locked(const char* what, Deadline deadline) {
  auto spin_until = Clock::now() + kNcclSpinTime;
  while (true) {
    ncclResult_t state = ncclSuccess;
    Status status = COHORT_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
    if (!status.ok()) return status;
    if (state == ncclSuccess) return ok_status();
    if (state != ncclInProgress) return nccl_call_status(state, what, __FILE__, __LINE__, comm);
    if (deadline.expired()) {
      return deadline_exceeded_error("{}: NCCL still in progress after {}", what,
                                     format_duration(deadline.budget()));
    }
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kNcclPollSleep);
    }
  }
}

void NcclTransport::Core::abort_locked(const Status& reason) {
  if (aborted.has_value()) return;
  aborted = reason.ok() ? aborted_error("NCCL communicator aborted") : reason;
  spdlog::error("NCCL rank {}: aborting the communicator: {}", rank, aborted->to_string());
  if (comm != nullptr) {
    DeviceGuard guard(device);
    ncclCommAbort(comm);
    comm = nullptr;
  }
}

Status NcclTransport::Core::flush_locked() {
  if (aborted.has_value()) return *aborted;
  std::vector<std::shared_ptr<NcclTransferWork>> batch;
  while (!queued.empty()) {
    std::shared_ptr<NcclTransferWork> work = queued.front().lock();
    queued.pop_front();
    if (work != nullptr && work->pending()) batch.push_back(std::move(work));
  }
  if (batch.empty()) return ok_status();
  DeviceGuard guard(device);
  Deadline deadline = Deadline::after(kDefaultCollectiveTimeout);
  Status status = follow_default_stream_locked();
  if (status.ok()) status = COHORT_NCCL_CHECK(ncclGroupStart());
  for (size_t i = 0; status.ok() && i < batch.size(); ++i) status = batch[i]->enqueue_locked();
  Status end = COHORT_NCCL_CHECK(ncclGroupEnd());
  if (status.ok()) status = end;
  if (status.ok()) status = settle_locked("ncclGroupEnd (send/recv)", deadline);
  StatusOr<std::shared_ptr<LaunchedGroup>> group =
      status.ok() ? record_locked() : StatusOr<std::shared_ptr<LaunchedGroup>>(status);
  if (!group.ok()) {
    // A failed launch leaves NCCL's state unknown: abort so no peer waits on a half-posted group.
    abort_locked(group.status());
    for (auto& work : batch) work->complete(group.status());
    return group.status();
  }
  for (auto& work : batch) work->set_group(*group);
  return ok_status();
}

StatusOr<std::shared_ptr<LaunchedGroup>> NcclTransport::Core::record_locked() {
  auto group = std::make_shared<LaunchedGroup>();
  COHORT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&group->event, cudaEventDisableTiming));
  COHORT_CUDA_RETURN_IF_ERROR(cudaEventRecord(group->event, stream));
  return group;
}

std::optional<Status> NcclTransport::Core::poll(const LaunchedGroup& group) {
  std::lock_guard<std::mutex> lock(mutex);
  if (aborted.has_value()) return *aborted;
  cudaError_t done = cudaEventQuery(group.event);
  if (done == cudaSuccess) return ok_status();
  if (done != cudaErrorNotReady) {
    Status status = cuda_call_status(done, "cudaEventQuery(group.event)", __FILE__, __LINE__);
    abort_locked(status);
    return status;
  }
  // Still running: has NCCL seen a failure (a peer gone, a network error)?
  ncclResult_t state = ncclSuccess;
  Status status = COHORT_NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
  if (status.ok() && state != ncclSuccess && state != ncclInProgress) {
    status = nccl_call_status(state, "NCCL asynchronous error", __FILE__, __LINE__, comm);
  }
  if (!status.ok()) {
    abort_locked(status);
    return *aborted;
  }
  return std::nullopt;
}

Status NcclTransport::Core::wait_group(const LaunchedGroup& group, Deadline deadline, const std::string& what,
                                       bool abort_on_timeout) {
  auto spin_until = Clock::now() + kNcclSpinTime;
  while (true) {
    if (std::optional<Status> status = poll(group); status.has_value()) return *status;
    if (deadline.expired()) {
      Status timeout = deadline_exceeded_error(
          "{}: timed out after {} on NCCL rank {} of {}; is every rank alive and issuing the matching call?",
          what, format_duration(deadline.budget()), rank, size);
      if (abort_on_timeout) {
        std::lock_guard<std::mutex> lock(mutex);
        abort_locked(timeout);
      }
      return timeout;
    }
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kNcclPollSleep);
    }
  }
}

Status NcclTransport::Core::check_device(const void* ptr, size_t bytes, const char* what) const {
  if (bytes == 0) return ok_status();
  if (ptr == nullptr) return invalid_argument_error("{} buffer is null but holds {} bytes", what, bytes);
  if (!is_device_memory(ptr)) {
    return invalid_argument_error(
        "{} buffer {} is host memory; NCCL needs CUDA device memory (use a host communicator kind, or stage "
        "it)",
        what, ptr);
  }
  return ok_status();
}

Status NcclTransport::Core::check_counts(const std::vector<size_t>& counts, const char* what) const {
  if (static_cast<int>(counts.size()) == size) return ok_status();
  return invalid_argument_error("{}: {} counts for {} ranks; pass one count per rank", what, counts.size(),
                                size);
}

template <typename Enqueue, typename After>
Status NcclTransport::Core::run(const std::string& what, Deadline deadline, Enqueue&& enqueue,
                                After&& after) {
  std::shared_ptr<LaunchedGroup> group;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (aborted.has_value()) return aborted->with_context(what);
    // Transfers queued before this collective go first: stream order is issue order.
    COHORT_RETURN_IF_ERROR(flush_locked());
    DeviceGuard guard(device);
    Status status = follow_default_stream_locked();
    if (status.ok()) status = enqueue();
    if (status.ok()) status = settle_locked(what.c_str(), deadline);
    if (status.ok()) status = after();
    if (!status.ok()) {
      abort_locked(status);
      return status.with_context(what);
    }
    StatusOr<std::shared_ptr<LaunchedGroup>> recorded = record_locked();
    if (!recorded.ok()) {
      abort_locked(recorded.status());
      return recorded.status().with_context(what);
    }
    group = std::move(*recorded);
  }
  Status status = wait_group(*group, deadline, what, /*abort_on_timeout=*/true);
  return status.ok() || status.code() == StatusCode::kDeadlineExceeded ? status : status.with_context(what);
}

// ---------------------------------------------------------------------------------------------
// NcclTransport.

NcclTransport::NcclTransport(std::shared_ptr<Core> core) : core_(std::move(core)) {}

NcclTransport::~NcclTransport() = default;  // Core finalizes when the last Work lets go

StatusOr<std::unique_ptr<NcclTransport>> NcclTransport::create(Store& store, int rank, int size,
                                                               NcclOptions options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return invalid_argument_error("NcclTransport: rank {} of {} is not a valid rank", rank, size);
  }
  int devices = cuda_device_count();
  if (devices <= 0) {
    return failed_precondition_error(
        "NcclTransport: no CUDA device is visible to rank {} (CUDA_VISIBLE_DEVICES='{}'); NCCL needs a GPU "
        "per rank",
        rank, std::getenv("CUDA_VISIBLE_DEVICES") != nullptr ? std::getenv("CUDA_VISIBLE_DEVICES") : "");
  }
  Deadline deadline = Deadline::after(options.init_timeout);
  auto core = std::make_shared<Core>();
  core->rank = rank;
  core->size = size;
  core->device = default_device(options.device);
  if (core->device >= devices) {
    return failed_precondition_error("NcclTransport: rank {} asked for CUDA device {} but sees {} device(s)",
                                     rank, core->device, devices);
  }

  // The unique id: made by rank 0, read by everyone else through the store.
  const std::string key = options.key_prefix + "/unique_id";
  ncclUniqueId id;
  if (rank == 0) {
    COHORT_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    COHORT_RETURN_IF_ERROR(store.set(key, std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)))
                               .with_context("NCCL bootstrap"));
  } else {
    StatusOr<std::string> value = store.get(key, deadline.remaining());
    if (!value.ok()) {
      return value.status().with_context(
          fmt::format("NCCL bootstrap: rank {} waiting for rank 0's unique id", rank));
    }
    if (value->size() != sizeof(id)) {
      return data_loss_error("NCCL bootstrap: store key {} holds {} bytes, expected an ncclUniqueId of {}",
                             key, value->size(), sizeof(id));
    }
    std::memcpy(&id, value->data(), sizeof(id));
  }

  DeviceGuard guard(core->device);
  COHORT_CUDA_RETURN_IF_ERROR(cudaSetDevice(core->device));
  COHORT_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&core->stream, cudaStreamNonBlocking));
  COHORT_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&core->default_stream_mark, cudaEventDisableTiming));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // nothing may block the host: see the file comment of the header
  Status status = COHORT_NCCL_CHECK(ncclCommInitRankConfig(&core->comm, size, id, rank, &config));
  if (status.ok()) status = core->settle_locked("ncclCommInitRankConfig", deadline);
  if (!status.ok()) {
    if (core->comm != nullptr) {
      ncclCommAbort(core->comm);
      core->comm = nullptr;
    }
    return status.with_context(
        fmt::format("NCCL communicator of {} ranks (rank {}, device {})", size, rank, core->device));
  }
  spdlog::debug("NCCL rank {} of {} ready on device {}", rank, size, core->device);
  return std::unique_ptr<NcclTransport>(new NcclTransport(std::move(core)));
}

int NcclTransport::rank() const { return core_->rank; }
int NcclTransport::size() const { return core_->size; }
int NcclTransport::device() const { return core_->device; }
void* NcclTransport::stream() const { return core_->stream; }

std::shared_ptr<TransportWork> NcclTransport::isend(int peer, uint64_t tag, const void* data, size_t bytes) {
  return enqueue(/*send=*/true, peer, tag, const_cast<void*>(data), bytes);
}

std::shared_ptr<TransportWork> NcclTransport::irecv(int peer, uint64_t tag, void* data, size_t bytes) {
  return enqueue(/*send=*/false, peer, tag, data, bytes);
}

std::shared_ptr<TransportWork> NcclTransport::enqueue(bool send, int peer, uint64_t tag, void* data,
                                                      size_t bytes) {
  auto work = std::make_shared<NcclTransferWork>(core_, send, peer, data, bytes);
  const char* what = send ? "NCCL send" : "NCCL receive";
  Status valid = peer < 0 || peer >= size() ? invalid_argument_error("{}: peer {} out of range", what, peer)
                 : tag > kTransportTagMask  ? invalid_argument_error("{}: tag {} too large", what, tag)
                                            : core_->check_device(data, bytes, what);
  std::lock_guard<std::mutex> lock(core_->mutex);
  if (valid.ok() && core_->aborted.has_value()) valid = *core_->aborted;
  if (!valid.ok() || bytes == 0) {
    work->complete(valid);
  } else {
    core_->queued.push_back(work);
  }
  return work;
}

Status NcclTransport::peer_status(int /*peer*/) {
  std::lock_guard<std::mutex> lock(core_->mutex);
  return core_->aborted.value_or(ok_status());
}

void NcclTransport::abort(const Status& reason) {
  std::lock_guard<std::mutex> lock(core_->mutex);
  core_->abort_locked(reason);
}

Status NcclTransport::allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                Deadline deadline) {
  const size_t bytes = count * element_size(dtype);
  if (send == nullptr) send = recv;
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, bytes, "NCCL allreduce receive"));
  COHORT_RETURN_IF_ERROR(core_->check_device(send, bytes, "NCCL allreduce send"));
  if (count == 0) return ok_status();
  return core_->run(
      fmt::format("NCCL allreduce ({} x {}, {})", data_type_name(dtype), count, reduce_op_name(op)), deadline,
      [&]() -> Status {
        return COHORT_NCCL_CHECK(ncclAllReduce(send, recv, count,
                                               static_cast<ncclDataType_t>(nccl_data_type(dtype)),
                                               nccl_op(op), core_->comm, core_->stream));
      },
      [&]() -> Status {
        if (op != ReduceOp::kAvg) return ok_status();
        return device_scale_for_average(recv, count, dtype, core_->size, core_->stream);
      });
}

Status NcclTransport::reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                             int root, Deadline deadline) {
  if (root < 0 || root >= size()) return invalid_argument_error("NCCL reduce: root {} out of range", root);
  const size_t bytes = count * element_size(dtype);
  if (send == nullptr) send = recv;
  COHORT_RETURN_IF_ERROR(core_->check_device(send, bytes, "NCCL reduce send"));
  if (rank() == root) COHORT_RETURN_IF_ERROR(core_->check_device(recv, bytes, "NCCL reduce receive"));
  if (count == 0) return ok_status();
  const bool is_root = rank() == root;
  return core_->run(
      fmt::format("NCCL reduce ({} x {}, {}, root {})", data_type_name(dtype), count, reduce_op_name(op),
                  root),
      deadline,
      [&]() -> Status {
        return COHORT_NCCL_CHECK(ncclReduce(send, recv, count,
                                            static_cast<ncclDataType_t>(nccl_data_type(dtype)), nccl_op(op),
                                            root, core_->comm, core_->stream));
      },
      [&]() -> Status {
        if (op != ReduceOp::kAvg || !is_root) return ok_status();
        return device_scale_for_average(recv, count, dtype, core_->size, core_->stream);
      });
}

Status NcclTransport::broadcast(void* buf, size_t count, DataType dtype, int root, Deadline deadline) {
  if (root < 0 || root >= size()) return invalid_argument_error("NCCL broadcast: root {} out of range", root);
  COHORT_RETURN_IF_ERROR(core_->check_device(buf, count * element_size(dtype), "NCCL broadcast"));
  if (count == 0) return ok_status();
  return core_->run(fmt::format("NCCL broadcast ({} x {}, root {})", data_type_name(dtype), count, root),
                    deadline, [&]() -> Status {
                      return COHORT_NCCL_CHECK(
                          ncclBroadcast(buf, buf, count, static_cast<ncclDataType_t>(nccl_data_type(dtype)),
                                        root, core_->comm, core_->stream));
                    });
}

Status NcclTransport::allgather(const void* send, void* recv, size_t count, DataType dtype,
                                Deadline deadline) {
  const size_t bytes = count * element_size(dtype);
  // In place: this rank's block of recv.
  if (send == nullptr) send = static_cast<const uint8_t*>(recv) + bytes * rank();
  COHORT_RETURN_IF_ERROR(core_->check_device(send, bytes, "NCCL allgather send"));
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, bytes * size(), "NCCL allgather receive"));
  if (count == 0) return ok_status();
  return core_->run(fmt::format("NCCL allgather ({} x {} per rank)", data_type_name(dtype), count), deadline,
                    [&]() -> Status {
                      return COHORT_NCCL_CHECK(
                          ncclAllGather(send, recv, count, static_cast<ncclDataType_t>(nccl_data_type(dtype)),
                                        core_->comm, core_->stream));
                    });
}

Status NcclTransport::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                     ReduceOp op, Deadline deadline) {
  const size_t bytes = recv_count * element_size(dtype);
  COHORT_RETURN_IF_ERROR(core_->check_device(send, bytes * size(), "NCCL reduce_scatter send"));
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, bytes, "NCCL reduce_scatter receive"));
  if (recv_count == 0) return ok_status();
  return core_->run(
      fmt::format("NCCL reduce_scatter ({} x {} per rank, {})", data_type_name(dtype), recv_count,
                  reduce_op_name(op)),
      deadline,
      [&]() -> Status {
        return COHORT_NCCL_CHECK(ncclReduceScatter(send, recv, recv_count,
                                                   static_cast<ncclDataType_t>(nccl_data_type(dtype)),
                                                   nccl_op(op), core_->comm, core_->stream));
      },
      [&]() -> Status {
        if (op != ReduceOp::kAvg) return ok_status();
        return device_scale_for_average(recv, recv_count, dtype, core_->size, core_->stream);
      });
}

Status NcclTransport::allgatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts,
                                 DataType dtype, Deadline deadline) {
  COHORT_RETURN_IF_ERROR(core_->check_counts(recv_counts, "NCCL allgatherv"));
  const size_t esize = element_size(dtype);
  const std::vector<size_t> offset = byte_offsets(recv_counts, esize);
  uint8_t* out = static_cast<uint8_t*>(recv);
  if (send == nullptr) send = out + offset[rank()];
  COHORT_RETURN_IF_ERROR(core_->check_device(send, recv_counts[rank()] * esize, "NCCL allgatherv send"));
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, offset.back(), "NCCL allgatherv receive"));
  if (offset.back() == 0) return ok_status();
  return core_->run(
      fmt::format("NCCL allgatherv ({} x {} total)", data_type_name(dtype), offset.back() / esize), deadline,
      [&]() {
        return nccl_group([&]() -> Status {
          // Every rank broadcasts its block into everyone's recv.
          for (int r = 0; r < size(); ++r) {
            if (recv_counts[r] == 0) continue;
            const void* from = r == rank() ? send : out + offset[r];
            COHORT_NCCL_RETURN_IF_ERROR(ncclBroadcast(from, out + offset[r], recv_counts[r] * esize,
                                                      ncclUint8, r, core_->comm, core_->stream));
          }
          return ok_status();
        });
      });
}

Status NcclTransport::reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& recv_counts,
                                      DataType dtype, ReduceOp op, Deadline deadline) {
  COHORT_RETURN_IF_ERROR(core_->check_counts(recv_counts, "NCCL reduce_scatterv"));
  const size_t esize = element_size(dtype);
  const std::vector<size_t> offset = byte_offsets(recv_counts, esize);
  COHORT_RETURN_IF_ERROR(core_->check_device(send, offset.back(), "NCCL reduce_scatterv send"));
  COHORT_RETURN_IF_ERROR(
      core_->check_device(recv, recv_counts[rank()] * esize, "NCCL reduce_scatterv receive"));
  if (offset.back() == 0) return ok_status();
  const uint8_t* in = static_cast<const uint8_t*>(send);
  const size_t mine = recv_counts[rank()];
  return core_->run(
      fmt::format("NCCL reduce_scatterv ({} x {} total, {})", data_type_name(dtype), offset.back() / esize,
                  reduce_op_name(op)),
      deadline,
      [&]() {
        // Block r is reduced to rank r; recv is written at the root only.
        return nccl_group([&]() -> Status {
          for (int r = 0; r < size(); ++r) {
            if (recv_counts[r] == 0) continue;
            COHORT_NCCL_RETURN_IF_ERROR(ncclReduce(in + offset[r], recv, recv_counts[r],
                                                   static_cast<ncclDataType_t>(nccl_data_type(dtype)),
                                                   nccl_op(op), r, core_->comm, core_->stream));
          }
          return ok_status();
        });
      },
      [&]() -> Status {
        if (op != ReduceOp::kAvg || mine == 0) return ok_status();
        return device_scale_for_average(recv, mine, dtype, core_->size, core_->stream);
      });
}

Status NcclTransport::gatherv(const void* send, void* recv, const std::vector<size_t>& counts, DataType dtype,
                              int root, Deadline deadline) {
  if (root < 0 || root >= size()) return invalid_argument_error("NCCL gatherv: root {} out of range", root);
  COHORT_RETURN_IF_ERROR(core_->check_counts(counts, "NCCL gatherv"));
  const size_t esize = element_size(dtype);
  const std::vector<size_t> offset = byte_offsets(counts, esize);
  const bool is_root = rank() == root;
  COHORT_RETURN_IF_ERROR(core_->check_device(send, counts[rank()] * esize, "NCCL gatherv send"));
  if (is_root) COHORT_RETURN_IF_ERROR(core_->check_device(recv, offset.back(), "NCCL gatherv receive"));
  if (offset.back() == 0) return ok_status();
  uint8_t* out = static_cast<uint8_t*>(recv);
  return core_->run(fmt::format("NCCL gatherv ({} x {} total, root {})", data_type_name(dtype),
                                offset.back() / esize, root),
                    deadline, [&]() -> Status {
                      if (is_root) {
                        COHORT_RETURN_IF_ERROR(
                            copy_own_block(out + offset[root], send, counts[root] * esize, core_->stream));
                      }
                      return nccl_group([&]() -> Status {
                        if (!is_root) {
                          if (counts[rank()] == 0) return ok_status();
                          return COHORT_NCCL_CHECK(ncclSend(send, counts[rank()] * esize, ncclUint8, root,
                                                            core_->comm, core_->stream));
                        }
                        for (int r = 0; r < size(); ++r) {
                          if (r == root || counts[r] == 0) continue;
                          COHORT_NCCL_RETURN_IF_ERROR(ncclRecv(out + offset[r], counts[r] * esize, ncclUint8,
                                                               r, core_->comm, core_->stream));
                        }
                        return ok_status();
                      });
                    });
}

Status NcclTransport::scatterv(const void* send, const std::vector<size_t>& counts, void* recv,
                               DataType dtype, int root, Deadline deadline) {
  if (root < 0 || root >= size()) return invalid_argument_error("NCCL scatterv: root {} out of range", root);
  COHORT_RETURN_IF_ERROR(core_->check_counts(counts, "NCCL scatterv"));
  const size_t esize = element_size(dtype);
  const std::vector<size_t> offset = byte_offsets(counts, esize);
  const bool is_root = rank() == root;
  if (is_root) COHORT_RETURN_IF_ERROR(core_->check_device(send, offset.back(), "NCCL scatterv send"));
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, counts[rank()] * esize, "NCCL scatterv receive"));
  if (offset.back() == 0) return ok_status();
  const uint8_t* in = static_cast<const uint8_t*>(send);
  return core_->run(fmt::format("NCCL scatterv ({} x {} total, root {})", data_type_name(dtype),
                                offset.back() / esize, root),
                    deadline, [&]() -> Status {
                      if (is_root) {
                        COHORT_RETURN_IF_ERROR(
                            copy_own_block(recv, in + offset[root], counts[root] * esize, core_->stream));
                      }
                      return nccl_group([&]() -> Status {
                        if (!is_root) {
                          if (counts[rank()] == 0) return ok_status();
                          return COHORT_NCCL_CHECK(ncclRecv(recv, counts[rank()] * esize, ncclUint8, root,
                                                            core_->comm, core_->stream));
                        }
                        for (int r = 0; r < size(); ++r) {
                          if (r == root || counts[r] == 0) continue;
                          COHORT_NCCL_RETURN_IF_ERROR(ncclSend(in + offset[r], counts[r] * esize, ncclUint8,
                                                               r, core_->comm, core_->stream));
                        }
                        return ok_status();
                      });
                    });
}

Status NcclTransport::alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                const std::vector<size_t>& recv_counts, DataType dtype, Deadline deadline) {
  COHORT_RETURN_IF_ERROR(core_->check_counts(send_counts, "NCCL alltoallv send counts"));
  COHORT_RETURN_IF_ERROR(core_->check_counts(recv_counts, "NCCL alltoallv receive counts"));
  if (send_counts[rank()] != recv_counts[rank()]) {
    return invalid_argument_error("NCCL alltoallv: rank {} sends itself {} elements but expects {}", rank(),
                                  send_counts[rank()], recv_counts[rank()]);
  }
  const size_t esize = element_size(dtype);
  const std::vector<size_t> soffset = byte_offsets(send_counts, esize);
  const std::vector<size_t> roffset = byte_offsets(recv_counts, esize);
  COHORT_RETURN_IF_ERROR(core_->check_device(send, soffset.back(), "NCCL alltoallv send"));
  COHORT_RETURN_IF_ERROR(core_->check_device(recv, roffset.back(), "NCCL alltoallv receive"));
  if (soffset.back() == 0 && roffset.back() == 0) return ok_status();
  const uint8_t* in = static_cast<const uint8_t*>(send);
  uint8_t* out = static_cast<uint8_t*>(recv);
  return core_->run(
      fmt::format("NCCL alltoallv ({} x {} sent)", data_type_name(dtype), soffset.back() / esize), deadline,
      [&]() -> Status {
        COHORT_RETURN_IF_ERROR(copy_own_block(out + roffset[rank()], in + soffset[rank()],
                                              recv_counts[rank()] * esize, core_->stream));
        return nccl_group([&]() -> Status {
          for (int r = 0; r < size(); ++r) {
            if (r == rank()) continue;
            if (send_counts[r] > 0) {
              COHORT_NCCL_RETURN_IF_ERROR(ncclSend(in + soffset[r], send_counts[r] * esize, ncclUint8, r,
                                                   core_->comm, core_->stream));
            }
            if (recv_counts[r] > 0) {
              COHORT_NCCL_RETURN_IF_ERROR(ncclRecv(out + roffset[r], recv_counts[r] * esize, ncclUint8, r,
                                                   core_->comm, core_->stream));
            }
          }
          return ok_status();
        });
      });
}

}  // namespace cohort::comm
