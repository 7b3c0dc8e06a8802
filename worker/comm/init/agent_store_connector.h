#pragma once

// torchrun's agent store. Under torchrun's static rendezvous (torchrun --nnodes N --master_port P,
// its default) torchrun's own agent already serves a c10d TCPStore on MASTER_ADDR:MASTER_PORT
// and tells its workers so with TORCHELASTIC_USE_AGENT_STORE=True. Rank 0 then cannot serve
// cohort's TcpStore on that port (it is taken): every rank joins the agent's store as a c10d
// client instead, as torch.distributed's own env:// does.
//
// c10d's wire protocol belongs to libtorch, and worker/comm never links libtorch. So this is a
// seam: the libtorch layer registers a connector (worker/autograd/c10d_store.h does it at static
// initialisation in every program that links //worker/autograd), and env:// calls it when the
// variable says so. Without a connector, env:// fails with a message that says what to link.
//
//   register_agent_store_connector([](const AgentStoreAddress& a) { ...c10d client... });
//   // env:// under torchrun now uses the agent's store, under the key prefix below.

#include <functional>
#include <memory>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/init/environment.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

// Set by torchrun's agent for its workers: "True" when it serves the store (static rendezvous),
// "False" otherwise (c10d rendezvous, --standalone: then rank 0 serves cohort's store as usual).
inline constexpr const char* kUseAgentStoreVariable = "TORCHELASTIC_USE_AGENT_STORE";
// torchrun's restart count (0, 1, ...): part of the key prefix, so a restarted worker group never
// reads the keys of an earlier one (torch.distributed uses "/worker/attempt_<n>" the same way).
inline constexpr const char* kRestartCountVariable = "TORCHELASTIC_RESTART_COUNT";

// Where the agent's store is.
struct AgentStoreAddress {
  std::string host;                         // MASTER_ADDR
  int port = 0;                             // MASTER_PORT
  Duration timeout = kDefaultStoreTimeout;  // for connecting, and the store's default wait
};

// Connects to the c10d store at `address` as a client (never serves one). The returned store
// carries the raw keys; connect_agent_store adds cohort's prefix.
using AgentStoreConnector = std::function<StatusOr<std::shared_ptr<Store>>(const AgentStoreAddress& address)>;

// Installs `connector`, replacing an earlier one (the libtorch layer registers once; a test may
// install its own). Thread-safe.
void register_agent_store_connector(AgentStoreConnector connector);

// True when `env` has TORCHELASTIC_USE_AGENT_STORE set to "True", "true", "TRUE" or "1".
bool agent_store_requested(const EnvLookup& env);

// The agent's store at host:port, as a PrefixStore under "cohort/attempt_<TORCHELASTIC_RESTART_COUNT>"
// (keeps cohort's keys apart from torchrun's own and from a Python program's). FAILED_PRECONDITION
// when no connector is registered (the program does not link the libtorch layer), naming what to
// link; otherwise the connector's errors (UNAVAILABLE / DEADLINE_EXCEEDED naming the address).
// Blocking up to `timeout`.
StatusOr<std::shared_ptr<Store>> connect_agent_store(const std::string& host, int port, Duration timeout,
                                                     const EnvLookup& env);

}  // namespace cohort::comm
