// Init methods: env://, tcp:// and file:// with injected environments (torchrun, SLURM, Open MPI),
// every error text a user meets first, and real rendezvous of several ranks as threads.

#include "worker/comm/init/init_options.h"

#include <algorithm>
#include <future>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/init/init_methods.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_server.h"
#include "worker/comm/store/store_test_util.h"

namespace cohort::comm {
namespace {

using Env = std::map<std::string, std::string>;

// Rendezvous in these tests finishes in milliseconds; a broken one fails within this.
constexpr Duration kTestTimeout = std::chrono::seconds(20);

InitOptions env_options(Env variables) {
  InitOptions options = InitOptions::from_url("env://");
  options.env = environment_from(std::move(variables));
  options.timeout = kTestTimeout;
  return options;
}

const Env kTorchrun{{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}, {"RANK", "5"},
                    {"WORLD_SIZE", "8"},      {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"}};

Env with(Env base, const Env& changes) {
  for (const auto& [name, value] : changes) base[name] = value;
  return base;
}

Env without(Env base, const std::string& name) {
  base.erase(name);
  return base;
}

TEST(InitOptionsTest, FromUrlKeepsDefaults) {
  InitOptions options = InitOptions::from_url("tcp://h:1");
  EXPECT_EQ(options.url, "tcp://h:1");
  EXPECT_EQ(options.rank, -1);
  EXPECT_EQ(options.world_size, -1);
  EXPECT_EQ(options.timeout, kDefaultStoreTimeout);
  EXPECT_EQ(InitOptions().url, "env://");
}

TEST(EnvInitTest, ReadsTorchrunVariables) {
  EnvRendezvous env = read_env_rendezvous(env_options(kTorchrun)).value();
  EXPECT_EQ(env.master_address, "node0");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
}

TEST(EnvInitTest, FallsBackToSlurm) {
  const Env slurm{{"MASTER_ADDR", "n1"}, {"MASTER_PORT", "29500"}, {"SLURM_PROCID", "3"},
                  {"SLURM_NTASKS", "6"}, {"SLURM_LOCALID", "0"},   {"SLURM_TASKS_PER_NODE", "3(x2)"}};
  EnvRendezvous env = read_env_rendezvous(env_options(slurm)).value();
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 3);
  // --ntasks-per-node wins over the layout string.
  EXPECT_EQ(read_env_rendezvous(env_options(with(slurm, {{"SLURM_NTASKS_PER_NODE", "2"}})))
                .value()
                .local_world_size,
            2);
}

TEST(EnvInitTest, UnevenSlurmLayoutLeavesTheLocalSizeToBeDerived) {
  const Env slurm{{"MASTER_ADDR", "n1"},
                  {"MASTER_PORT", "29500"},
                  {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "7"},
                  {"SLURM_TASKS_PER_NODE", "2(x3),1"}};
  EXPECT_EQ(read_env_rendezvous(env_options(slurm)).value().local_world_size, -1);
}

TEST(EnvInitTest, FallsBackToOpenMpi) {
  const Env ompi{{"MASTER_ADDR", "n1"},
                 {"MASTER_PORT", "29500"},
                 {"OMPI_COMM_WORLD_RANK", "2"},
                 {"OMPI_COMM_WORLD_SIZE", "4"},
                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  EnvRendezvous env = read_env_rendezvous(env_options(ompi)).value();
  EXPECT_EQ(env.rank, 2);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 2);
}

TEST(EnvInitTest, TorchrunVariablesWinOverSlurmAndOptionsWinOverBoth) {
  InitOptions options = env_options(with(kTorchrun, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}));
  EXPECT_EQ(read_env_rendezvous(options).value().rank, 5);
  options.rank = 7;
  options.world_size = 9;
  EnvRendezvous env = read_env_rendezvous(options).value();
  EXPECT_EQ(env.rank, 7);
  EXPECT_EQ(env.world_size, 9);
}

TEST(EnvInitTest, MissingMasterAddrSaysWhatToSet) {
  Status status = read_env_rendezvous(env_options(without(kTorchrun, "MASTER_ADDR"))).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("MASTER_ADDR is not set; set MASTER_ADDR to"), std::string::npos)
      << status.message();
}

TEST(EnvInitTest, MissingOrGarbledMasterPortNamesIt) {
  Status missing = read_env_rendezvous(env_options(without(kTorchrun, "MASTER_PORT"))).status();
  EXPECT_NE(missing.message().find("MASTER_PORT is not set; set MASTER_PORT to a free TCP port"),
            std::string::npos)
      << missing.message();
  for (const char* bad : {"http", "0", "70000", "-1", " 29500"}) {
    Status garbled = read_env_rendezvous(env_options(with(kTorchrun, {{"MASTER_PORT", bad}}))).status();
    EXPECT_EQ(garbled.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(garbled.message().find(fmt::format("MASTER_PORT=\"{}\" is not a port number", bad)),
              std::string::npos)
        << garbled.message();
  }
}

TEST(EnvInitTest, MissingRankListsEveryVariableItLookedAt) {
  Status status = read_env_rendezvous(env_options(without(kTorchrun, "RANK"))).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("none of RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID"), std::string::npos)
      << status.message();
  EXPECT_NE(status.message().find("set RANK to"), std::string::npos) << status.message();
  Status world = read_env_rendezvous(env_options(without(kTorchrun, "WORLD_SIZE"))).status();
  EXPECT_NE(world.message().find("none of WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS"), std::string::npos)
      << world.message();
}

TEST(EnvInitTest, GarbledVariablesAreNamedWithTheirValue) {
  Status rank = read_env_rendezvous(env_options(with(kTorchrun, {{"RANK", "one"}}))).status();
  EXPECT_EQ(rank.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(rank.message().find("RANK=\"one\" is not an integer >= 0"), std::string::npos) << rank.message();
  Status world = read_env_rendezvous(env_options(with(kTorchrun, {{"WORLD_SIZE", "0"}}))).status();
  EXPECT_NE(world.message().find("WORLD_SIZE=\"0\" is not an integer >= 1"), std::string::npos)
      << world.message();
  Status slurm =
      read_env_rendezvous(env_options(with(without(kTorchrun, "LOCAL_RANK"), {{"SLURM_LOCALID", "x"}})))
          .status();
  EXPECT_NE(slurm.message().find("SLURM_LOCALID=\"x\""), std::string::npos) << slurm.message();
}

TEST(EnvInitTest, RankOutOfRangeNamesBothSources) {
  Status status = read_env_rendezvous(env_options(with(kTorchrun, {{"RANK", "8"}}))).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("rank 8 is out of range for world size 8 (RANK=8, WORLD_SIZE=8)"),
            std::string::npos)
      << status.message();
}

TEST(EnvInitTest, ResolveReportsEnvironmentErrorsBeforeConnecting) {
  Status status = resolve_init(env_options({})).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("RANK"), std::string::npos) << status.message();
}

