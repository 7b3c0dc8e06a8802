#pragma once

// Test helper: runs `fn(rank, comm)` on every rank of an in-process loopback group (one thread
// per rank, a "flat" communicator each) and turns exceptions into failures, so a rank whose
// autograd op throws fails the test with the error text instead of aborting the process.

#include <chrono>
#include <exception>
#include <functional>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/communicator_factory.h"
#include "worker/comm/testing/loopback_world.h"
#include "worker/comm/testing/rank_threads.h"

namespace cohort::autograd::testing {

// Short enough that a deadlocked backward fails the test well within its size's limit.
inline constexpr comm::Duration kTestOpTimeout = std::chrono::seconds(10);

// "" when every rank returned normally; one line per failed rank otherwise.
inline std::string run_autograd_ranks(int size, const std::function<void(int rank, comm::Communicator& comm)>& fn,
                                      comm::Duration op_timeout = kTestOpTimeout) {
  auto worlds = comm::testing::loopback_worlds(size);
  comm::CommunicatorOptions options;
  options.timeout = op_timeout;
  auto statuses = comm::testing::run_ranks(size, [&](int rank) -> Status {
    auto made = comm::create_communicator("flat", worlds[rank], options);
    if (!made.ok()) return made.status();
    try {
      fn(rank, *made.value());
    } catch (const std::exception& e) {
      return internal_error("rank {} threw: {}", rank, e.what());
    }
    return ok_status();
  });
  return comm::testing::failures(statuses);
}

}  // namespace cohort::autograd::testing
