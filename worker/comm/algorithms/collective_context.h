#pragma once

// CollectiveContext: what one running collective sees of its communicator — its rank and size,
// the transport, a unique tag space, and the deadline. Algorithms (one class per file in this
// directory) are written as straight-line code over it: post transfers, wait for them.
//
// Safety net: every transfer posted through the context is tracked; the destructor cancels the
// ones still pending, so no transport touches an algorithm's buffers after it returns, whatever
// path it returned by.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/transport/transport.h"

namespace cohort::comm {

// Tag layout below kTransportTagBits: [check reply 1][context 14][kind 1][sequence 17][step 12].
inline constexpr int kStepBits = 12;
inline constexpr int kSequenceBits = 17;
inline constexpr int kContextBits = 14;
inline constexpr uint64_t kMaxContextId = (uint64_t{1} << kContextBits) - 1;
// Set only on COHORT_DEBUG=detail's point-to-point check replies (p2p_check_reply_tag).
inline constexpr int kCheckReplyBit = kContextBits + 1 + kSequenceBits + kStepBits;
static_assert(kCheckReplyBit < kTransportTagBits, "the tag layout must fit the transport's tag bits");

// The tag base of collective number `sequence` on communicator context `context_id`.
inline uint64_t collective_tag_base(uint64_t context_id, uint64_t sequence) {
  return (context_id << (kStepBits + kSequenceBits + 1)) | ((sequence & ((1u << kSequenceBits) - 1)) << kStepBits);
}
// The tag of a user point-to-point message with `tag` (< 2^29) on communicator `context_id`.
inline uint64_t p2p_tag(uint64_t context_id, uint64_t tag) {
  return (context_id << (kStepBits + kSequenceBits + 1)) | (uint64_t{1} << (kStepBits + kSequenceBits)) |
         (tag & ((uint64_t{1} << (kStepBits + kSequenceBits)) - 1));
}
inline constexpr uint64_t kMaxUserTag = (uint64_t{1} << (kStepBits + kSequenceBits)) - 1;
// Under COHORT_DEBUG=detail a receive sends its own signature back to the sender on this tag, so
// the send can fail naming both sides too. Replies between two ranks pair up in the same FIFO
// order as the messages they answer, and never meet a message or a collective's transfer.
inline uint64_t p2p_check_reply_tag(uint64_t context_id, uint64_t tag) {
  return p2p_tag(context_id, tag) | (uint64_t{1} << kCheckReplyBit);
}

// One posted transfer and what it is for (kept for error messages).
struct Transfer {
  std::shared_ptr<TransportWork> work;
  int peer = -1;  // communicator rank
  size_t bytes = 0;
  bool is_send = false;
  uint32_t step = 0;
};

class CollectiveContext {
 public:
  // `global_ranks[i]` is the transport rank of communicator rank i; `rank` is this process's
  // communicator rank. `op` names the collective in errors ("allreduce"). Not thread-safe: one
  // collective runs on one thread.
  // `scratch` (optional) is reusable memory owned by the communicator, grown on demand, so large
  // collectives do not allocate and fault in fresh pages every call.
  CollectiveContext(Transport* transport, const std::vector<int>* global_ranks, int rank, uint64_t tag_base,
                    Deadline deadline, std::string op, std::vector<uint8_t>* scratch = nullptr);
  ~CollectiveContext();
  CollectiveContext(const CollectiveContext&) = delete;
  CollectiveContext& operator=(const CollectiveContext&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(global_ranks_->size()); }
  Deadline deadline() const { return deadline_; }
  const std::string& op() const { return op_; }

  // Posts a transfer with communicator rank `peer`. `step` distinguishes the messages of one
  // collective (it wraps at 2^kStepBits; FIFO matching keeps reuse safe). Non-blocking.
  Transfer isend(int peer, uint32_t step, const void* data, size_t bytes);
  Transfer irecv(int peer, uint32_t step, void* data, size_t bytes);

  // Waits for one transfer until the deadline. On timeout it is cancelled and the error names the
  // peer (communicator and transport rank), the direction, the size, the step and the time waited.
  Status wait(Transfer& transfer);
  // Waits for all; on the first failure cancels the rest and returns that failure.
  Status wait_all(std::vector<Transfer>& transfers);

  // At least `bytes` of scratch memory, valid until the next scratch() call or the end of the
  // collective. Contents are unspecified.
  uint8_t* scratch(size_t bytes);

  // Blocking conveniences.
  Status send(int peer, uint32_t step, const void* data, size_t bytes);
  Status recv(int peer, uint32_t step, void* data, size_t bytes);
  // Sends to `send_peer` and receives from `recv_peer` concurrently (both posted before waiting,
  // so a ring of sendrecv calls cannot deadlock).
  Status sendrecv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer, void* recv_data,
                  size_t recv_bytes, uint32_t step);

 private:
  Status describe_failure(const Transfer& transfer, const Status& status) const;
  void cancel_pending(const Status& reason);
  void prune_completed();
  static constexpr size_t kPruneThreshold = 64;

  Transport* const transport_;
  const std::vector<int>* const global_ranks_;
  const int rank_;
  const uint64_t tag_base_;
  const Deadline deadline_;
  const std::string op_;
  std::vector<std::shared_ptr<TransportWork>> posted_;
  std::vector<uint8_t> own_scratch_;
  std::vector<uint8_t>* scratch_;
};

}  // namespace cohort::comm
