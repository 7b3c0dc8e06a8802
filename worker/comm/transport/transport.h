#pragma once

// Transport: non-blocking point-to-point messages between the ranks of one job. Every backend
// (loopback for in-process tests, UCX for host memory, NCCL for CUDA memory) implements this
// interface with the same file set: <name>_transport.{h,cc} and <name>_transport_test.cc.
//
// Matching: a receive matches the oldest unmatched send from the same peer with the same tag.
// Messages between one pair of ranks with the same tag are matched in posting order (FIFO), so
// algorithms may reuse a tag as long as both sides post in the same order.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/work.h"

namespace cohort::comm {

// Usable tag bits. Backends may use the bits above for their own framing (UCX puts the source
// rank there, leaving 2^19 ranks), so callers keep tags below 2^kTransportTagBits. The
// communicator's layout (algorithms/collective_context.h) takes 44 bits and the top one.
inline constexpr int kTransportTagBits = 45;
inline constexpr uint64_t kTransportTagMask = (uint64_t{1} << kTransportTagBits) - 1;

// The Work of one transfer. Besides Work's contract, it can be cancelled: a caller that gives up
// (deadline passed, a sibling transfer failed) must cancel before freeing the buffer.
class TransportWork : public Work {
 public:
  using Work::wait;
  // Cancels the transfer if still pending: it completes with `reason` and the transport no
  // longer touches the buffer once cancel returns. No-op when already completed. Thread-safe.
  virtual void cancel(Status reason) = 0;
  // For receives: the number of bytes that arrived (valid once completed successfully).
  virtual size_t received_bytes() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;

  // This process's rank and the number of ranks the transport connects. Constant.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "loopback", "ucx", "nccl": for error messages and benchmarks.
  virtual std::string_view name() const = 0;

  // Starts sending `bytes` bytes at `data` to `peer` under `tag` (< 2^kTransportTagBits).
  // `data` must stay valid until the Work completes or is cancelled. The Work completes when the
  // buffer may be reused (not necessarily when the peer received it). Non-blocking; thread-safe.
  // A failed peer fails the Work with UNAVAILABLE naming the peer.
  virtual std::shared_ptr<TransportWork> isend(int peer, uint64_t tag, const void* data, size_t bytes) = 0;

  // Starts receiving at most `bytes` bytes from `peer` under `tag` into `data`. A longer message
  // fails the Work with a truncation error naming both sizes. Non-blocking; thread-safe.
  virtual std::shared_ptr<TransportWork> irecv(int peer, uint64_t tag, void* data, size_t bytes) = 0;

  // OK while `peer` is believed alive; the failure that marked it dead otherwise. Non-blocking.
  virtual Status peer_status(int peer) = 0;
};

}  // namespace cohort::comm
