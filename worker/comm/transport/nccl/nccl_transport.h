#pragma once

// NcclTransport: the Transport for CUDA memory, over one NCCL communicator, plus the NCCL
// collectives the pure_nccl kind runs natively. CUDA build only (bazel build --config=cuda): the
// header has no CUDA include, but the class is compiled only when COHORT_CUDA is defined.
//
//   auto nccl = NcclTransport::create(store, rank, size, NcclOptions{});   // collective
//   if (!nccl.ok()) return nccl.status();
//   COHORT_RETURN_IF_ERROR((*nccl)->allreduce(dev, dev, n, DataType::kBFloat16, ReduceOp::kSum,
//                                             Deadline::after(std::chrono::seconds(30))));
//
// Bootstrap: rank 0 makes an ncclUniqueId and publishes it in the job's Store under
// "<key_prefix>/unique_id"; the others read it (bounded by init_timeout). Each communicator
// (context) uses its own prefix, so ids never collide.
//
// Non-blocking NCCL: the communicator is created with ncclConfig_t.blocking = 0, so no NCCL call
// ever blocks the host. Every wait polls the stream's progress and ncclCommGetAsyncError until
// its deadline; an asynchronous NCCL error (a peer died, the network failed) or a deadline that
// passes aborts the communicator with ncclCommAbort, the only way to stop NCCL kernels that wait
// on a peer, so a dead peer becomes an error, never a hang. Once aborted, every pending and later
// operation fails with the abort's reason (the job restarts its workers, as with torch's NCCL
// watchdog). Errors read like the host path's: "peer rank 3 ...", the op, the time waited.
//
// Stream: everything runs on one stream the transport owns, in issue order, after the work already
// issued on the CUDA legacy default stream (torch's default stream): each launch makes the
// transport's stream wait for an event recorded there. Buffers must be device
// (or managed) memory; host buffers fail with INVALID_ARGUMENT. Operations are complete (the
// buffers reusable) when their Work / call returns OK.
//
// Point to point: NCCL has no tags; a receive matches the next send from the same peer. The
// Transport contract's per-(peer, tag) FIFO therefore holds when, as every cohort algorithm does,
// both sides post their transfers with a peer in the same order. isend/irecv only queue: the
// queued transfers are launched together as one NCCL group at the next wait() or is_completed()
// of any of them (or the next collective), so a ring step's send and receive never block each
// other on the stream. A receive always receives exactly its byte count (NCCL cannot report a
// shorter message).
//
// Thread-safety: all methods are thread-safe (one mutex serializes NCCL calls on the
// communicator); collectives block the caller until done or failed.

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"
#include "worker/comm/transport/transport.h"
#include "worker/comm/types.h"

namespace cohort::comm {

// Limit on the unique-id exchange and ncclCommInitRankConfig: NCCL connects every rank and
// probes the topology, which takes seconds on a large job.
inline constexpr Duration kDefaultNcclInitTimeout = std::chrono::minutes(5);
// Limit on ncclCommFinalize at destruction before the communicator is aborted instead: a peer
// gone before us must not keep this process from exiting.
inline constexpr Duration kNcclFinalizeTimeout = std::chrono::seconds(10);
// A waiter yields the CPU between polls for this long, then sleeps kNcclPollSleep per poll: short
// operations finish with microsecond latency, long ones do not burn a core.
inline constexpr std::chrono::microseconds kNcclSpinTime{2000};
inline constexpr std::chrono::microseconds kNcclPollSleep{100};

struct NcclOptions {
  int device = -1;  // CUDA device; -1: LOCAL_RANK mod device count, else the thread's current one
  Duration init_timeout = kDefaultNcclInitTimeout;  // unique-id exchange and communicator creation
  std::string key_prefix = "cohort/nccl/0";         // Store prefix of this communicator's unique id
};

// NCCL's data type enum value (ncclDataType_t) of `dtype`: every DataType has a native one
// (f16 and bf16 included).
int nccl_data_type(DataType dtype);

class NcclTransport final : public Transport {
 public:
  // Creates the communicator of `size` ranks. Collective: every rank calls it with the same store,
  // size and key_prefix. Blocking, at most options.init_timeout.
  static StatusOr<std::unique_ptr<NcclTransport>> create(Store& store, int rank, int size,
                                                         NcclOptions options = {});

