// Persistence when the disk fills up (issue 16), for real: the coordinator's data directory is a
// small tmpfs (mounted in a private mount namespace of this test process, so it vanishes with it,
// whatever happens), and the test fills it with a file until ENOSPC while the coordinator serves.
//
//  - Submits and cancels go on, as a client would send them; every answer is recorded: an accepted
//    submit is a job the client saw PENDING, an accepted cancel one it saw CANCELLED. Writes that
//    do not fit are refused with UNAVAILABLE naming the job store, and the coordinator's health
//    (grpc.health.v1, service cohort.v1.Coordinator) turns NOT_SERVING; a refused cancel leaves the
//    job as it was (GetJob), a refused submit leaves no job.
//  - The filler is deleted: within a few retry intervals health is SERVING again and a submit is
//    accepted.
//  - The coordinator restarts on the same directory: every job's state is the one the client last
//    saw, and there is no job that the client was told was refused.
//
// Needs root to mount; where mount(2) is refused the test is skipped, saying why.

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/coordinator.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "tests/control_plane/coordinator_calls.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using testing::kPollInterval;
using testing::set_deadline;

// Room for the coordinator's CA, credentials and databases, and little else.
constexpr const char* kTmpfsSize = "size=6m";
// Operations tried while the disk is full: enough for several refusals after the first one.
constexpr int kFullDiskOperations = 40;
// The coordinator retries a write every second (kDefaultStoreRetryInterval); this is ample.
constexpr auto kRecoveryBound = std::chrono::seconds(15);
// Health follows the store at the next tick.
constexpr auto kHealthBound = std::chrono::seconds(5);
constexpr auto kTestTickInterval = std::chrono::milliseconds(50);

// grpc.health.v1.Health/Check for `service` through the generic stub: the request is field 1
// (service, a string); the answer {status: N} is the bytes 08 N. -1 when the call fails.
int health_status(const std::shared_ptr<grpc::Channel>& channel, const std::string& service) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::CompletionQueue queue;
  std::string bytes;
  if (!service.empty()) bytes = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  queue.Next(&tag, &ok);
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  if (!status.ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string answer;
  for (const grpc::Slice& part : slices) answer.append(reinterpret_cast<const char*>(part.begin()), part.size());
  return answer.size() == 2 && answer[0] == 0x08 ? answer[1] : -1;
}
// The whole daemon's health (""): SERVING only while each of its services, the coordinator's
// included, may serve.
constexpr const char* kHealthService = "";
constexpr int kServing = 1;     // grpc.health.v1.HealthCheckResponse.SERVING
constexpr int kNotServing = 2;  // NOT_SERVING

cohort::v1::JobSpec waiting_job(int i) {
  cohort::v1::JobSpec spec;
  spec.set_name("full-" + std::to_string(i));
  spec.set_nodes(1);
  spec.set_procs_per_node(1);
  spec.add_command("/bin/true");
  return spec;
}

class StoreFullTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Before any thread exists (unshare(CLONE_NEWNS) needs an unshared file-system context): the
    // mounts made from now on are this process's own and disappear with it.
    if (unshare(CLONE_NEWNS) != 0) {
      skip_reason_ = std::string("unshare(CLONE_NEWNS) refused: ") + strerror(errno);
    } else if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      skip_reason_ = std::string("making / private refused: ") + strerror(errno);
    }
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << "needs root for a private tmpfs: " << skip_reason_;
    if (mount("tmpfs", disk_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, kTmpfsSize) != 0) {
      GTEST_SKIP() << "mount -t tmpfs refused (" << strerror(errno) << "); run as root to test a full disk";
    }
    mounted_ = true;
    start_coordinator();
  }

  void TearDown() override {
    if (coordinator_ != nullptr) coordinator_->shutdown();
    coordinator_.reset();
    if (mounted_) umount2(disk_.path().c_str(), MNT_DETACH);
  }

  std::string data_dir() const { return disk_.path() + "/data"; }
  std::string filler() const { return disk_.path() + "/filler"; }

  void start_coordinator() {
    DaemonServerOptions options;
    options.role = DaemonRole::kCoordinator;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir();
    options.tick_interval = kTestTickInterval;
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    coordinator_ = std::move(*server);
    channel_ = tls::make_channel(coordinator_->address(), testing::admin_security(data_dir()));
    stub_ = cohort::v1::Coordinator::NewStub(channel_);
  }

  // Writes the filler until the file system is full; its size.
  int64_t fill_disk() {
    int fd = open(filler().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << strerror(errno);
    const std::string block(64 * 1024, 'x');
    int64_t written = 0;
    for (;;) {
      ssize_t n = write(fd, block.data(), block.size());
      if (n <= 0) break;  // ENOSPC
      written += n;
    }
    // Down to the last byte: a partial page left free would let a small write through.
    for (;;) {
      ssize_t n = write(fd, block.data(), 1);
      if (n <= 0) break;
      written += n;
    }
    close(fd);
    return written;
  }

  grpc::Status submit(int i, std::string* id) {
    cohort::v1::SubmitJobRequest request;
    *request.mutable_spec() = waiting_job(i);
    request.set_wait_for_capacity(true);  // no node has joined: the jobs wait in the queue
    cohort::v1::SubmitJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub_->SubmitJob(&context, request, &response);
    *id = response.job_id();
    return status;
  }

  grpc::Status cancel(const std::string& id) {
    cohort::v1::CancelJobRequest request;
    request.set_job_id(id);
    request.set_reason("store_full_test");
    cohort::v1::CancelJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    return stub_->CancelJob(&context, request, &response);
  }

  // GetJob's answer for `id`: its state, or the call's error code (negative).
  int state_of(const std::string& id) {
    cohort::v1::GetJobRequest request;
    request.set_job_id(id);
    cohort::v1::GetJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = stub_->GetJob(&context, request, &response);
    return status.ok() ? response.job().state() : -static_cast<int>(status.error_code());
  }

  // One submit, or a cancel every third i, recorded in seen_ when accepted; refusals are counted
  // and checked (UNAVAILABLE naming the job store, nothing changed).
  void operate(int i) {
    if (i % 3 == 2 && !pending_.empty()) {
      const std::string id = pending_.back();
      grpc::Status status = cancel(id);
      if (status.ok()) {
        seen_[id] = cohort::v1::CANCELLED;
        pending_.pop_back();
      } else {
        check_refusal(status, "CancelJob " + id);
        EXPECT_EQ(state_of(id), cohort::v1::PENDING) << "a refused cancel changed job " << id;
      }
      return;
    }
    std::string id;
    grpc::Status status = submit(i, &id);
    if (status.ok()) {
      ASSERT_FALSE(id.empty());
      seen_[id] = cohort::v1::PENDING;
      pending_.push_back(id);
    } else {
      check_refusal(status, "SubmitJob " + std::to_string(i));
    }
  }

  void check_refusal(const grpc::Status& status, const std::string& what) {
    ++refusals_;
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << what << ": " << status.error_message();
    EXPECT_NE(status.error_message().find("job store"), std::string::npos) << what << ": " << status.error_message();
    if (first_refusal_.empty()) first_refusal_ = status.error_message();
  }

  static inline std::string skip_reason_;
  TempDir disk_;
  bool mounted_ = false;
  std::unique_ptr<DaemonServer> coordinator_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> stub_;
  std::map<std::string, int> seen_;    // job id -> the state the client last saw
  std::vector<std::string> pending_;   // jobs seen PENDING, newest last
  int refusals_ = 0;
  std::string first_refusal_;
};

TEST_F(StoreFullTest, AFullDiskRefusesChangesUntilSpaceReturnsAndARestartRecoversWhatClientsSaw) {
  // Room left: everything is accepted.
  for (int i = 0; i < 9; ++i) operate(i);
  ASSERT_EQ(refusals_, 0) << first_refusal_;
  ASSERT_EQ(health_status(channel_, kHealthService), kServing);

  const int64_t filled = fill_disk();
  ASSERT_GT(filled, 0);
  for (int i = 9; i < 9 + kFullDiskOperations; ++i) operate(i);
  ASSERT_GT(refusals_, 0) << "no write failed on a full disk (" << filled << " bytes of filler)";
  // The next tick publishes it: NOT_SERVING.
  const auto not_serving_by = std::chrono::steady_clock::now() + kHealthBound;
  while (health_status(channel_, kHealthService) != kNotServing && std::chrono::steady_clock::now() < not_serving_by)
    std::this_thread::sleep_for(kPollInterval);
  ASSERT_EQ(health_status(channel_, kHealthService), kNotServing)
      << "health stayed SERVING while the job store could not be written";
  // Reads still work, and show exactly what the client saw.
  for (const auto& [id, state] : seen_) EXPECT_EQ(state_of(id), state) << id;

  // Space returns: the coordinator finds out by itself and serves again.
  ASSERT_EQ(unlink(filler().c_str()), 0);
  const auto give_up = std::chrono::steady_clock::now() + kRecoveryBound;
  while (health_status(channel_, kHealthService) != kServing &&
         std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(kPollInterval);
  }
  ASSERT_EQ(health_status(channel_, kHealthService), kServing)
      << "still NOT_SERVING " << kRecoveryBound.count() << " s after space returned";
  const int refused_while_full = refusals_;
  for (int i = 100; i < 104; ++i) operate(i);
  EXPECT_EQ(refusals_, refused_while_full) << "refused after space returned: " << first_refusal_;

  // A restart recovers exactly what clients saw: the same jobs, in the same states.
  coordinator_->shutdown();
  coordinator_.reset();
  start_coordinator();
  for (const auto& [id, state] : seen_) EXPECT_EQ(state_of(id), state) << id;
  cohort::v1::ListJobsRequest request;
  request.set_page_size(1000);
  request.set_all_users(true);
  cohort::v1::ListJobsResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  ASSERT_TRUE(stub_->ListJobs(&context, request, &response).ok());
  std::map<std::string, int> recovered;
  for (const cohort::v1::JobRecord& job : response.jobs()) recovered[job.id()] = job.state();
  EXPECT_EQ(recovered, seen_) << "the restarted coordinator's jobs differ from what clients saw";
  std::printf("store_full_test: %zu jobs seen, %d operations refused while the disk was full\n", seen_.size(),
              refused_while_full);
}

}  // namespace
}  // namespace cohort::daemon
