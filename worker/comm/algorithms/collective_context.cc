#include "worker/comm/algorithms/collective_context.h"

#include <algorithm>

namespace cohort::comm {

CollectiveContext::CollectiveContext(Transport* transport, const std::vector<int>* global_ranks, int rank,
                                     uint64_t tag_base, Deadline deadline, std::string op,
                                     std::vector<uint8_t>* scratch)
    : transport_(transport),
      global_ranks_(global_ranks),
      rank_(rank),
      tag_base_(tag_base),
      deadline_(deadline),
      op_(std::move(op)),
      scratch_(scratch != nullptr ? scratch : &own_scratch_) {
  posted_.reserve(kPruneThreshold);
}

uint8_t* CollectiveContext::scratch(size_t bytes) {
  if (scratch_->size() < bytes) scratch_->resize(bytes);
  return scratch_->data();
}

CollectiveContext::~CollectiveContext() {
  // The common case has nothing pending: build the reason only when it is needed.
  for (const auto& work : posted_) {
    if (!work->is_completed()) {
      cancel_pending(cancelled_error("{} ended before this transfer completed", op_));
      return;
    }
  }
}

void CollectiveContext::cancel_pending(const Status& reason) {
  for (auto& work : posted_) {
    if (!work->is_completed()) work->cancel(reason);
  }
  posted_.clear();
}

void CollectiveContext::prune_completed() {
  // Long pipelines post thousands of transfers; only pending ones need tracking.
  if (posted_.size() < kPruneThreshold) return;
  posted_.erase(std::remove_if(posted_.begin(), posted_.end(), [](const auto& w) { return w->is_completed(); }),
                posted_.end());
}

Transfer CollectiveContext::isend(int peer, uint32_t step, const void* data, size_t bytes) {
  uint64_t tag = tag_base_ | (step & ((1u << kStepBits) - 1));
  prune_completed();
  Transfer transfer{transport_->isend((*global_ranks_)[peer], tag, data, bytes), peer, bytes, true, step};
  posted_.push_back(transfer.work);
  return transfer;
}

Transfer CollectiveContext::irecv(int peer, uint32_t step, void* data, size_t bytes) {
  uint64_t tag = tag_base_ | (step & ((1u << kStepBits) - 1));
  prune_completed();
  Transfer transfer{transport_->irecv((*global_ranks_)[peer], tag, data, bytes), peer, bytes, false, step};
  posted_.push_back(transfer.work);
  return transfer;
}

Status CollectiveContext::describe_failure(const Transfer& t, const Status& status) const {
  int global = (*global_ranks_)[t.peer];
  std::string peer = global == t.peer ? fmt::format("rank {}", t.peer)
                                      : fmt::format("rank {} (global rank {})", t.peer, global);
  if (status.code() == StatusCode::kDeadlineExceeded) {
    return deadline_exceeded_error("{}: timed out after {} waiting to {} {} ({} bytes, step {}); is that rank alive and issuing the same collective?",
                                   op_, format_duration(deadline_.budget()), t.is_send ? "send to" : "receive from",
                                   peer, t.bytes, t.step);
  }
  return status.with_context(fmt::format("{}: {} {} ({} bytes, step {})", op_, t.is_send ? "send to" : "receive from",
                                         peer, t.bytes, t.step));
}

Status CollectiveContext::wait(Transfer& transfer) {
  // Sends of small messages complete as they are posted: skip the clock read for those.
  Status status =
      transfer.work->is_completed() ? transfer.work->error() : transfer.work->wait(deadline_.remaining());
  if (status.ok()) return status;
  if (status.code() == StatusCode::kDeadlineExceeded) {
    // A transport's wait may also have timed out itself; the peer may still be alive (stopped),
    // so the buffer must be released before the error propagates.
    transfer.work->cancel(status);
  }
  Status described = describe_failure(transfer, status);
  cancel_pending(described);
  return described;
}

Status CollectiveContext::wait_all(std::vector<Transfer>& transfers) {
  for (Transfer& transfer : transfers) {
    COHORT_RETURN_IF_ERROR(wait(transfer));
  }
  return ok_status();
}

Status CollectiveContext::send(int peer, uint32_t step, const void* data, size_t bytes) {
  Transfer transfer = isend(peer, step, data, bytes);
  return wait(transfer);
}

Status CollectiveContext::recv(int peer, uint32_t step, void* data, size_t bytes) {
  Transfer transfer = irecv(peer, step, data, bytes);
  return wait(transfer);
}

Status CollectiveContext::sendrecv(int send_peer, const void* send_data, size_t send_bytes, int recv_peer,
                                   void* recv_data, size_t recv_bytes, uint32_t step) {
  // No vector: a small allreduce is a handful of sendrecv calls, each worth a heap allocation.
  Transfer receive = irecv(recv_peer, step, recv_data, recv_bytes);
  Transfer send = isend(send_peer, step, send_data, send_bytes);
  COHORT_RETURN_IF_ERROR(wait(receive));
  return wait(send);
}

}  // namespace cohort::comm