  // Finalizes the communicator (at most kNcclFinalizeTimeout, then aborts it). Pending transfers
  // must have completed or been cancelled.
  ~NcclTransport() override;
  NcclTransport(const NcclTransport&) = delete;
  NcclTransport& operator=(const NcclTransport&) = delete;

  int rank() const override;
  int size() const override;
  std::string_view name() const override { return "nccl"; }
  // The CUDA device and stream (a cudaStream_t) everything runs on.
  int device() const;
  void* stream() const;

  // See the file comment: queued until a wait; matched by order per peer (the tag is checked
  // only against kTransportTagMask). cancel() of a launched transfer aborts the communicator.
  std::shared_ptr<TransportWork> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::shared_ptr<TransportWork> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;
  // OK until the communicator is aborted; the abort's reason afterwards (for every peer: NCCL
  // cannot tell which peer failed).
  Status peer_status(int peer) override;

  // ---- Collectives on device buffers, blocking until done or `deadline` (then aborting). ----
  // `send == recv` (or null send) runs in place. AVG reduces as SUM, then divides on the device
  // with the host kernels' rounding, so results match the host path bit for bit in the divide.
  Status allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                   Deadline deadline);
  Status reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
                Deadline deadline);
  Status broadcast(void* buf, size_t count, DataType dtype, int root, Deadline deadline);
  // recv holds size() blocks of `count`, in rank order.
  Status allgather(const void* send, void* recv, size_t count, DataType dtype, Deadline deadline);
  // send holds size() blocks of `recv_count`; block r, reduced, lands in rank r's recv.
  Status reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op,
                        Deadline deadline);

  // The uneven ("v") forms, each one NCCL group: allgatherv is a broadcast from every rank,
  // reduce_scatterv a reduce to every rank, gatherv / scatterv / alltoallv are sends and receives
  // (this rank's own block is a device-to-device copy on the stream). Counts are elements per rank.
  // allgatherv: null send = in place (this rank's block of recv).
  Status allgatherv(const void* send, void* recv, const std::vector<size_t>& recv_counts, DataType dtype,
                    Deadline deadline);
  // send holds recv_counts[r] elements for every rank r, concatenated; not in place.
  Status reduce_scatterv(const void* send, void* recv, const std::vector<size_t>& recv_counts, DataType dtype,
                         ReduceOp op, Deadline deadline);
  // recv (significant at root) gets counts[r] elements from every rank r, concatenated.
  Status gatherv(const void* send, void* recv, const std::vector<size_t>& counts, DataType dtype, int root,
                 Deadline deadline);
  // send (significant at root) holds counts[r] elements for every rank r, concatenated.
  Status scatterv(const void* send, const std::vector<size_t>& counts, void* recv, DataType dtype, int root,
                  Deadline deadline);
  Status alltoallv(const void* send, const std::vector<size_t>& send_counts, void* recv,
                   const std::vector<size_t>& recv_counts, DataType dtype, Deadline deadline);

  // Aborts the communicator: every pending and later operation fails with `reason`. Idempotent.
  void abort(const Status& reason);

  struct Core;  // shared with the transfers' Works (nccl_transport.cc)

 private:
  // isend and irecv: validates the transfer and queues it for the next wait (or completes it at
  // once with the error, or with nothing to move).
  std::shared_ptr<TransportWork> enqueue(bool send, int peer, uint64_t tag, void* data, size_t bytes);

  explicit NcclTransport(std::shared_ptr<Core> core);
  std::shared_ptr<Core> core_;
};

}  // namespace cohort::comm
