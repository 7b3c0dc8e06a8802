// check_root_agent_capabilities: a root agent without CAP_SYS_PTRACE in its effective set is
// refused under a hidepid /proc naming the capability, the mount option and the unit setting, and
// warned (not refused) under a plain /proc; with it (or not root) it passes. proc_hidepid_option
// reads the proc mount's options from sample /proc/self/mountinfo lines.

#include "daemon/agent/agent_capabilities.h"

#include <grp.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

// What check_root_agent_capabilities says in a forked child that first dropped `capability` from
// its effective set (capset; the permitted set keeps it, as an operator's bounding set would not,
// but only the effective set counts), as "ok", "warning <message>" or "<code> <message>".
std::string check_without(int capability) {
  return testing::line_from_child([capability]() -> std::string {
    __user_cap_header_struct header{};
    header.version = _LINUX_CAPABILITY_VERSION_3;
    __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
    if (::syscall(SYS_capget, &header, data) != 0) return "capget failed";
    data[capability / 32].effective &= ~(1u << (capability % 32));
    if (::syscall(SYS_capset, &header, data) != 0) return "capset failed";
    std::string warning;
    Status status = check_root_agent_capabilities(&warning);
    return !status.ok()       ? std::to_string(static_cast<int>(status.code())) + " " + status.message()
           : warning.empty() ? "ok"
                             : "warning " + warning;
  });
}

// This test's own /proc: a hidepid mount makes the forked child's check a refusal.
std::string own_hidepid() {
  std::ifstream file("/proc/self/mountinfo");
  std::stringstream text;
  text << file.rdbuf();
  return proc_hidepid_option(text.str());
}

TEST(AgentCapabilitiesTest, RootWithoutSysPtraceIsWarnedOnAPlainProcAndRefusedUnderHidepid) {
  if (::geteuid() != 0) GTEST_SKIP() << "the check applies to a root agent";
  StatusOr<bool> held = has_effective_capability(CAP_SYS_PTRACE);
  ASSERT_TRUE(held.ok()) << held.status().to_string();
  if (!*held) GTEST_SKIP() << "this test runs without CAP_SYS_PTRACE already";
  const std::string said = check_without(CAP_SYS_PTRACE);
  if (own_hidepid().empty()) {
    // A default Docker / Kubernetes container: /proc/<pid>/stat is readable, only environ is not.
    EXPECT_EQ(said.rfind("warning ", 0), 0u) << said;
    for (const char* expected : {"without CAP_SYS_PTRACE", "left behind", "not found", "CapabilityBoundingSet",
                                 "deploy/cohortd.service", "--cap-add SYS_PTRACE"}) {
      EXPECT_NE(said.find(expected), std::string::npos) << expected << " in " << said;
    }
  } else {
    EXPECT_EQ(said.rfind(std::to_string(static_cast<int>(StatusCode::kFailedPrecondition)) + " ", 0), 0u)
        << said;
    EXPECT_NE(said.find(own_hidepid()), std::string::npos) << said;
  }
  // Dropping another capability is not what the check is about.
  EXPECT_EQ(check_without(CAP_SYS_TIME), "ok");
  std::string warning = "stale";
  EXPECT_TRUE(check_root_agent_capabilities(&warning).ok());
  EXPECT_EQ(warning, "");
}

