#include "worker/comm/algorithms/alltoall_pairwise.h"

#include <algorithm>
#include <cstring>

#include "worker/comm/algorithms/chunking.h"

namespace cohort::comm {

Status AlltoallPairwise::run(CollectiveContext& ctx, const void* send, const std::vector<size_t>& send_bytes,
                             void* recv, const std::vector<size_t>& recv_bytes) {
  const int size = ctx.size();
  const int rank = ctx.rank();
  const std::vector<size_t> send_offsets = prefix_offsets(send_bytes);
  const std::vector<size_t> recv_offsets = prefix_offsets(recv_bytes);
  const auto* send_base = static_cast<const uint8_t*>(send);
  auto* recv_base = static_cast<uint8_t*>(recv);
  if (send_bytes[rank] != recv_bytes[rank]) {
    return invalid_argument_error("{}: rank {} sends {} bytes to itself but expects to receive {}", ctx.op(),
                                  rank, send_bytes[rank], recv_bytes[rank]);
  }
  if (send_bytes[rank] > 0) {
    std::memcpy(recv_base + recv_offsets[rank], send_base + send_offsets[rank], send_bytes[rank]);
  }

  // Transfers of step s sit at [first_of_step[s], first_of_step[s + 1]) in `transfers`.
  std::vector<Transfer> transfers;
  std::vector<size_t> first_of_step(size + 1, 0);
  auto finish_step = [&](int step) -> Status {
    for (size_t i = first_of_step[step]; i < first_of_step[step + 1]; ++i) {
      COHORT_RETURN_IF_ERROR(ctx.wait(transfers[i]));
      if (!transfers[i].is_send) COHORT_RETURN_IF_ERROR(check_received_size(ctx, transfers[i]));
    }
    return ok_status();
  };
  for (int step = 1; step < size; ++step) {
    if (step > kAlltoallStepsInFlight) COHORT_RETURN_IF_ERROR(finish_step(step - kAlltoallStepsInFlight));
    first_of_step[step] = transfers.size();
    const int from = (rank - step + size) % size;
    const int to = (rank + step) % size;
    if (recv_bytes[from] > 0) {
      transfers.push_back(ctx.irecv(from, step, recv_base + recv_offsets[from], recv_bytes[from]));
    }
    if (send_bytes[to] > 0) {
      transfers.push_back(ctx.isend(to, step, send_base + send_offsets[to], send_bytes[to]));
    }
    first_of_step[step + 1] = transfers.size();
  }
  for (int step = std::max(1, size - kAlltoallStepsInFlight); step < size; ++step) {
    COHORT_RETURN_IF_ERROR(finish_step(step));
  }
  return ok_status();
}

}  // namespace cohort::comm
