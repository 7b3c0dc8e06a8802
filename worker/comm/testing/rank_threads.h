#pragma once

// Test helper: runs `fn(rank)` for every rank of a group on its own thread and collects each
// rank's Status. A rank that throws or never returns fails the test instead of hanging it: the
// joined threads are bounded by `timeout`.

#include <functional>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"

namespace cohort::comm::testing {

inline constexpr Duration kRankThreadsTimeout = std::chrono::seconds(60);

// Returns the per-rank statuses; a rank still running after `timeout` reports DEADLINE_EXCEEDED
// (its thread is detached — the test has already failed then).
inline std::vector<Status> run_ranks(int size, const std::function<Status(int rank)>& fn,
                                     Duration timeout = kRankThreadsTimeout) {
  std::vector<std::future<Status>> futures;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < size; ++rank) {
    std::packaged_task<Status()> task([&fn, rank] { return fn(rank); });
    futures.push_back(task.get_future());
    threads.emplace_back(std::move(task));
  }
  Deadline deadline = Deadline::after(timeout);
  std::vector<Status> results;
  for (int rank = 0; rank < size; ++rank) {
    if (futures[rank].wait_for(deadline.remaining()) == std::future_status::ready) {
      threads[rank].join();
      results.push_back(futures[rank].get());
    } else {
      threads[rank].detach();
      results.push_back(deadline_exceeded_error("rank {} still running after {}", rank, format_duration(timeout)));
    }
  }
  return results;
}

// "" when every status is OK, else one line per failed rank (for EXPECT messages).
inline std::string failures(const std::vector<Status>& statuses) {
  std::string out;
  for (size_t rank = 0; rank < statuses.size(); ++rank) {
    if (!statuses[rank].ok()) out += fmt::format("rank {}: {}\n", rank, statuses[rank].to_string());
  }
  return out;
}

}  // namespace cohort::comm::testing
