#pragma once

// Communicator: a group of ranks and every collective and point-to-point operation among them
// (ChainerMN's communicator, torch.distributed's process group). Kinds by name — naive, flat,
// hierarchical, two_dimensional, single_node, pure_nccl — are made by create_communicator()
// (communicator_factory.h); this class is the flat kind and the base of the others.
//
//   auto comm = create_communicator("hierarchical", InitOptions::from_url("env://")).value();
//   std::vector<float> grad(n);
//   auto work = comm->allreduce(grad.data(), grad.data(), n, DataType::kFloat32, ReduceOp::kAvg);
//   Status status = work->wait();   // or pass {.blocking = true} to run on this thread
//
// Ordering: operations run in the order they are issued on this communicator, one at a time, on
// the communicator's executor thread (or on the caller's thread for blocking calls when nothing is
// queued). Every rank must issue the same collectives in the same order (COHORT_DEBUG=detail
// checks this). Point-to-point operations bypass the queue.
//
// Thread-safety: all public methods are thread-safe. Buffers passed to an asynchronous call must
// stay valid until its Work completes.
//
// Device (CUDA) buffers: every collective and point-to-point call accepts them. pure_nccl (and
// single_node when each rank has its own GPU) runs collectives as NCCL calls; the other kinds
// stage them through pinned host memory around their host path (see device_collective); point to
// point is staged over the world transport on every kind, so tags keep their meaning. A call
// takes the device path on a rank when any buffer it passes is device memory, and every rank must
// take the same path: pass device buffers on every rank or on none (with the NCCL kinds, also a
// non-null device pointer for an empty block; a rank on the other path fails, and makes its peers
// fail, when the deadline passes). The staging kinds also accept host and device buffers mixed
// within one call; the NCCL kinds refuse that with INVALID_ARGUMENT. Device work already issued on the buffer's GPU's legacy default stream is
// ordered before the operation; callers using other streams synchronize them first.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/algorithms/algorithm.h"
#include "worker/comm/algorithms/collective_context.h"
#include "worker/comm/deadline.h"
#include "worker/comm/flight_recorder.h"
#include "worker/comm/ordered_runner.h"
#include "worker/comm/store/store.h"
#include "worker/comm/transport/transport.h"
#include "worker/comm/tsc_clock.h"
#include "worker/comm/types.h"
#include "worker/comm/work.h"

namespace cohort::comm {

class PinnedBuffer;
class SharedMemoryEngine;

// A collective with a device (CUDA) buffer, as Communicator::device_collective sees it: the
// public call's arguments, normalized, and the extents of this rank's buffers for staging.
struct DeviceCall {
  Collective collective = Collective::kAllreduce;
  const void* send = nullptr;  // the input; null or == recv: in place (recv holds the input)
  void* recv = nullptr;
  size_t count = 0;                 // allreduce, reduce, broadcast: elements
  std::vector<size_t> send_counts;  // scatter, alltoall: elements per rank
  std::vector<size_t> recv_counts;  // allgather, gather, reduce_scatter, alltoall: elements per rank
  DataType dtype = DataType::kUInt8;
  ReduceOp op = ReduceOp::kSum;  // may be kAvg
  int root = -1;
  size_t send_bytes = 0;       // bytes this rank reads from send (0 when in place)
  size_t recv_bytes = 0;       // bytes of recv this rank reads or writes
  bool recv_is_output = true;  // false where recv is input only (broadcast at its root)