// Runs resolve_init for every rank on its own thread and returns each rank's result.
std::vector<StatusOr<Bootstrap>> resolve_all(const std::vector<InitOptions>& per_rank) {
  std::vector<std::future<StatusOr<Bootstrap>>> futures;
  for (const InitOptions& options : per_rank) {
    futures.push_back(std::async(std::launch::async, [options] { return resolve_init(options); }));
  }
  std::vector<StatusOr<Bootstrap>> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

// Every rank publishes a key and reads every other rank's through its own store.
void expect_ranks_exchange_keys(std::vector<StatusOr<Bootstrap>>& boots) {
  for (auto& boot : boots) {
    ASSERT_TRUE(boot.ok()) << boot.status().to_string();
    ASSERT_TRUE(
        boot->store->set(fmt::format("hello/{}", boot->rank), fmt::format("from {}", boot->rank)).ok());
  }
  for (auto& boot : boots) {
    for (int peer = 0; peer < boot->world_size; ++peer) {
      EXPECT_EQ(boot->store->get(fmt::format("hello/{}", peer), kTestTimeout).value(),
                fmt::format("from {}", peer));
    }
  }
}

TEST(TcpInitTest, ThreeRanksRendezvousAndGroupByNodeId) {
  const int port = testing::pick_free_port();
  std::vector<InitOptions> per_rank;
  for (int rank = 0; rank < 3; ++rank) {
    InitOptions options = InitOptions::from_url(fmt::format("tcp://127.0.0.1:{}?world_size=3", port));
    options.rank = rank;
    options.node_id = rank < 2 ? "node-a" : "node-b";  // two simulated nodes on this machine
    options.timeout = kTestTimeout;
    options.env = environment_from({});
    per_rank.push_back(options);
  }
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(per_rank);
  expect_ranks_exchange_keys(boots);
  for (int rank = 0; rank < 3; ++rank) {
    const Bootstrap& boot = *boots[static_cast<size_t>(rank)];
    EXPECT_EQ(boot.rank, rank);
    EXPECT_EQ(boot.world_size, 3);
    EXPECT_EQ(boot.master_address, "127.0.0.1");
    EXPECT_EQ(boot.node_id, rank < 2 ? "node-a" : "node-b");
  }
  EXPECT_EQ(boots[0]->local_rank, 0);
  EXPECT_EQ(boots[1]->local_rank, 1);
  EXPECT_EQ(boots[2]->local_rank, 0);
  EXPECT_EQ(boots[0]->local_world_size, 2);
  EXPECT_EQ(boots[1]->local_world_size, 2);
  EXPECT_EQ(boots[2]->local_world_size, 1);
}

TEST(TcpInitTest, ExternalStoreServerIsUsedInsteadOfRankZeroServing) {
  // A standalone server (what cohort-store runs) already listens: rank 0 must not try to serve.
  TcpStoreServerOptions server_options;
  server_options.host = "127.0.0.1";
  auto server = TcpStoreServer::start(server_options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  std::vector<InitOptions> per_rank;
  for (int rank = 0; rank < 2; ++rank) {
    InitOptions options = InitOptions::from_url(fmt::format(
        "tcp://127.0.0.1:{}?rank={}&world_size=2&local_rank={}&local_world_size=2&store=external",
        (*server)->port(), rank, rank));
    options.timeout = kTestTimeout;
    options.env = environment_from({});
    per_rank.push_back(options);
  }
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(per_rank);
  expect_ranks_exchange_keys(boots);
  // The keys live in the standalone server and survive the ranks' stores.
  boots.clear();
  auto client = TcpStore::connect("127.0.0.1", (*server)->port(), kTestTimeout);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  EXPECT_GT((*client)->num_keys().value(), 0);
}

TEST(TcpInitTest, UnknownStoreModeIsRejected) {
  InitOptions options = InitOptions::from_url("tcp://127.0.0.1:1?rank=0&world_size=1&store=cloud");
  options.env = environment_from({});
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_FALSE(boot.ok());
  EXPECT_NE(boot.status().message().find("store=external"), std::string::npos) << boot.status().message();
}

TEST(TcpInitTest, RankAndWorldSizeFromTheQuery) {
  const int port = testing::pick_free_port();
  InitOptions options = InitOptions::from_url(
      fmt::format("tcp://127.0.0.1:{}?rank=0&world_size=1&local_rank=0&local_world_size=1", port));
  options.timeout = kTestTimeout;
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  EXPECT_EQ(boot->rank, 0);
  EXPECT_EQ(boot->world_size, 1);
  // Local ranks were given: no node-id exchange happened.
  EXPECT_FALSE(boot->store->check({"cohort/init/node/0"}).value());
}

TEST(TcpInitTest, ErrorsNameTheUrlAndWhatToAdd) {
  InitOptions options = InitOptions::from_url("tcp://127.0.0.1:29500?world_size=2");
  Status no_rank = resolve_init(options).status();
  EXPECT_EQ(no_rank.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(no_rank.message().find("add ?rank=R to the URL"), std::string::npos) << no_rank.message();
  EXPECT_NE(no_rank.message().find("tcp://127.0.0.1:29500?world_size=2"), std::string::npos)
      << no_rank.message();

  Status no_port = resolve_init(InitOptions::from_url("tcp://127.0.0.1?rank=0&world_size=1")).status();
  EXPECT_NE(no_port.message().find("has no port"), std::string::npos) << no_port.message();

  options.rank = 1;
  options.url = "tcp://127.0.0.1:29500?rank=0&world_size=2";
  Status conflict = resolve_init(options).status();
  EXPECT_NE(conflict.message().find("rank is 1 in InitOptions but 0 in the URL"), std::string::npos)
      << conflict.message();

  Status out_of_range =
      resolve_init(InitOptions::from_url("tcp://127.0.0.1:29500?rank=2&world_size=2")).status();
  EXPECT_NE(out_of_range.message().find("rank 2 is out of range for world size 2"), std::string::npos)
      << out_of_range.message();

  Status unknown = resolve_init(InitOptions::from_url("tcp://127.0.0.1:29500?rank=0&size=2")).status();
  EXPECT_NE(unknown.message().find("unknown query parameter \"size\""), std::string::npos)
      << unknown.message();

  Status garbled = resolve_init(InitOptions::from_url("tcp://127.0.0.1:29500?rank=x&world_size=2")).status();
  EXPECT_NE(garbled.message().find("rank=\"x\" is not an integer"), std::string::npos) << garbled.message();
}

TEST(EnvInitTest, TwoRanksRendezvousThroughMasterAddrAndPort) {
  const Env common{{"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", std::to_string(testing::pick_free_port())},
                   {"WORLD_SIZE", "2"},
                   {"COHORT_NODE_ID", "only-node"}};
  std::vector<StatusOr<Bootstrap>> boots =
      resolve_all({env_options(with(common, {{"RANK", "0"}})), env_options(with(common, {{"RANK", "1"}}))});
  expect_ranks_exchange_keys(boots);
  EXPECT_EQ(boots[1]->master_address, "127.0.0.1");
  EXPECT_EQ(boots[1]->node_id, "only-node");
  // No LOCAL_* variables: derived from COHORT_NODE_ID, which both ranks share.
  EXPECT_EQ(boots[1]->local_rank, 1);
  EXPECT_EQ(boots[1]->local_world_size, 2);
}

TEST(FileInitTest, TwoRanksRendezvousThroughAFile) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}?world_size=2", dir.file("store"));
  std::vector<InitOptions> per_rank;
  for (int rank = 0; rank < 2; ++rank) {
    InitOptions options = InitOptions::from_url(url);
    options.rank = rank;
    options.node_id = fmt::format("node-{}", rank);
    options.timeout = kTestTimeout;
    per_rank.push_back(options);
  }
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(per_rank);
  expect_ranks_exchange_keys(boots);
  EXPECT_EQ(boots[1]->local_rank, 0);
  EXPECT_EQ(boots[1]->local_world_size, 1);
  EXPECT_EQ(boots[1]->master_address, "");
}

TEST(FileInitTest, ARelativePathIsRejectedWithTheFix) {
  Status status = resolve_init(InitOptions::from_url("file://store?rank=0&world_size=1")).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("file:///absolute/path"), std::string::npos) << status.message();
}

