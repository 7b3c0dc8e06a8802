// The environment-built communicators over UCX processes: ChainerMN's create_communicator() with
// no arguments and mpi4torch's COMM_WORLD (comm_world()), each child given torchrun's variables
// (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: a port free at the start of the run).

#include <stdlib.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "daemon/agent/free_port.h"
#include "daemon/coordinator/temp_dir.h"
#include "tests/comm/process_ranks.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/comm_world.h"

namespace cohort::comm {
namespace {

using std::chrono::seconds;
using testing::failed_ranks;
using testing::ProcessRanks;

constexpr Duration kTestDeadline = seconds(90);

using coordinator::testing::TempDir;

// torchrun's variables for `rank` of `size`, in this (child) process.
void set_launch_environment(int rank, int size, int port) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(size).c_str(), 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  // Two ranks per simulated node, so hierarchical has an inter-node level from 3 ranks on.
  setenv("COHORT_NODE_ID", ("node" + std::to_string(rank / 2)).c_str(), 1);
  unsetenv("LOCAL_RANK");
  unsetenv("LOCAL_WORLD_SIZE");
}

// The checks both forms share: coordinates from the environment, the default kind, and a working
// collective (Σ (rank+1)).
Status check_world(Communicator& comm, int rank, int size) {
  if (comm.rank() != rank || comm.size() != size) {
    return internal_error("rank {} of {}, expected {} of {}", comm.rank(), comm.size(), rank, size);
  }
  if (comm.kind() != "hierarchical") return internal_error("kind {}, expected hierarchical", comm.kind());
  if (comm.inter_size() != (size + 1) / 2) return internal_error("inter_size {}", comm.inter_size());
  COHORT_ASSIGN_OR_RETURN(double sum, comm.allreduce_obj(rank + 1.0));
  if (sum != size * (size + 1) / 2.0) return internal_error("allreduce gave {}", sum);
  return ok_status();
}

class CommWorldProcessTest : public ::testing::Test {
 protected:
  std::string run(int size, const std::function<Status(int rank)>& body) {
    StatusOr<int> port = agent::pick_free_port("127.0.0.1");
    if (!port.ok()) return port.status().to_string();
    ProcessRanks ranks(dir_.path());
    ranks.fork_ranks(size, [&](int rank) -> Status {
      set_launch_environment(rank, size, *port);
      return body(rank);
    });
    return failed_ranks(ranks.wait_all(kTestDeadline));
  }

  TempDir dir_;
};

TEST_F(CommWorldProcessTest, CreateCommunicatorWithoutArgumentsIsHierarchicalOverEnv) {
  for (int size : {2, 3}) {
    EXPECT_EQ(run(size,
                  [size](int rank) -> Status {
                    COHORT_ASSIGN_OR_RETURN(auto comm, create_communicator());
                    return check_world(*comm, rank, size);
                  }),
              "")
        << "size " << size;
  }
}

TEST_F(CommWorldProcessTest, CommWorldIsBuiltOnceFromTheEnvironment) {
  for (int size : {2, 4}) {
    EXPECT_EQ(run(size,
                  [size](int rank) -> Status {
                    COHORT_ASSIGN_OR_RETURN(Communicator * first, comm_world());
                    COHORT_RETURN_IF_ERROR(check_world(*first, rank, size));
                    COHORT_ASSIGN_OR_RETURN(Communicator * again, comm_world());
                    if (again != first) return internal_error("a second comm_world() built another communicator");
                    Status twice = init_comm_world(InitOptions::from_url("env://"));
                    if (twice.code() != StatusCode::kAlreadyExists) {
                      return internal_error("init_comm_world after comm_world: {}", twice.to_string());
                    }
                    COHORT_RETURN_IF_ERROR(first->barrier()->wait());
                    finalize_comm_world();
                    auto after = comm_world();
                    if (after.ok() || after.status().code() != StatusCode::kFailedPrecondition) {
                      return internal_error("comm_world after finalize: {}", after.status().to_string());
                    }
                    return ok_status();
                  }),
              "")
        << "size " << size;
  }
}

// Without the launch variables the error says what to set, at once (no waiting for a store).
TEST_F(CommWorldProcessTest, CommWorldWithoutTheEnvironmentNamesWhatToSet) {
  EXPECT_EQ(run(1,
                [](int) -> Status {
                  unsetenv("MASTER_PORT");
                  auto world = comm_world();
                  if (world.ok() || world.status().message().find("MASTER_PORT") == std::string::npos) {
                    return internal_error("expected an error naming MASTER_PORT, got {}",
                                          world.ok() ? std::string("OK") : world.status().to_string());
                  }
                  return ok_status();
                }),
            "");
}

}  // namespace
}  // namespace cohort::comm
