// unix_user_for_job: a root agent maps owners (user_map, else job_user, never root); an agent
// that is not root runs jobs as its own uid only when run_jobs_as_daemon_user says the daemon is
// single-user, since that uid owns the data directory's CA key and admin credentials.

#include "daemon/agent/unix_user.h"

#include <grp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon/agent/test_util.h"

namespace cohort::agent {
namespace {

// What unix_user_for_job answers for owner alice with `options`, as one line: "ok <name or self>"
// or "<code> <message>".
std::string answer(const JobUserOptions& options) {
  StatusOr<std::optional<UnixUser>> user = unix_user_for_job("alice", options);
  if (!user.ok()) return std::to_string(static_cast<int>(user.status().code())) + " " + user.status().message();
  return "ok " + (user->has_value() ? (*user)->name : std::string("self"));
}

// answer() as the unprivileged user `name` would get it: in a forked child that dropped root for
// good (groups, gid, uid), so this test process keeps its own identity.
std::string answer_as(const std::string& name, const JobUserOptions& options) {
  StatusOr<UnixUser> user = lookup_unix_user(name);
  if (!user.ok()) return "no user " + name;
  return testing::line_from_child([&]() -> std::string {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(user->gid, user->gid, user->gid) != 0 ||
        ::setresuid(user->uid, user->uid, user->uid) != 0) {
      return "cannot drop to " + name;
    }
    return answer(options);
  });
}

std::string answer_unprivileged(const JobUserOptions& options) {
  if (::geteuid() != 0) return answer(options);  // this test already runs unprivileged
  return answer_as("nobody", options);
}

TEST(UnixUserTest, AnAgentThatIsNotRootRefusesJobsNamingItsUidTheRiskAndTheWaysOut) {
  JobUserOptions options;
  options.data_dir = "/var/lib/cohort";
  const std::string refused = answer_unprivileged(options);
  const uid_t uid = ::geteuid() != 0 ? ::geteuid() : lookup_unix_user("nobody").value_or(UnixUser{}).uid;
  EXPECT_EQ(refused.rfind(std::to_string(static_cast<int>(StatusCode::kFailedPrecondition)) + " ", 0), 0u)
      << refused;
  for (const std::string& expected : std::vector<std::string>{
           "owner 'alice'", "not root (uid " + std::to_string(uid) + ")", "could read its data directory /var/lib/cohort",
        "ca/ca.key", "admin.credentials", "run cohortd as root", "run_jobs_as_daemon_user: true"}) {
    EXPECT_NE(refused.find(expected), std::string::npos) << expected << " in " << refused;
  }
}

TEST(UnixUserTest, ASingleUserDaemonThatIsNotRootRunsJobsAsItself) {
  JobUserOptions options;
  options.run_jobs_as_daemon_user = true;
  EXPECT_EQ(answer_unprivileged(options), "ok self");
}

TEST(UnixUserTest, RootMapsTheOwnerElseTheJobUserAndIgnoresRunJobsAsDaemonUser) {
  if (::geteuid() != 0) GTEST_SKIP() << "mapping owners needs root";
  if (!lookup_unix_user("nobody").ok()) GTEST_SKIP() << "no user nobody";
  JobUserOptions options;
  options.user_map = {{"alice", "nobody"}};
  options.run_jobs_as_daemon_user = true;  // no effect as root: jobs still never run as the agent
  EXPECT_EQ(answer(options), "ok nobody");
  options.user_map.clear();
  options.job_user = "root";
  const std::string refused = answer(options);
  EXPECT_NE(refused.find("is root or in group root"), std::string::npos) << refused;
}

}  // namespace
}  // namespace cohort::agent
