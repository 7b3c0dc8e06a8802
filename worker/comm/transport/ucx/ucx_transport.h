#pragma once

// UcxTransport: point-to-point messages between processes (or threads) over UCX's tag API, for
// host memory. One ucp context and one worker per transport; ranks find each other by publishing
// their worker addresses in the job's Store.
//
//   FileStore store(path);                       // any Store every rank can reach
//   auto transport = UcxTransport::create(store, rank, size, UcxOptions{});
//   if (!transport.ok()) return transport.status();
//   auto work = (*transport)->isend(peer, tag, buffer, bytes);
//   COHORT_RETURN_IF_ERROR(work->wait(timeout));
//
// Wire protocol: the 64-bit UCX tag is (cohort tag << 20) | source rank, received with a full
// mask. UCX matches a receive with the oldest unexpected message of its tag from one endpoint, so
// FIFO order per (peer, tag) holds as the Transport contract requires.
//
// Progress: whoever waits drives UCX: wait() progresses the worker, spins a bounded number of
// times, then sleeps on the worker's event fd in short slices until the deadline, so
// oversubscribed ranks (4 ranks on 2 cores) do not burn each other's CPU. A light idle-progress
// thread progresses the worker only when no caller has for a millisecond, so a rank that stops
// calling (computing, or done) still answers its peers' protocol messages.
//
// Failures: endpoints use UCX's peer error handling. A peer that dies (process killed, connection
// reset, keepalive lost) is marked failed; every transfer with it, pending or later, fails with
// UNAVAILABLE "peer rank R failed: <UCX reason>" (over shared memory within about the keepalive
// interval; a killed process its parent has not reaped yet still looks alive to UCX, and its
// transfers time out instead). A stopped peer is not a failure: transfers with it time out in
// wait() with DEADLINE_EXCEEDED.
//
// Cancel: UCX can cancel only receives still waiting for their message. cancel() of a send in
// flight (or of a receive already matched to a message) waits up to UcxOptions::cancel_grace for
// it to finish, then closes the connection to that peer, which is the only way to be sure UCX no
// longer touches the buffer: later transfers with that peer fail with UNAVAILABLE.
//
// Transports: UCX_TLS from the environment wins; otherwise UcxOptions::transports. On one host
// UCX picks shared memory (sysv/posix) for small messages and CMA single-copy rendezvous for large
// ones, TCP between hosts.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"
#include "worker/comm/transport/transport.h"