  bool in_place() const { return send == nullptr || send == recv; }
  // True when every buffer the call touches on this rank is device memory (NCCL can run it);
  // false when host and device buffers are mixed.
  bool all_device() const;
  // OK when all_device(); else INVALID_ARGUMENT naming the host buffer, for kinds that run device
  // calls on NCCL: every rank must take the NCCL path, so a rank cannot fall back to staging.
  Status check_all_device(const std::string& who) const;
};
// The host path of one collective over (send, recv) host buffers, for staging.
using HostBody = std::function<Status(const void* send, void* recv)>;

// What every communicator of one process shares: the transport among all ranks of the job, the
// bootstrap store, and the node of each global rank.
struct CommWorld {
  std::shared_ptr<Transport> transport;
  std::shared_ptr<Store> store;
  std::vector<std::string> node_ids;  // node_ids[global rank]
};

struct CommunicatorOptions {
  Duration timeout = kDefaultCollectiveTimeout;  // per operation, unless a call overrides it
  Algorithm algorithm = Algorithm::kAuto;        // forced where it implements the op (env COHORT_ALGO: same)
  size_t flight_recorder_size = kDefaultFlightRecorderSize;  // operations remembered for dumps
  bool debug_checks = false;  // cross-check every collective's signature (also COHORT_DEBUG=detail)
  int cuda_device = -1;       // this rank's GPU (NCCL, device ids); -1: the creating thread's current device
};

struct CallOptions {
  std::optional<Duration> timeout;  // overrides the communicator's timeout for this call
  bool blocking = false;            // run on the calling thread; the returned Work is completed
};

// A color for split() that leaves the calling rank out of every new communicator.
inline constexpr int kUndefinedColor = -1;

class Communicator {
 public:
  // Use create_communicator(). `global_ranks[i]` is the world rank of this communicator's rank i.
  Communicator(std::string kind, std::shared_ptr<CommWorld> world, std::vector<int> global_ranks, int rank,
               uint64_t context_id, CommunicatorOptions options);
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // ---- Properties (constant) ----
  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_.size()); }
  // Rank within this rank's node, and the number of this communicator's ranks on it.
  int intra_rank() const { return intra_rank_; }
  int intra_size() const { return intra_size_; }
  // Index of this rank's node among the communicator's nodes (ordered by lowest rank), and the
  // number of nodes.
  int inter_rank() const { return inter_rank_; }
  int inter_size() const { return inter_size_; }
  const std::string& kind() const { return kind_; }
  uint64_t context_id() const { return context_id_; }
  const std::vector<int>& global_ranks() const { return global_ranks_; }
  const CommunicatorOptions& options() const { return options_; }
  // This rank's CUDA device (options.cuda_device, else default_cuda_device() when created: LOCAL_RANK
  // mod the GPU count, else the creating thread's current device); -1 in a CPU-only build or
  // without a GPU. NCCL, the node's GPU identity and the executor thread use it; split() passes it
  // on.
  int cuda_device() const { return cuda_device_; }
  // "hierarchical communicator (context 3, rank 1 of 4)": for error messages.
  const std::string& description() const;
  // How long callers have been blocked on this communicator's collectives, in total: a blocking
  // call while it ran, and Work::wait() on an asynchronous one until it finished (what training
  // steps lose to communication; rank 0 reports it as Metrics.comm_wait_s). Point-to-point
  // transfers are not counted. Thread-safe, non-blocking.
  std::chrono::nanoseconds blocked_time() const {
    return std::chrono::nanoseconds(blocked_ns_->load(std::memory_order_relaxed) +
                                    inline_blocked_ns_.load(std::memory_order_relaxed));
  }

  // ---- Collectives. `send == nullptr` or `send == recv` means in place. Counts are elements. ----
  std::shared_ptr<Work> allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                  const CallOptions& call = {});
  // recv is significant at `root` only.
  std::shared_ptr<Work> reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                               int root, const CallOptions& call = {});
  std::shared_ptr<Work> broadcast(void* buf, size_t count, DataType dtype, int root,
                                  const CallOptions& call = {});
  // recv holds size() blocks of `count` elements, in rank order.
  std::shared_ptr<Work> allgather(const void* send, void* recv, size_t count, DataType dtype,
                                  const CallOptions& call = {});
  // recv_counts[r] elements from rank r, concatenated; send has recv_counts[rank()] elements.
  std::shared_ptr<Work> allgatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts,
                                   DataType dtype, const CallOptions& call = {});
  std::shared_ptr<Work> gather(const void* send, void* recv, size_t count, DataType dtype, int root,
                               const CallOptions& call = {});
  std::shared_ptr<Work> gatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts,
                                DataType dtype, int root, const CallOptions& call = {});
  // send (at root) holds size() blocks of `count`; each rank receives its block.
  std::shared_ptr<Work> scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
                                const CallOptions& call = {});
  std::shared_ptr<Work> scatterv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                 DataType dtype, int root, const CallOptions& call = {});
  // send holds size() blocks of `recv_count`; block r is reduced across ranks into rank r's recv.
  std::shared_ptr<Work> reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                       ReduceOp op, const CallOptions& call = {});
  // send holds recv_counts[r] elements for each rank r, concatenated.
  std::shared_ptr<Work> reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& recv_counts,
                                        DataType dtype, ReduceOp op, const CallOptions& call = {});
  // send holds size() blocks of `count` (block r goes to rank r); recv gets block r from rank r.
  std::shared_ptr<Work> alltoall(const void* send, void* recv, size_t count, DataType dtype,
                                 const CallOptions& call = {});
  std::shared_ptr<Work> alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                  const std::vector<size_t>& recv_counts, DataType dtype,
                                  const CallOptions& call = {});
  std::shared_ptr<Work> barrier(const CallOptions& call = {});

  // ---- Point to point (not queued behind collectives; `tag` < 2^29) ----
  // Each transfer is in the flight recorder until its Work completes. With COHORT_DEBUG=detail
  // (options.debug_checks), a send carries its signature (rank, dtype, count) just ahead of the
  // payload and a receive sends its own back to the sender when it is posted; when the dtype or
  // size differ, both the receive and the send fail with INVALID_ARGUMENT naming both sides (the
  // payload is still drained, so neither is left hanging). A checked send therefore completes
  // only once its receive was posted (MPI_Ssend's rule), even where the transport would buffer
  // a small message: a program that needs such buffering (both ranks send first, then receive)
  // times out under the check. Every rank must run with the check on, as for collectives.
  std::shared_ptr<Work> isend(const void* buf, size_t count, DataType dtype, int peer, uint32_t tag = 0,
                              const CallOptions& call = {});
  std::shared_ptr<Work> irecv(void* buf, size_t count, DataType dtype, int peer, uint32_t tag = 0,
                              const CallOptions& call = {});
  Status send(const void* buf, size_t count, DataType dtype, int peer, uint32_t tag = 0,
              const CallOptions& call = {});
  Status recv(void* buf, size_t count, DataType dtype, int peer, uint32_t tag = 0,
              const CallOptions& call = {});

  // ---- Objects (ChainerMN's *_obj): small serialized values, blocking ----
  StatusOr<std::string> bcast_obj(const std::string& value, int root);
  StatusOr<std::vector<std::string>> gather_obj(const std::string& value, int root);  // empty off root
  StatusOr<std::vector<std::string>> allgather_obj(const std::string& value);
  StatusOr<double> allreduce_obj(double value, ReduceOp op = ReduceOp::kSum);

  // ---- Groups ----
  // MPI_Comm_split: ranks with the same color form a new communicator of the same kind, ordered
  // by (key, rank). Blocking and collective over this communicator. Returns nullptr for ranks
  // that pass kUndefinedColor.
  StatusOr<std::unique_ptr<Communicator>> split(int color, int key);
  // torch.distributed.new_group: a communicator of `ranks` (this communicator's ranks). Collective
  // over this communicator; ranks outside the group get nullptr.
  StatusOr<std::unique_ptr<Communicator>> new_group(const std::vector<int>& ranks);
  // split() producing a communicator of another kind (kinds build their sub-communicators so).
  StatusOr<std::unique_ptr<Communicator>> split_as(int color, int key, const std::string& kind);

  // The last operations, one per line (also logged when an operation times out).
  std::string flight_recorder_dump() const { return recorder_->dump(); }

 protected:
  // The synchronous bodies, run on the executor (or the blocking caller). Kinds override
  // allreduce; `buf` is in place; ops are never AVG (run_allreduce scales afterwards).
  virtual Status allreduce_sum_like(void* buf, size_t count, DataType dtype, ReduceOp op, Deadline deadline);

  // Device (CUDA) buffers: every collective whose send or receive buffer is device memory calls
  // this instead of running its host path (never in a CPU-only build, unless a FakeDeviceMemory
  // test seam is active). The default stages: the device buffers are copied to pinned host memory,
  // `host` (this kind's host path, AVG included) runs on the copies, and the output is copied
  // back, so every kind accepts device buffers over a host transport. pure_nccl and single_node
  // override it with NCCL calls; hierarchical and two_dimensional run allreduce with NCCL inside
  // the node. Runs on the executor like allreduce_sum_like.
  virtual Status device_collective(const DeviceCall& call, Deadline deadline, const HostBody& host);
  // isend/irecv of a device buffer with this communicator's rank `peer`. The default stages
  // through host memory over the world transport; pure_nccl sends over NCCL.
  virtual std::shared_ptr<TransportWork> device_transfer(bool is_send, int peer, uint64_t wire_tag, void* buf,
                                                         size_t bytes);

  // Runs `body` over a fresh CollectiveContext for this communicator's next sequence number.
  // Synchronous; for use by kinds composing sub-communicators on the executor thread.
  // A template so the hot path allocates no std::function.
  template <typename Body>
  Status run_collective(const char* op, Deadline deadline, Body&& body) {
    uint64_t tag_base = size() == 1 ? 0 : collective_tag_base(context_id_, sequence_++);
    CollectiveContext ctx(world_->transport.get(), &global_ranks_, rank_, tag_base, deadline, op, &scratch_);
    return body(ctx);
  }

  // Staging memory for kinds that need a copy of the input (distinct from the algorithms' scratch).
  uint8_t* staging(size_t bytes);

  // Drains the queue and joins the executor. Kinds whose operations use their own members (NCCL,
  // sub-communicators) call it first in their destructors, before those members go.
  void stop_executor();

  // The process's transport, store and node map (kinds bootstrap NCCL through the store).
  const std::shared_ptr<CommWorld>& world() const { return world_; }

  Algorithm forced_algorithm() const { return algorithm_; }

  // The intra-node path: the shared-memory engine when `collective` moving `bytes` (the same on
  // every rank; 0 for the v-collectives) should run on it, else null (use the transport). Used
  // when every rank of this communicator is on one node, in separate processes, and neither a
  // transport algorithm nor "ucx" is forced (option or COHORT_ALGO); "shm" forces it (also for
  // ranks that are threads of one process). The engine is set up at the first such call, which is
  // collective over the communicator (every rank decides the same from the same arguments); a
  // segment that some rank cannot map makes every rank use the transport from then on. Runs on
  // the executor.
  StatusOr<SharedMemoryEngine*> shared_memory(Collective collective, size_t bytes, Deadline deadline);
  // The forced algorithm if it implements `collective`, else kAuto.
  Algorithm algorithm_for(Collective collective) const;

 private:
  // Validates nothing; records, queues or runs `body` per `call`, wrapping failures with context.
  // Runs `body` on this thread (blocking calls, nothing queued) or queues it for the executor.
  // Templates (defined in communicator.cc, their only user) so the blocking path allocates nothing
  // but what the algorithm needs.
  template <typename Body>
  std::shared_ptr<Work> submit(const OpInfo& info, const CallOptions& call, Body&& body);
  // `start` is the clock reading that starts the deadline (after `timeout`) and the record; the
  // end's reading goes to `*end` when not null (the caller's blocked time).
  template <typename Body>
  Status run_recorded(uint64_t sequence_hint, const OpInfo& info, Duration timeout, Clock::time_point start,
                      const Body& body, Clock::time_point* end);
  // The bodies of allgather(v) and reduce_scatter(v), after the checks that only the v forms need.
  class RankCounts;
  std::shared_ptr<Work> allgather_of(const void* send, void* recv, RankCounts counts, size_t total,
                                     DataType dtype, const CallOptions& call);
  std::shared_ptr<Work> reduce_scatter_of(const void* send, void* recv, RankCounts counts, size_t total,
                                          DataType dtype, ReduceOp op, const CallOptions& call);
  // `counts` times `element_bytes` in bytes_scratch_ (the running collective's; run token held).
  const std::vector<size_t>& byte_counts(const std::vector<size_t>& counts, size_t element_bytes);
  Deadline deadline_for(const CallOptions& call) const;
  Status check_root(int root) const;
  Status check_counts(const std::vector<size_t>& counts, const char* what) const;
  Status cross_check(const std::string& signature, Deadline deadline);
  // " [ranks known to have failed: 2, 5]" per the transport, or "" when none is known.
  std::string failed_peers() const;
  std::shared_ptr<Work> p2p(bool is_send, void* buf, size_t count, DataType dtype, int peer, uint32_t tag,
                            const CallOptions& call);

  const std::string kind_;
  const std::shared_ptr<CommWorld> world_;
  const std::vector<int> global_ranks_;
  const int rank_;
  const uint64_t context_id_;
  const CommunicatorOptions options_;
  const Algorithm algorithm_;
  bool debug_checks_;
  int cuda_device_ = -1;
  int intra_rank_ = 0, intra_size_ = 1, inter_rank_ = 0, inter_size_ = 1;
  std::string description_;  // made once: errors name the communicator on every path

  // Next collective sequence number; advanced only by the thread that runs collectives.
  uint64_t sequence_ = 0;
  // The collectives' clock (deadline, record, blocked time): read by the run token's holder only.
  TscClock clock_;
  std::vector<uint8_t> scratch_;
  std::vector<uint8_t> staging_;
  // Per-rank counts and bytes of the running collective (used only while it holds the run token),
  // kept between calls so small collectives allocate nothing.
  std::vector<size_t> counts_scratch_;
  std::vector<size_t> bytes_scratch_;
  std::unique_ptr<PinnedBuffer> pinned_;  // staging of device buffers, made on first use
  // The intra-node path: kShm / kTransport when one is forced (option, else COHORT_ALGO), else
  // kAuto; COHORT_ALGO's value, read once; the engine once set up.
  Algorithm path_choice_ = Algorithm::kAuto;
  Algorithm environment_algorithm_ = Algorithm::kAuto;
  enum class ShmState { kUndecided, kReady, kUnavailable };
  ShmState shm_state_ = ShmState::kUndecided;
  // shared_memory()'s answer per collective from what never changes (rank layout, forced path or
  // algorithm, the transport), worked out at the collective's first call, so that only the size
  // rule and the engine's state are left per call. Used under the run token, like the engine.
  enum class ShmRoute : uint8_t { kUnknown, kTransport, kBySize, kForced };
  std::array<ShmRoute, static_cast<size_t>(Collective::kBarrier) + 1> shm_routes_{};
  ShmRoute shm_route(Collective collective) const;
  std::unique_ptr<SharedMemoryEngine> shm_;
  // Shared with point-to-point Works (they record their end, and may outlive this) and with the
  // process's dump registry (flight_recorder_registry.h).
  const std::shared_ptr<FlightRecorder> recorder_;
  std::atomic<uint64_t> p2p_sequence_{0};  // point-to-point operations issued, for the recorder
  std::mutex p2p_post_mutex_;              // COHORT_DEBUG=detail: header and payload posted together
  // blocked_time(), in nanoseconds; shared with the Works it hands out, which may outlive it.
  const std::shared_ptr<std::atomic<int64_t>> blocked_ns_ = std::make_shared<std::atomic<int64_t>>(0);
  // The blocking calls' share of blocked_time(): only the run token's holder adds to it, so a
  // plain load and store do (the token orders one holder's store before the next one's load).
  std::atomic<int64_t> inline_blocked_ns_{0};

  // The run token, the queue and the executor: exactly one thread runs collectives at a time, in
  // issue order (ordered_runner.h). Stopped in the destructor, before any member a queued body
  // uses goes.
  OrderedRunner runner_;
  friend class CommunicatorTestPeer;
};

}  // namespace cohort::comm
