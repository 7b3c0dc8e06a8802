// The cohortd binary as an operator runs it: --role coordinator on 127.0.0.1:0 announces its
// port, answers Info and grpc.health.v1 (SERVING), and exits 0 on SIGTERM; bad command lines
// exit 2 with the usage.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/info.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kCohortd = "daemon/cohortd";  // in the test's runfiles
constexpr auto kRpcTimeout = std::chrono::seconds(10);

// A started cohortd with its stdout on a pipe. A child the test did not wait for (a failed
// ASSERT) is killed, so no daemon outlives its test.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;

  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out != nullptr) fclose(out);
  }
};

void spawn(const std::vector<std::string>& args, Child* child_out) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  Child& child = *child_out;
  child.pid = fork();
  if (child.pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> argv;
    argv.push_back(const_cast<char*>(kCohortd));
    for (const std::string& arg : args) argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(kCohortd, argv.data());
    _exit(127);
  }
  close(fds[1]);
  child.out = fdopen(fds[0], "r");
}

int wait_exit(Child& child) {
  int status = 0;
  EXPECT_EQ(waitpid(child.pid, &status, 0), child.pid);
  child.pid = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

// grpc.health.v1.Health/Check through the generic stub (no generated health stubs needed): the
// request {service: ""} is empty on the wire, and {status: SERVING} is the bytes 08 01.
int health_status(const std::shared_ptr<grpc::Channel>& channel) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
  grpc::CompletionQueue queue;
  grpc::ByteBuffer request;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  auto call = stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &queue);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(queue.Next(&tag, &ok));
  queue.Shutdown();
  while (queue.Next(&tag, &ok)) {
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const grpc::Slice& slice : slices)
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return bytes.size() == 2 && bytes[0] == 0x08 ? bytes[1] : -1;
}

TEST(CohortdProcessTest, ServesOnAnAnnouncedPortAndStopsOnSigterm) {
  TempDir data_dir;
  Child child;
  spawn({"--role", "coordinator", "--listen", "127.0.0.1:0", "--data-dir=" + data_dir.path()}, &child);
  ASSERT_GT(child.pid, 0);
  char line[256] = {};
  ASSERT_NE(fgets(line, sizeof(line), child.out), nullptr) << "cohortd printed nothing";
  const std::string announced(line);
  const std::string prefix = "listening on ";
  ASSERT_EQ(announced.rfind(prefix, 0), 0u) << announced;
  const std::string address = announced.substr(prefix.size(), announced.find('\n') - prefix.size());

  {
    // Scoped: an idle client channel in this process (nobody polling it while the test sits in
    // waitpid) would not answer the server's GOAWAY, holding its drain for the whole grace period.
    // As a user would: the first admin's credentials file from the data dir, over TLS.
    auto channel = tls::make_channel(address, testing::admin_security(data_dir.path()));
    auto info = cohort::v1::Info::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + kRpcTimeout);
    cohort::v1::VersionInfo version;
    grpc::Status status = info->GetVersion(&context, cohort::v1::GetVersionRequest(), &version);
    EXPECT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(version.component(), "cohortd");
    ASSERT_EQ(version.roles_size(), 1);
    EXPECT_EQ(version.roles(0), "coordinator");
    constexpr int kServing = 1;  // grpc.health.v1.HealthCheckResponse.SERVING
    EXPECT_EQ(health_status(channel), kServing);
  }

  ASSERT_EQ(kill(child.pid, SIGTERM), 0);
  EXPECT_EQ(wait_exit(child), 0);
}

TEST(CohortdProcessTest, BadCommandLinesExitWithUsage) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--bogus"},
                                             {"--role"},
                                             {"--role", "coordinator"},
                                             {"--role", "gardener", "--data-dir", "/tmp"}}) {
    Child child;
    spawn(args, &child);
    EXPECT_EQ(wait_exit(child), 2) << args[0];
  }
  Child version;
  spawn({"--version"}, &version);
  char line[128] = {};
  ASSERT_NE(fgets(line, sizeof(line), version.out), nullptr);
  EXPECT_EQ(std::string(line).rfind("cohortd ", 0), 0u) << line;
  EXPECT_EQ(wait_exit(version), 0);
}

}  // namespace
}  // namespace cohort::daemon