namespace cohort::comm {

// How long create() waits for every rank to publish its worker address: ranks of one job start
// within seconds of each other, but a launcher may stagger them on a loaded cluster.
inline constexpr Duration kDefaultUcxConnectTimeout = std::chrono::minutes(5);
// UCX transports used when UCX_TLS is unset: shared memory (posix/sysv) for small messages on one
// node, CMA (process_vm_readv) for large ones, TCP between nodes, self for loopback. Listed
// explicitly so that a host with an RDMA device does not pay for probing it unasked; set UCX_TLS
// (e.g. "rc,sm,self") to use InfiniBand.
inline constexpr std::string_view kDefaultUcxTransports = "posix,sysv,cma,tcp,self";
// Progress calls a waiter makes without finding work before it sleeps on the event fd. A
// progress call costs ~0.1-1 us, so this spins for at most a few hundred microseconds: enough to
// catch a reply from a peer on another core without a syscall, short enough that waiting ranks
// sharing a core hand it over quickly.
inline constexpr int kDefaultUcxSpinIterations = 2000;
// Longest single sleep on the event fd. After it the waiter progresses again, which runs UCX's
// keepalive (detection of peers killed while connected over shared memory) and re-checks the
// deadline.
inline constexpr Duration kDefaultUcxPollSlice = std::chrono::milliseconds(50);
// UCX keepalive period (UCX's own default is 20 s): a killed peer that does not close a socket
// (shared memory) is noticed within about this long while someone waits.
inline constexpr Duration kDefaultUcxKeepaliveInterval = std::chrono::milliseconds(500);
// Messages below this size go eagerly (copied through shared memory) instead of by rendezvous.
// UCX's own choice on one node switches at a few KiB, and the rendezvous handshake then dominates
// 32 KiB–256 KiB allreduce segments (bench/README.md: 0.5–0.65× OpenMPI's busbw at 2 ranks).
inline constexpr size_t kDefaultUcxRendezvousThreshold = 256 * 1024;
// Period of the transport's idle-progress thread. UCX moves a rank's protocol messages (e.g. the
// acknowledgement that completes a peer's rendezvous send) only while that rank progresses; a rank
// that received everything it wanted and went off to compute would otherwise leave its peers'
// sends hanging until its next call. The thread progresses only when no caller did for a period,
// and backs off (up to 32 ms) while nothing is in flight.
inline constexpr Duration kDefaultUcxIdleProgressInterval = std::chrono::milliseconds(1);
// How long cancel() lets an in-flight transfer that UCX cannot cancel (a send, or a receive
// already matched to a message) finish before it closes the connection to the peer to free the
// buffer.
inline constexpr Duration kDefaultUcxCancelGrace = std::chrono::milliseconds(100);
// How long the destructor waits for endpoints to flush and close before destroying them anyway.
inline constexpr Duration kDefaultUcxCloseTimeout = std::chrono::seconds(1);

struct UcxOptions {
  // Store key prefix; rank r publishes its worker address under "<key_prefix><r>" (never deleted:
  // late ranks may still read it). Give every transport of one store its own prefix.
  std::string key_prefix = "ucx/worker_address/";
  // How long create() waits for all peers' addresses before failing with the missing ranks.
  Duration connect_timeout = kDefaultUcxConnectTimeout;
  // UCX_TLS value used when the environment does not set UCX_TLS ("" keeps UCX's default, all).
  std::string transports = std::string(kDefaultUcxTransports);
  // Empty progress calls before a waiter sleeps on the worker's event fd (0: sleep at once).
  int spin_iterations = kDefaultUcxSpinIterations;
  // Longest single sleep of a waiter on the event fd.
  Duration poll_slice = kDefaultUcxPollSlice;
  // UCX keepalive interval, unless UCX_KEEPALIVE_INTERVAL is set in the environment.
  Duration keepalive_interval = kDefaultUcxKeepaliveInterval;
  // UCX_RNDV_THRESH, unless set in the environment (0 keeps UCX's own choice).
  size_t rendezvous_threshold = kDefaultUcxRendezvousThreshold;
  // Period of the idle-progress thread (Duration::zero(): no thread; then only waiters progress).
  Duration idle_progress_interval = kDefaultUcxIdleProgressInterval;
  // How long cancel() waits for an uncancellable in-flight transfer before disconnecting the peer.
  Duration cancel_grace = kDefaultUcxCancelGrace;
  // How long the destructor waits for endpoints to close.
  Duration close_timeout = kDefaultUcxCloseTimeout;
  // Let shared memory (posix/sysv, and CMA for rendezvous) carry endpoints with peer error
  // handling. UCX 1.13 hides them from such endpoints by default (UCX_MM_ERROR_HANDLING=n,
  // UCX_CMA_MEMORY_INVALIDATE=n) and falls back to TCP over loopback: ~10x the latency. Each
  // setting is left alone when the environment sets it; the CMA one is process-wide (UCX reads
  // it from the environment, so create() exports it).
  bool shared_memory_error_handling = true;
};

class UcxEngine;

class UcxTransport final : public Transport {
 public:
  // Creates the UCX context and worker, publishes this rank's worker address in `store`, waits
  // up to options.connect_timeout for every other rank's and connects to them. Blocking; every
  // rank of the group must call it with the same `size` and key prefix. `store` is only used
  // during create(). Fails with DEADLINE_EXCEEDED naming the ranks that never published.
  static StatusOr<std::unique_ptr<UcxTransport>> create(Store& store, int rank, int size,
                                                        const UcxOptions& options = UcxOptions());

  // Cancels pending transfers (they complete with CANCELLED), closes the endpoints (waiting at
  // most options.close_timeout, so dead or stopped peers cannot hang it) and releases UCX. Works
  // handed out stay valid and are completed. Must not race with calls on this transport.
  ~UcxTransport() override;

  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view name() const override { return "ucx"; }

  // Transport contract: non-blocking, thread-safe; `data` must stay valid until the Work
  // completes or cancel() returns. Sends may complete before the peer posted its receive (small
  // messages go eagerly). A receive's truncation error names both sizes; the send of a truncated
  // message still succeeds. Zero-byte messages (data may be null) are fine.
  std::shared_ptr<TransportWork> isend(int peer, uint64_t tag, const void* data, size_t bytes) override;
  std::shared_ptr<TransportWork> irecv(int peer, uint64_t tag, void* data, size_t bytes) override;

  // Non-blocking; thread-safe.
  Status peer_status(int peer) override;

  // What UCX chose for the endpoint to `peer` (lanes, transports, thresholds), for logs and
  // benchmarks. Meaningful after a first transfer completed the connection. Thread-safe.
  std::string describe_endpoint(int peer);

  // The transfers UCX still owns, one line each with UCX's view of the request ("send to rank 2,
  // 4194304 bytes, tag 7: {rndv ...}"), and failed peers: what a hang dump prints. Thread-safe.
  std::string describe_pending();

 private:
  UcxTransport(std::shared_ptr<UcxEngine> engine, int rank, int size);

  std::shared_ptr<UcxEngine> engine_;  // shared with every Work it handed out
  const int rank_;
  const int size_;
};

}  // namespace cohort::comm
