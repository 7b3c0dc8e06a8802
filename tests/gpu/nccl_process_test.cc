// NCCL ranks as real processes (one GPU each, bootstrapped through a FileStore): a first
// allreduce proves the communicator works, then rank 1 is SIGKILLed and rank 0's next allreduce
// must fail (NCCL's asynchronous error, or the deadline) within twice its timeout, with the
// communicator aborted — never a hang. The parent never initialises CUDA (forked children could
// not use it then): it counts GPUs in a throwaway child. Without two GPUs it is SKIPPED.

#include <gtest/gtest.h>

#include "worker/comm/transport/nccl/cuda_testing.h"

#if COHORT_CUDA

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include <cuda_runtime_api.h>

#include "tests/comm/process_ranks.h"
#include "worker/comm/store/file_store.h"
#include "worker/comm/transport/nccl/nccl_transport.h"

namespace cohort::comm {
namespace {

using testing::ProcessRanks;
using testing::RankOutcome;

constexpr Duration kOpTimeout = std::chrono::seconds(5);

// GPUs as a child process sees them, leaving this process's CUDA uninitialised.
int gpus_seen_by_a_child() {
  pid_t pid = fork();
  if (pid == 0) _exit(std::min(cuda_device_count(), 100));
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
  return WEXITSTATUS(status);
}

class TempDir {
 public:
  TempDir() {
    char pattern[] = "/tmp/cohort-nccl-XXXXXX";
    path_ = mkdtemp(pattern);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(NcclProcessTest, AKilledPeerFailsTheOtherRankFastAndAbortsItsCommunicator) {
  int gpus = gpus_seen_by_a_child();
  if (gpus < 2) {
    std::string why = fmt::format("needs 2 GPUs (one per rank process) but a child process sees {}", gpus);
    std::fprintf(stderr, "SKIPPED: %s\n", why.c_str());
    GTEST_SKIP() << why;
  }
  TempDir dir;
  std::string store_path = dir.path() + "/store";
  ProcessRanks ranks(dir.path());
  ranks.fork_ranks(2, [&](int rank) -> Status {
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> store, FileStore::open(store_path));
    NcclOptions options;
    options.device = rank;
    COHORT_ASSIGN_OR_RETURN(std::unique_ptr<NcclTransport> nccl, NcclTransport::create(*store, rank, 2, options));
    if (cudaSetDevice(rank) != cudaSuccess) return internal_error("cudaSetDevice({})", rank);
    float* buf = nullptr;
    if (cudaMalloc(reinterpret_cast<void**>(&buf), 1024 * sizeof(float)) != cudaSuccess) return internal_error("cudaMalloc");
    COHORT_RETURN_IF_ERROR(
        nccl->allreduce(nullptr, buf, 1024, DataType::kFloat32, ReduceOp::kSum, Deadline::after(kOpTimeout)));
    // Both ranks finished the first allreduce: rank 1 now dies without a word.
    COHORT_RETURN_IF_ERROR(store->set(fmt::format("done/{}", rank), "1"));
    COHORT_RETURN_IF_ERROR(store->wait({"done/0", "done/1"}, kOpTimeout));
    if (rank == 1) raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    auto start = Clock::now();
    Status status = nccl->allreduce(nullptr, buf, 1024, DataType::kFloat32, ReduceOp::kSum, Deadline::after(kOpTimeout));
    auto waited = std::chrono::duration_cast<Duration>(Clock::now() - start);
    if (status.ok()) return internal_error("allreduce with a killed peer succeeded");
    if (waited > 2 * kOpTimeout) {
      return internal_error("failing took {} for a {} timeout: {}", format_duration(waited),
                            format_duration(kOpTimeout), status.to_string());
    }
    if (nccl->peer_status(1).ok()) return internal_error("communicator not aborted: {}", status.to_string());
    return ok_status();
  });
  std::vector<RankOutcome> outcomes = ranks.wait_all(std::chrono::seconds(120));
  EXPECT_EQ(outcomes[0].exit_code, 0) << outcomes[0].message;
  EXPECT_EQ(outcomes[1].signal, SIGKILL) << outcomes[1].message;
}

}  // namespace
}  // namespace cohort::comm

#else  // CPU-only build

TEST(NcclProcessTest, NeedsACudaBuildAndTwoGpus) { COHORT_SKIP_UNLESS_GPUS(2); }

#endif
