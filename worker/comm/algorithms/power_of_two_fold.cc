#include "worker/comm/algorithms/power_of_two_fold.h"

#include "worker/comm/algorithms/reduce_exchange.h"

namespace cohort::comm {

PowerOfTwoFold::PowerOfTwoFold(int rank, int size) : rank_(rank) {
  while (virtual_size_ * 2 <= size) virtual_size_ *= 2;
  extra_ = size - virtual_size_;
  if (rank < 2 * extra_) {
    virtual_rank_ = rank % 2 == 1 ? rank / 2 : -1;
  } else {
    virtual_rank_ = rank - extra_;
  }
}

Status PowerOfTwoFold::fold_in(CollectiveContext& ctx, void* buf, size_t count, DataType dtype, ReduceOp op,
                               uint32_t step) const {
  if (rank_ >= 2 * extra_ || count == 0) return ok_status();
  ReduceExchange exchange;
  exchange.dtype = dtype;
  exchange.op = op;
  exchange.step = step;
  if (participates()) {
    exchange.recv_peer = rank_ - 1;
    exchange.accumulate = buf;
    exchange.recv_count = count;
  } else {
    exchange.send_peer = rank_ + 1;
    exchange.send = buf;
    exchange.send_count = count;
  }
  return exchange.run(ctx);
}

Status PowerOfTwoFold::fold_out(CollectiveContext& ctx, void* buf, size_t bytes, uint32_t step) const {
  if (rank_ >= 2 * extra_ || bytes == 0) return ok_status();
  if (participates()) return ctx.send(rank_ - 1, step, buf, bytes);
  return ctx.recv(rank_ + 1, step, buf, bytes);
}

}  // namespace cohort::comm
