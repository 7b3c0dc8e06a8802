// check_root_agent_capabilities: a root agent without CAP_SYS_PTRACE in its effective set is
// refused naming the capability and the unit setting; with it (or not root) it passes.

#include "daemon/agent/agent_capabilities.h"

#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

namespace cohort::agent {
namespace {

// What check_root_agent_capabilities says in a forked child that first dropped `capability` from
// its effective set (capset; the permitted set keeps it, as an operator's bounding set would not,
// but only the effective set counts), as "ok" or "<code> <message>".
std::string check_without(int capability) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::string line;
    __user_cap_header_struct header{};
    header.version = _LINUX_CAPABILITY_VERSION_3;
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, data) != 0) {
      line = "capget failed";
    } else {
      data[capability / 32].effective &= ~(1u << (capability % 32));
      if (::syscall(SYS_capset, &header, data) != 0) {
        line = "capset failed";
      } else {
        Status status = check_root_agent_capabilities();
        line = status.ok() ? "ok" : std::to_string(static_cast<int>(status.code())) + " " + status.message();
      }
    }
    const ssize_t written = ::write(fds[1], line.data(), line.size());
    ::_exit(written == static_cast<ssize_t>(line.size()) ? 0 : 1);
  }
  ::close(fds[1]);
  std::string line;
  char buffer[1024];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof(buffer))) > 0;) line.append(buffer, static_cast<size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(child, &status, 0);
  return line;
}

TEST(AgentCapabilitiesTest, RootWithoutSysPtraceIsRefusedNamingItAndTheUnitSetting) {
  if (::geteuid() != 0) GTEST_SKIP() << "the check applies to a root agent";
  StatusOr<bool> held = has_effective_capability(CAP_SYS_PTRACE);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  if (!*held) GTEST_SKIP() << "this test runs without CAP_SYS_PTRACE already";
  const std::string refused = check_without(CAP_SYS_PTRACE);
  EXPECT_EQ(refused.rfind(std::to_string(static_cast<int>(StatusCode::kFailedPrecondition)) + " ", 0), 0u)
      << refused;
  for (const char* expected : {"without CAP_SYS_PTRACE", "stopped-rank detection", "CapabilityBoundingSet",
                               "deploy/cohortd.service", "--cap-add SYS_PTRACE"}) {
    EXPECT_NE(refused.find(expected), std::string::npos) << expected << " in " << refused;
  }
  // Dropping another capability is not what the check is about.
  EXPECT_EQ(check_without(CAP_SYS_TIME), "ok");
  EXPECT_TRUE(check_root_agent_capabilities().ok());
}

TEST(AgentCapabilitiesTest, AnUnprivilegedAgentNeedsNoCapability) {
  if (::geteuid() == 0) GTEST_SKIP() << "run unprivileged to see this";
  EXPECT_FALSE(has_effective_capability(CAP_SYS_PTRACE).value_or(true));
  EXPECT_TRUE(check_root_agent_capabilities().ok());
}

TEST(AgentCapabilitiesTest, ANumberThatIsNoCapabilityIsRefused) {
  EXPECT_EQ(has_effective_capability(64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(has_effective_capability(-1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::agent
