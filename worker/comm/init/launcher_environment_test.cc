// env:// under srun and mpirun without MASTER_ADDR / MASTER_PORT: the meeting point srun's
// variables imply, the error mpirun's give, and file:// / tcp:// taking the launcher's ranks.
// The real launchers run in tests/launchers/ (srun, sbatch, mpirun).

#include "worker/comm/init/launcher_environment.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "worker/comm/init/init_methods.h"
#include "worker/comm/init/init_options.h"
#include "worker/comm/store/store_test_util.h"

namespace cohort::comm {
namespace {

using Env = std::map<std::string, std::string>;

constexpr Duration kTestTimeout = std::chrono::seconds(20);

// What srun sets for task 1 of step 3 of job 4242 on two nodes.
const Env kSrunTask{{"SLURM_JOB_ID", "4242"},
                    {"SLURM_STEP_ID", "3"},
                    {"SLURM_STEPID", "3"},
                    {"SLURM_PROCID", "1"},
                    {"SLURM_NTASKS", "4"},
                    {"SLURM_LOCALID", "1"},
                    {"SLURM_NODEID", "0"},
                    {"SLURM_TASKS_PER_NODE", "2(x2)"},
                    {"SLURM_JOB_NODELIST", "node[01-04,07],gpu3"},
                    {"SLURM_STEP_NODELIST", "node[02-03]"}};

Env with(Env base, const Env& changes) {
  for (const auto& [name, value] : changes) base[name] = value;
  return base;
}

Env without(Env base, const std::string& name) {
  base.erase(name);
  return base;
}

InitOptions options_for(const std::string& url, Env variables) {
  InitOptions options = InitOptions::from_url(url);
  options.env = environment_from(std::move(variables));
  options.timeout = kTestTimeout;
  return options;
}

TEST(SlurmStepPortTest, StaysInTheDocumentedRangeAndSeparatesStepsAndNeighbouringJobs) {
  EXPECT_EQ(slurm_step_port(0, 0), kSlurmPortBase);
  EXPECT_EQ(slurm_step_port(4242, 3), kSlurmPortBase + (4242 % 750) * 16 + 3);
  std::set<int> ports;
  for (uint64_t job = 1000; job < 1000 + 750; ++job) {
    for (uint64_t step = 0; step < 16; ++step) {
      const int port = slurm_step_port(job, step);
      EXPECT_GE(port, kSlurmPortBase);
      EXPECT_LT(port, kSlurmPortBase + kSlurmPortRange);
      ports.insert(port);
    }
  }
  // 750 consecutive jobs × 16 steps: every pair gets its own port.
  EXPECT_EQ(ports.size(), 750u * 16u);
  // Special step ids (the batch step is 0xfffffffe) and huge job ids stay in range.
  EXPECT_LT(slurm_step_port(UINT64_MAX, 0xfffffffeu), kSlurmPortBase + kSlurmPortRange);
}

TEST(LauncherDetectionTest, SrunNeedsAJobAndATaskAndMpirunWins) {
  EXPECT_TRUE(launched_by_srun(environment_from(kSrunTask)));
  EXPECT_FALSE(launched_by_srun(environment_from(without(kSrunTask, "SLURM_PROCID"))));
  EXPECT_FALSE(launched_by_srun(environment_from(without(kSrunTask, "SLURM_JOB_ID"))));
  // mpirun inside an allocation: the ranks inherit the surrounding step's SLURM_* variables.
  const EnvLookup mpirun_in_slurm = environment_from(with(kSrunTask, {{"OMPI_COMM_WORLD_RANK", "0"}}));
  EXPECT_TRUE(launched_by_mpirun(mpirun_in_slurm));
  EXPECT_FALSE(launched_by_srun(mpirun_in_slurm));
}

TEST(SlurmMasterTest, FirstHostOfTheStepElseOfTheJob) {
  EXPECT_EQ(slurm_master_address(environment_from(kSrunTask)).value(), "node02");
  EXPECT_EQ(slurm_master_address(environment_from(without(kSrunTask, "SLURM_STEP_NODELIST"))).value(),
            "node01");
  EXPECT_EQ(slurm_master_port(environment_from(kSrunTask)).value(), slurm_step_port(4242, 3));
  // SLURM_STEPID, the older name, when SLURM_STEP_ID is missing; step 0 in a batch script.
  EXPECT_EQ(
      slurm_master_port(environment_from(with(without(kSrunTask, "SLURM_STEP_ID"), {{"SLURM_STEPID", "5"}})))
          .value(),
      slurm_step_port(4242, 5));
  EXPECT_EQ(slurm_master_port(environment_from(without(without(kSrunTask, "SLURM_STEP_ID"), "SLURM_STEPID")))
                .value(),
            slurm_step_port(4242, 0));
}

void expect_message(const Status& status, const std::vector<std::string>& parts) {
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.to_string();
  for (const std::string& part : parts) {
    EXPECT_NE(status.message().find(part), std::string::npos)
        << "missing \"" << part << "\" in: " << status.message();
  }
}

TEST(SlurmMasterTest, ErrorsNameTheVariableAndSayToSetMasterAddr) {
  expect_message(
      slurm_master_address(environment_from(with(kSrunTask, {{"SLURM_STEP_NODELIST", "node[02-"}}))).status(),
      {"rank 0's host comes from SLURM_STEP_NODELIST", "\"node[02-\"", "'[' is never closed",
       "set MASTER_ADDR"});
  expect_message(slurm_master_address(environment_from(without(without(kSrunTask, "SLURM_STEP_NODELIST"),
                                                               "SLURM_JOB_NODELIST")))
                     .status(),
                 {"neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST", "set MASTER_ADDR"});
  // Rank 0 away from the first node (srun -m arbitrary): it says so instead of letting the
  // others wait for it at the wrong host.
  expect_message(
      slurm_master_address(environment_from(with(kSrunTask, {{"SLURM_PROCID", "0"}, {"SLURM_NODEID", "1"}})))
          .status(),
      {"rank 0 runs on node 1 of SLURM_STEP_NODELIST=node[02-03]", "first host node02", "set MASTER_ADDR"});
  expect_message(slurm_master_port(environment_from(with(kSrunTask, {{"SLURM_JOB_ID", "12a"}}))).status(),
                 {"SLURM_JOB_ID=\"12a\" is not a number", "set MASTER_PORT"});
  expect_message(slurm_master_port(environment_from(with(kSrunTask, {{"SLURM_STEP_ID", "batch"}}))).status(),
                 {"SLURM_STEP_ID=\"batch\" is not a number", "set MASTER_PORT"});
}

TEST(EnvInitUnderSrunTest, DerivesTheMasterUnlessSet) {
  EnvRendezvous env = read_env_rendezvous(options_for("env://", kSrunTask)).value();
  EXPECT_EQ(env.master_address, "node02");
  EXPECT_EQ(env.master_port, slurm_step_port(4242, 3));
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_world_size, 2);
  // Each of MASTER_ADDR and MASTER_PORT wins on its own.
  env = read_env_rendezvous(options_for("env://", with(kSrunTask, {{"MASTER_ADDR", "login1"}}))).value();
  EXPECT_EQ(env.master_address, "login1");
  EXPECT_EQ(env.master_port, slurm_step_port(4242, 3));
  env = read_env_rendezvous(options_for("env://", with(kSrunTask, {{"MASTER_PORT", "29500"}}))).value();
  EXPECT_EQ(env.master_address, "node02");
  EXPECT_EQ(env.master_port, 29500);
  // Outside srun nothing is derived.
  expect_message(read_env_rendezvous(options_for("env://", without(kSrunTask, "SLURM_JOB_ID"))).status(),
                 {"MASTER_ADDR is not set"});
}

TEST(EnvInitUnderMpirunTest, NoMasterAddrSaysWhichInitUrlToPass) {
  const Env mpirun_in_slurm = with(
      kSrunTask,
      {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  const Env bare_mpirun{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}};
  for (const Env& variables : {bare_mpirun, mpirun_in_slurm}) {
    expect_message(read_env_rendezvous(options_for("env://", variables)).status(),
                   {"under mpirun (OMPI_COMM_WORLD_RANK=1): MASTER_ADDR is not set", "file:///",
                    "mpirun -np 2 cohort-bench --init file:///", "tcp://HOST:PORT",
                    "--init tcp://node1:29500", "MASTER_ADDR"});
  }
  // Open MPI's ranks win over the surrounding Slurm step's.
  EnvRendezvous env =
      read_env_rendezvous(
          options_for("env://", with(mpirun_in_slurm, {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}})))
          .value();
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
}

// Runs resolve_init for every rank on its own thread.
std::vector<StatusOr<Bootstrap>> resolve_all(const std::vector<InitOptions>& per_rank) {
  std::vector<std::future<StatusOr<Bootstrap>>> futures;
  for (const InitOptions& options : per_rank) {
    futures.push_back(std::async(std::launch::async, [options] { return resolve_init(options); }));
  }
  std::vector<StatusOr<Bootstrap>> results;
  for (auto& future : futures) results.push_back(future.get());
  return results;
}

TEST(FileInitUnderMpirunTest, RanksComeFromOpenMpi) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}", dir.file("store"));
  std::vector<InitOptions> per_rank;
  for (int rank = 0; rank < 2; ++rank) {
    per_rank.push_back(options_for(url, {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                         {"OMPI_COMM_WORLD_SIZE", "2"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  }
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(per_rank);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(boots[rank].ok()) << boots[rank].status().to_string();
    EXPECT_EQ(boots[rank]->rank, rank);
    EXPECT_EQ(boots[rank]->world_size, 2);
    EXPECT_EQ(boots[rank]->local_rank, rank);
    EXPECT_EQ(boots[rank]->local_world_size, 2);
  }
  ASSERT_TRUE(boots[1]->store->set("from/1", "hello").ok());
  EXPECT_EQ(boots[0]->store->get("from/1", kTestTimeout).value(), "hello");
}

TEST(FileInitUnderMpirunTest, TheUrlQueryWinsAndMissingRanksListTheLaunchers) {
  testing::TempDir dir;
  const std::string url = fmt::format("file://{}?rank=0&world_size=1", dir.file("store"));
  StatusOr<Bootstrap> boot =
      resolve_init(options_for(url, {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}}));
  ASSERT_TRUE(boot.ok()) << boot.status().to_string();
  EXPECT_EQ(boot->rank, 0);
  EXPECT_EQ(boot->world_size, 1);
  // No rank is fine (file:// assigns one in arrival order); no world size is not.
  expect_message(resolve_init(options_for(fmt::format("file://{}", dir.file("other")), {})).status(),
                 {"the world size is not set", "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS",
                  "assigns missing ranks in arrival order"});
  expect_message(
      resolve_init(options_for(fmt::format("file://{}", dir.file("other")), {{"RANK", "0"}})).status(),
      {"add &world_size=N to the URL", "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS"});
}

// A port in the derived range nobody listens on now, and the job id that maps to it (step 0).
uint64_t job_id_with_a_free_port() {
  for (uint64_t job = 1; job < kSlurmPortRange / kSlurmPortsPerJob; ++job) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(slurm_step_port(job, 0)));
    const bool free_port = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
    ::close(fd);
    if (free_port) return job;
  }
  return 0;
}

