// env:// under torchrun's agent store, without libtorch: the flag's spellings, the message when no
// connector is linked, and the key prefix over whatever store a connector returns.

#include "worker/comm/init/agent_store_connector.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>

#include "worker/comm/init/init_options.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/store/store_test_util.h"

namespace cohort::comm {
namespace {

std::map<std::string, std::string> torchrun_env(std::string use_agent_store) {
  return {{kUseAgentStoreVariable, std::move(use_agent_store)},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29611"},
          {"RANK", "0"},
          {"WORLD_SIZE", "1"}};
}

// Installs a connector for one test and removes it afterwards.
class ScopedConnector {
 public:
  explicit ScopedConnector(AgentStoreConnector connector) {
    register_agent_store_connector(std::move(connector));
  }
  ~ScopedConnector() { register_agent_store_connector(nullptr); }
};

TEST(AgentStoreConnectorTest, OnlyTrueSpellingsRequestTheAgentStore) {
  for (const char* yes : {"True", "true", "TRUE", "1"})
    EXPECT_TRUE(agent_store_requested(environment_from({{kUseAgentStoreVariable, yes}}))) << yes;
  // torchrun's c10d rendezvous (--standalone) sets "False": rank 0 serves cohort's own store.
  for (const char* no : {"False", "false", "0", ""})
    EXPECT_FALSE(agent_store_requested(environment_from({{kUseAgentStoreVariable, no}}))) << no;
  EXPECT_FALSE(agent_store_requested(environment_from({})));
}

TEST(AgentStoreConnectorTest, WithoutTheLibtorchLayerEnvInitSaysWhatToLink) {
  InitOptions options = InitOptions::from_url("env://");
  options.env = environment_from(torchrun_env("True"));
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_FALSE(boot.ok());
  EXPECT_EQ(boot.status().code(), StatusCode::kFailedPrecondition);
  const std::string message = boot.status().message();
  EXPECT_NE(message.find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos) << message;
  EXPECT_NE(message.find("127.0.0.1:29611"), std::string::npos) << message;
  EXPECT_NE(message.find("//worker/autograd"), std::string::npos) << message;
  EXPECT_NE(message.find("--standalone"), std::string::npos) << message;
}

TEST(AgentStoreConnectorTest, ConnectorGetsTheMasterAndKeysGetTheAttemptPrefix) {
  auto backing = std::make_shared<HashStore>();
  AgentStoreAddress seen;
  ScopedConnector connector([&](const AgentStoreAddress& address) -> StatusOr<std::shared_ptr<Store>> {
    seen = address;
    return std::shared_ptr<Store>(backing);
  });
  InitOptions options = InitOptions::from_url("env://");
  std::map<std::string, std::string> env = torchrun_env("1");
  env[kRestartCountVariable] = "3";
  options.env = environment_from(env);
  options.timeout = std::chrono::seconds(7);
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  EXPECT_EQ(seen.host, "127.0.0.1");
  EXPECT_EQ(seen.port, 29611);
  EXPECT_EQ(seen.timeout, std::chrono::seconds(7));
  ASSERT_TRUE(boot->store->set("k", "v").ok());
  EXPECT_TRUE(backing->check({"cohort/attempt_3/k"}).value());
  EXPECT_FALSE(backing->check({"k"}).value());
}

TEST(AgentStoreConnectorTest, FlagFalseKeepsRankZerosOwnStore) {
  bool called = false;
  ScopedConnector connector([&](const AgentStoreAddress&) -> StatusOr<std::shared_ptr<Store>> {
    called = true;
    return std::shared_ptr<Store>(std::make_shared<HashStore>());
  });
  InitOptions options = InitOptions::from_url("env://");
  std::map<std::string, std::string> env = torchrun_env("False");
  env["MASTER_PORT"] = std::to_string(testing::pick_free_port());  // rank 0 serves cohort's store here
  options.env = environment_from(env);
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace cohort::comm