// The decision with injected mount options (a test cannot remount /proc under other tests).
TEST(AgentCapabilitiesTest, RootWithoutSysPtraceIsRefusedOnlyUnderHidepid) {
  std::string warning;
  Status refused = decide_root_agent_capabilities(true, false, "hidepid=invisible", &warning);
  EXPECT_EQ(refused.code(), StatusCode::kFailedPrecondition) << refused.to_string();
  for (const char* expected : {"without CAP_SYS_PTRACE", "hidepid=invisible", "stopped-rank detection",
                               "CapabilityBoundingSet", "deploy/cohortd.service", "--cap-add SYS_PTRACE"}) {
    EXPECT_NE(refused.message().find(expected), std::string::npos) << expected << " in " << refused.message();
  }
  EXPECT_EQ(warning, "");

  Status warned = decide_root_agent_capabilities(true, false, "", &warning);
  EXPECT_TRUE(warned.ok()) << warned.to_string();
  for (const char* expected : {"without CAP_SYS_PTRACE", "left behind", "not found", "CapabilityBoundingSet",
                               "--cap-add SYS_PTRACE"}) {
    EXPECT_NE(warning.find(expected), std::string::npos) << expected << " in " << warning;
  }
  // It does not claim stopped-rank detection fails: it works without hidepid.
  EXPECT_EQ(warning.find("stopped-rank detection would"), std::string::npos) << warning;

  for (bool root : {true, false}) {
    for (bool ptrace : {true, false}) {
      if (root && !ptrace) continue;
      EXPECT_TRUE(decide_root_agent_capabilities(root, ptrace, "hidepid=2", &warning).ok()) << root << ptrace;
      EXPECT_EQ(warning, "") << root << ptrace;
    }
  }
}

TEST(AgentCapabilitiesTest, TheHidepidOptionIsReadFromTheProcMountsSuperOptions) {
  // A default Docker container's /proc, a host's, and systemd ProtectProc=invisible's.
  const std::string plain =
      "677 676 0:64 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
      "678 677 0:65 / /proc/bus ro,nosuid,nodev,noexec,relatime - proc proc rw\n";
  EXPECT_EQ(proc_hidepid_option(plain), "");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"), "");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw,nosuid shared:12 master:3 - proc proc rw,hidepid=invisible\n"),
            "hidepid=invisible");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=2,gid=27"), "hidepid=2");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=noaccess,subset=pid\n"),
            "hidepid=noaccess");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=1\n"), "hidepid=1");
  // Nothing hidden: hidepid=0 / off, subset=pid alone (it hides no process), a hidepid proc elsewhere.
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=0\n"), "");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=off\n"), "");
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,subset=pid\n"), "");
  EXPECT_EQ(proc_hidepid_option("30 1 0:30 / /run/p rw - proc proc rw,hidepid=2\n"), "");
  // A mount whose options contain "/proc" or "proc" elsewhere is not the proc mount.
  EXPECT_EQ(proc_hidepid_option("31 1 8:1 / /proc rw - ext4 /dev/proc rw,hidepid=2\n"), "");
  // The last proc mount at /proc is the one on top.
  EXPECT_EQ(proc_hidepid_option("22 1 0:20 / /proc rw - proc proc rw,hidepid=2\n"
                                "40 22 0:40 / /proc rw - proc proc rw\n"),
            "");
  EXPECT_EQ(proc_hidepid_option(plain + "40 22 0:40 / /proc rw - proc proc rw,hidepid=invisible\n"),
            "hidepid=invisible");
  EXPECT_EQ(proc_hidepid_option(""), "");
  EXPECT_EQ(proc_hidepid_option("garbage\n22 1 - proc\n"), "");
}

TEST(AgentCapabilitiesTest, AnUnprivilegedAgentNeedsNoCapability) {
  // Run as root, asked in a child that dropped to nobody (65534) for good.
  auto ask = []() -> std::string {
    const bool held = has_effective_capability(CAP_SYS_PTRACE).value_or(true);
    std::string warning = "stale";
    const Status status = check_root_agent_capabilities(&warning);
    return std::string(held ? "held" : "not held") + (status.ok() ? " ok" : " refused") + " warning '" + warning + "'";
  };
  const std::string said = ::geteuid() != 0 ? ask() : testing::line_from_child([&]() -> std::string {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) {
      return "cannot drop to 65534";
    }
    return ask();
  });
  EXPECT_EQ(said, "not held ok warning ''");
}

TEST(AgentCapabilitiesTest, ANumberThatIsNoCapabilityIsRefused) {
  EXPECT_EQ(has_effective_capability(64).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(has_effective_capability(-1).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::agent