TEST(EnvInitUnderSrunTest, TwoTasksMeetAtTheDerivedAddressAndPort) {
  const uint64_t job = job_id_with_a_free_port();
  ASSERT_NE(job, 0u) << "every port of the derived range is taken";
  std::vector<InitOptions> per_rank;
  for (int rank = 0; rank < 2; ++rank) {
    per_rank.push_back(options_for("env://", {{"SLURM_JOB_ID", std::to_string(job)},
                                              {"SLURM_STEP_ID", "0"},
                                              {"SLURM_PROCID", std::to_string(rank)},
                                              {"SLURM_NTASKS", "2"},
                                              {"SLURM_LOCALID", std::to_string(rank)},
                                              {"SLURM_NODEID", "0"},
                                              {"SLURM_TASKS_PER_NODE", "2"},
                                              {"SLURM_STEP_NODELIST", "localhost"}}));
  }
  std::vector<StatusOr<Bootstrap>> boots = resolve_all(per_rank);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(boots[rank].ok()) << boots[rank].status().to_string();
    EXPECT_EQ(boots[rank]->master_address, "localhost");
    EXPECT_EQ(boots[rank]->rank, rank);
  }
  ASSERT_TRUE(boots[0]->store->set("from/0", "hello").ok());
  EXPECT_EQ(boots[1]->store->get("from/0", kTestTimeout).value(), "hello");
}

}  // namespace
}  // namespace cohort::comm
