// monitored_barrier (declared in collectives.h): a barrier over point-to-point messages through
// rank 0, so that rank 0 knows exactly which ranks did not arrive.
//
// Protocol: every rank r > 0 sends one int32 "arrived" to rank 0 (tag kMonitoredBarrierArriveTag)
// and waits for rank 0's int32 release (kMonitoredBarrierReleaseTag): 0 when every rank arrived,
// else the number of ranks missing. Rank 0 posts a receive from every rank with the timeout,
// waits for all of them (they share one deadline, so waiting for all costs no more than the
// first failure), then releases the ranks that arrived.

#include <string>
#include <vector>

#include <fmt/format.h>

#include "worker/distributed/collectives.h"
#include "worker/distributed/point_to_point.h"
#include "worker/distributed/tensor_staging.h"

namespace cohort::distributed {

void monitored_barrier(Communicator& group, std::optional<comm::Duration> timeout, bool wait_all_ranks) {
  const std::string name = "monitored_barrier";
  if (group.size() == 1) return;
  const comm::Duration limit = timeout.value_or(group.options().timeout);
  comm::CallOptions call;
  call.timeout = limit;
  if (group.rank() != 0) {
    int32_t arrived = 1, release = -1;
    // Rank 0 may arrive late, then waits up to `limit` for the others. The arrival gets as long
    // as the release: a send may complete only once rank 0 posted its receive (the loopback
    // transport, large UCX messages, COHORT_DEBUG=detail's check), so a rank 0 late by more than
    // `limit` would otherwise find this rank missing although it came.
    call.timeout = 2 * limit;
    auto send = group.isend(&arrived, 1, comm::DataType::kInt32, 0, kMonitoredBarrierArriveTag, call);
    auto recv = group.irecv(&release, 1, comm::DataType::kInt32, 0, kMonitoredBarrierReleaseTag, call);
    Status sent = send->wait(), released = recv->wait();
    if (!sent.ok() || !released.ok()) {
      internal::fail(
          name, fmt::format("rank {} was not released by rank 0 within {}: {}", group.rank(),
                            comm::format_duration(2 * limit), (!sent.ok() ? sent : released).to_string()));
    }
    if (release != 0) {
      internal::fail(
          name, fmt::format("rank 0 found {} rank(s) that did not arrive within {} (rank 0's error names "
                            "them)",
                            release, comm::format_duration(limit)));
    }
    return;
  }
  std::vector<int32_t> arrived(group.size(), 0);
  std::vector<std::shared_ptr<comm::Work>> recvs(group.size());
  for (int r = 1; r < group.size(); ++r) {
    recvs[r] = group.irecv(&arrived[r], 1, comm::DataType::kInt32, r, kMonitoredBarrierArriveTag, call);
  }
  std::vector<int> missing;
  for (int r = 1; r < group.size(); ++r) {
    if (!recvs[r]->wait().ok()) missing.push_back(r);
  }
  int32_t release = static_cast<int32_t>(missing.size());
  std::vector<std::shared_ptr<comm::Work>> releases;
  for (int r = 1; r < group.size(); ++r) {
    if (recvs[r]->error().ok()) {
      releases.push_back(
          group.isend(&release, 1, comm::DataType::kInt32, r, kMonitoredBarrierReleaseTag, call));
    }
  }
  for (const auto& work : releases) (void)work->wait();
  if (missing.empty()) return;
  const std::string more =
      !wait_all_ranks && missing.size() > 1
          ? fmt::format(" (the first of {}; wait_all_ranks=true names every one)", missing.size())
          : "";
  if (!wait_all_ranks) missing.resize(1);
  internal::fail(name, fmt::format("{} {} did not arrive within {}{}", missing.size() == 1 ? "rank" : "ranks",
                                   fmt::join(missing, ", "), comm::format_duration(limit), more));
}

}  // namespace cohort::distributed
