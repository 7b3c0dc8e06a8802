#include "worker/comm/init/agent_store_connector.h"

#include <mutex>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "worker/comm/store/prefix_store.h"

namespace cohort::comm {
namespace {

// Prefix of cohort's keys in the agent's store; the attempt number follows.
constexpr const char* kAgentStoreKeyPrefix = "cohort/attempt_";

struct ConnectorSlot {
  std::mutex mutex;
  AgentStoreConnector connector;
};

ConnectorSlot& slot() {
  static ConnectorSlot* instance = new ConnectorSlot();  // never destroyed: usable during static teardown
  return *instance;
}

}  // namespace

void register_agent_store_connector(AgentStoreConnector connector) {
  ConnectorSlot& s = slot();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.connector = std::move(connector);
}

bool agent_store_requested(const EnvLookup& env) {
  const std::optional<std::string> value = (env ? env : process_environment())(kUseAgentStoreVariable);
  return value && (*value == "True" || *value == "true" || *value == "TRUE" || *value == "1");
}

StatusOr<std::shared_ptr<Store>> connect_agent_store(const std::string& host, int port, Duration timeout,
                                                     const EnvLookup& env) {
  AgentStoreConnector connector;
  {
    ConnectorSlot& s = slot();
    std::lock_guard<std::mutex> lock(s.mutex);
    connector = s.connector;
  }
  if (!connector) {
    return failed_precondition_error(
        "env:// init: {}=True says torchrun's agent already serves the store on MASTER_ADDR:MASTER_PORT "
        "({}:{}), but this program cannot join it: the c10d client lives in cohort's libtorch layer. Link "
        "//worker/autograd (Bazel) or cohort::torch (the CMake package) into the program, or run torchrun "
        "with --standalone or --rdzv_backend c10d, where rank 0 serves cohort's own store",
        kUseAgentStoreVariable, host, port);
  }
  const std::optional<std::string> restart = (env ? env : process_environment())(kRestartCountVariable);
  const std::string prefix =
      fmt::format("{}{}", kAgentStoreKeyPrefix, restart && !restart->empty() ? *restart : "0");
  COHORT_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, connector(AgentStoreAddress{host, port, timeout}));
  if (store == nullptr) {
    return internal_error("env:// init: the agent store connector returned no store for {}:{}", host, port);
  }
  return std::shared_ptr<Store>(std::make_shared<PrefixStore>(prefix, std::move(store)));
}

}  // namespace cohort::comm
