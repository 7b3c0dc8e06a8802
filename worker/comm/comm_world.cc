#include "worker/comm/comm_world.h"

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "worker/comm/bootstrap.h"

namespace cohort::comm {
namespace {

struct WorldState {
  std::mutex mu;
  std::unique_ptr<Communicator> comm;  // guarded by mu
  bool finalized = false;              // guarded by mu
};

Status check_not_finalized(const WorldState& s, const char* op) {
  if (!s.finalized) return ok_status();
  return failed_precondition_error(
      "{}: finalize_comm_world() was called; the world communicator cannot be used or built again in this "
      "process",
      op);
}

// Deliberately never destroyed: a communicator left at exit is released by the OS, not by a static
// destructor racing the transport's own teardown.
WorldState& state() {
  static WorldState* state = new WorldState();
  return *state;
}

}  // namespace

StatusOr<Communicator*> comm_world() {
  WorldState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  COHORT_RETURN_IF_ERROR(check_not_finalized(s, "comm_world"));
  if (s.comm == nullptr) {
    auto made = create_communicator(kDefaultCommunicatorKind, InitOptions::from_url("env://"));
    if (!made.ok()) {
      return made.status().with_context(
          "comm_world: building the world communicator from env:// (set RANK, WORLD_SIZE, MASTER_ADDR and "
          "MASTER_PORT, or call init_comm_world first)");
    }
    s.comm = std::move(made).value();
  }
  return s.comm.get();
}

Status init_comm_world(const InitOptions& init, std::string_view kind, CommunicatorOptions options) {
  WorldState& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  COHORT_RETURN_IF_ERROR(check_not_finalized(s, "init_comm_world"));
  if (s.comm != nullptr) {
    return already_exists_error(
        "init_comm_world: the world communicator ({}) exists already; init_comm_world must come before the "
        "first comm_world()",
        s.comm->description());
  }
  COHORT_ASSIGN_OR_RETURN(s.comm, create_communicator(kind, init, options));
  return ok_status();
}

void finalize_comm_world() {
  WorldState& s = state();
  std::unique_ptr<Communicator> comm;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    comm = std::move(s.comm);
    s.finalized = true;
  }
  comm.reset();  // outside the lock: closing the transport may take a moment
}

}  // namespace cohort::comm