TEST(FileInitTest, AMissingDirectoryNamesThePath) {
  Status status =
      resolve_init(InitOptions::from_url("file:///nonexistent-cohort-dir/store?rank=0&world_size=1"))
          .status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("/nonexistent-cohort-dir/store"), std::string::npos) << status.message();
}

TEST(InitRegistryTest, UnknownSchemesListTheSupportedOnes) {
  Status status = resolve_init(InitOptions::from_url("nccl://x")).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("unknown scheme \"nccl\""), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("env://, file://, tcp://"), std::string::npos) << status.message();
  Status no_scheme = resolve_init(InitOptions::from_url("127.0.0.1:29500")).status();
  EXPECT_NE(no_scheme.message().find("has no scheme"), std::string::npos) << no_scheme.message();
}

// What the control plane does for cohort://: a scheme whose method hands out its own store.
// Registered once per test process (the registry is global, and tests may run repeatedly).
const std::shared_ptr<HashStore>& memory_scheme_store() {
  static const std::shared_ptr<HashStore> store = [] {
    auto shared = std::make_shared<HashStore>();
    Status registered = register_init_method(
        "test-memory", [shared](const InitUrl& url, const InitOptions& options) -> StatusOr<Bootstrap> {
          Bootstrap boot;
          boot.store = shared;
          boot.rank = options.rank;
          boot.world_size = options.world_size;
          boot.local_rank = options.local_rank;  // -1 unless given: resolve_init derives it
          boot.local_world_size = options.local_world_size;
          boot.master_address = url.authority;
          return boot;
        });
    EXPECT_TRUE(registered.ok()) << registered.to_string();
    return shared;
  }();
  return store;
}

TEST(InitRegistryTest, ARegisteredSchemeIsUsedAndCompleted) {
  const std::shared_ptr<HashStore>& shared = memory_scheme_store();
  EXPECT_EQ(register_init_method("test-memory", nullptr).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(register_init_method("tcp", nullptr).code(), StatusCode::kAlreadyExists);
  const std::vector<std::string> schemes = init_method_schemes();
  EXPECT_NE(std::find(schemes.begin(), schemes.end(), "test-memory"), schemes.end());

  InitOptions options = InitOptions::from_url("test-memory://coordinator:7070/job-1?rank=0&world_size=1");
  options.node_id = "n";
  StatusOr<Bootstrap> boot = resolve_init(options);
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  EXPECT_EQ(boot->store, shared);
  EXPECT_EQ(boot->master_address, "coordinator:7070");
  EXPECT_EQ(boot->local_rank, 0);  // derived by resolve_init, not the method
  EXPECT_EQ(boot->local_world_size, 1);
  EXPECT_EQ(boot->node_id, "n");
}

TEST(InitOptionsTest, NodeIdComesFromCohortNodeIdThenTheHostName) {
  memory_scheme_store();
  InitOptions options =
      InitOptions::from_url("test-memory://x?rank=0&world_size=1&local_rank=0&local_world_size=1");
  options.env = environment_from({{"COHORT_NODE_ID", "rack3-node7"}});
  EXPECT_EQ(resolve_init(options).value().node_id, "rack3-node7");
  options.env = environment_from({});
  EXPECT_FALSE(resolve_init(options).value().node_id.empty());
  options.node_id = "explicit";  // InitOptions wins over COHORT_NODE_ID
  options.env = environment_from({{"COHORT_NODE_ID", "rack3-node7"}});
  EXPECT_EQ(resolve_init(options).value().node_id, "explicit");
}

TEST(InitOptionsTest, LocalRanksThatDoNotFitAreRejected) {
  const int port = testing::pick_free_port();
  InitOptions options = InitOptions::from_url(
      fmt::format("tcp://127.0.0.1:{}?rank=0&world_size=1&local_rank=2&local_world_size=2", port));
  options.timeout = kTestTimeout;
  Status status = resolve_init(options).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("local rank 2 / local world size 2"), std::string::npos)
      << status.message();
}

}  // namespace
}  // namespace cohort::comm
