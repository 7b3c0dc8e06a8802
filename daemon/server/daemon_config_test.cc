// cohortd's settings: the YAML file, flags overriding it, and errors that name file, line and key.

#include "daemon/server/daemon_config.h"

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace cohort::daemon {
namespace {

TEST(DaemonConfigTest, FileSetsEveryKindOfSettingAndFlagsOverrideIt) {
  DaemonConfig config;
  Status applied = config.apply_yaml(R"(# a comment
role: agent
listen: 10.0.0.2:7071
data_dir: /var/lib/cohort
coordinator: 10.0.0.1:7070
slots: 8
node_id: node-b
log_dir:
worker: /opt/cohort/bin/cohort-worker --verbose
tick_interval_ms: 250
node_lease_ms: 30000
stop_grace_ms: 5000
shutdown_grace_ms: 3000
peer_rpc_timeout_ms: 4000
log_level: debug
max_log_bytes_per_job: 4096
)",
                                     "cohortd.yaml");
  ASSERT_TRUE(applied.ok()) << applied.to_string();
  ASSERT_TRUE(config.apply_flag("--slots", "4").ok());
  ASSERT_TRUE(config.apply_flag("--node-id", "node-c").ok());
  auto options = config.options();
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  EXPECT_EQ(options->role, DaemonRole::kAgent);
  EXPECT_EQ(options->listen, "10.0.0.2:7071");
  EXPECT_EQ(options->data_dir, "/var/lib/cohort");
  EXPECT_EQ(options->coordinator_address, "10.0.0.1:7070");
  EXPECT_EQ(options->slots, 4);
  EXPECT_EQ(options->node_id, "node-c");
  EXPECT_EQ(options->log_dir, "");
  EXPECT_EQ(options->worker_command,
            (std::vector<std::string>{"/opt/cohort/bin/cohort-worker", "--verbose"}));
  EXPECT_EQ(options->tick_interval.count(), 250);
  EXPECT_EQ(options->node_lease.count(), 30000);
  EXPECT_EQ(options->stop_grace_period.count(), 5000);
  EXPECT_EQ(options->shutdown_grace.count(), 3000);
  EXPECT_EQ(options->peer_rpc_timeout.count(), 4000);
  EXPECT_EQ(config.log_level(), "debug");
  EXPECT_EQ(options->max_log_bytes_per_job, 4096u);
}

TEST(DaemonConfigTest, EtcdCompactionIntervalDefaultsToFiveMinutesAndZeroTurnsItOff) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: coordinator\ndata_dir: /d\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->etcd_compaction_interval, std::chrono::minutes(5));
  ASSERT_TRUE(config.apply_yaml("etcd_compaction_ms: 60000\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->etcd_compaction_interval.count(), 60000);
  ASSERT_TRUE(config.apply_flag("--etcd-compaction-ms", "0").ok());
  EXPECT_EQ(config.options()->etcd_compaction_interval.count(), 0);
  Status bad = config.apply_yaml("etcd_compaction_ms: soon\n", "c.yaml");
  EXPECT_NE(bad.message().find("c.yaml:1: etcd_compaction_ms: 'soon' is not a whole number"), std::string::npos)
      << bad.to_string();
}

TEST(DaemonConfigTest, StartAndExecTimeoutsAreKeysAndFlagsAndBadValuesNameTheKeyAndValue) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: all\ndata_dir: /d\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->start_timeout, coordinator::kDefaultStartTimeout);
  EXPECT_EQ(config.options()->exec_timeout, agent::kDefaultExecTimeout);
  ASSERT_TRUE(config.apply_yaml("start_timeout_ms: 600000\nexec_timeout_ms: 5000\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->start_timeout.count(), 600000);
  EXPECT_EQ(config.options()->exec_timeout.count(), 5000);
  ASSERT_TRUE(config.apply_flag("--start-timeout-ms", "60000").ok());
  ASSERT_TRUE(config.apply_flag("--exec-timeout-ms", "90000").ok());
  EXPECT_EQ(config.options()->start_timeout.count(), 60000);
  EXPECT_EQ(config.options()->exec_timeout.count(), 90000);

  Status bad = config.apply_yaml("start_timeout_ms: 500\nexec_timeout_ms: soon\n", "c.yaml");
  ASSERT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("c.yaml:1: start_timeout_ms: '500' is not a whole number in 10000..86400000"),
            std::string::npos)
      << bad.message();
  EXPECT_NE(bad.message().find("c.yaml:2: exec_timeout_ms: 'soon' is not a whole number in 1000..3600000"),
            std::string::npos)
      << bad.message();
  Status zero = config.apply_flag("--exec-timeout-ms", "0");
  EXPECT_NE(zero.message().find("--exec-timeout-ms: exec_timeout_ms: '0' is not a whole number"), std::string::npos)
      << zero.message();
  // The refused values left the last good ones.
  EXPECT_EQ(config.options()->start_timeout.count(), 60000);
  EXPECT_EQ(config.options()->exec_timeout.count(), 90000);

  // A start deadline a single launch call can outlast is refused, naming both keys.
  ASSERT_TRUE(config.apply_yaml("start_timeout_ms: 20000\npeer_rpc_timeout_ms: 30000\n", "c.yaml").ok());
  Status short_start = config.options().status();
  EXPECT_EQ(short_start.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_start.message().find("start_timeout_ms (20000 ms) must be more than peer_rpc_timeout_ms (30000 ms)"),
            std::string::npos)
      << short_start.message();
  // An agent runs no coordinator, so its start_timeout_ms is unused: not checked (with the same
  // peer_rpc_timeout_ms that the coordinator roles refuse it with).
  ASSERT_TRUE(config.apply_yaml("role: agent\ncoordinator: 10.0.0.1:7070\n", "c.yaml").ok());
  StatusOr<DaemonServerOptions> agent = config.options();
  ASSERT_TRUE(agent.ok()) << agent.status().to_string();
  EXPECT_EQ(agent->peer_rpc_timeout.count(), 30000);
  ASSERT_TRUE(config.apply_yaml("role: coordinator\n", "c.yaml").ok());
  EXPECT_EQ(config.options().status().code(), StatusCode::kInvalidArgument);
}

TEST(DaemonConfigTest, EveryProblemIsReportedWithFileAndLine) {
  DaemonConfig config;
  Status status = config.apply_yaml(
      "role: all\nslot: 2\nslots: many\nworker: cohort-worker\nlisten: [a, b]\n", "/etc/cohort/cohortd.yaml");
  ASSERT_FALSE(status.ok());
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  const std::string& message = status.message();
  EXPECT_NE(message.find("/etc/cohort/cohortd.yaml:2: unknown key 'slot'"), std::string::npos) << message;
  EXPECT_NE(message.find("slots"), std::string::npos) << message;  // the known keys are listed
  EXPECT_NE(message.find("cohortd.yaml:3: slots: 'many' is not a whole number"), std::string::npos)
      << message;
  EXPECT_NE(message.find("cohortd.yaml:4: worker: 'cohort-worker' must start with an absolute path"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("cohortd.yaml:5: listen: expected a single value"), std::string::npos) << message;
}

TEST(DaemonConfigTest, AllowedPathRootsTakeAListOrCommaSeparatedFlag) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: all\ndata_dir: /d\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->allowed_path_roots, std::vector<std::string>{"/usr/share/datasets"});
  ASSERT_TRUE(config.apply_yaml("allowed_path_roots: [/srv/data, /usr/share/datasets]\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->allowed_path_roots,
            (std::vector<std::string>{"/srv/data", "/usr/share/datasets"}));
  ASSERT_TRUE(config.apply_flag("--allowed-path-roots", "/scratch").ok());
  EXPECT_EQ(config.options()->allowed_path_roots, std::vector<std::string>{"/scratch"});
  Status relative = config.apply_yaml("allowed_path_roots: [data]\n", "c.yaml");
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.message().find("c.yaml:1: allowed_path_roots: 'data' is not an absolute directory"),
            std::string::npos)
      << relative.message();
}

TEST(DaemonConfigTest, AllowedCommandsAreAbsolutePathsEmptyMeaningAny) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: all\ndata_dir: /d\n", "c.yaml").ok());
  EXPECT_TRUE(config.options()->allowed_commands.empty());
  ASSERT_TRUE(config.apply_yaml("allowed_commands: [/usr/bin/python3, /opt/train]\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->allowed_commands, (std::vector<std::string>{"/usr/bin/python3", "/opt/train"}));
  ASSERT_TRUE(config.apply_flag("--allowed-commands", "/usr/bin/torchrun").ok());
  EXPECT_EQ(config.options()->allowed_commands, std::vector<std::string>{"/usr/bin/torchrun"});
  Status relative = config.apply_yaml("allowed_commands: [python3]\n", "c.yaml");
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.message().find("c.yaml:1: allowed_commands entry \"python3\" is not an absolute path"),
            std::string::npos)
      << relative.message();
}

TEST(DaemonConfigTest, MalformedYamlAndMissingFileAreNamed) {
  DaemonConfig config;
  Status bad = config.apply_yaml("role: all\n  data_dir: [\n", "c.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.message().rfind("c.yaml:", 0), 0u) << bad.message();
  Status list = config.apply_yaml("- role\n", "c.yaml");
  ASSERT_FALSE(list.ok());
  EXPECT_NE(list.message().find("mapping"), std::string::npos) << list.message();
  Status missing = config.apply_file("/nonexistent/cohortd.yaml");
  EXPECT_EQ(missing.code(), StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("/nonexistent/cohortd.yaml"), std::string::npos);
}

TEST(DaemonConfigTest, RequiredSettingsAndBadFlags) {
  DaemonConfig config;
  EXPECT_NE(config.options().status().message().find("role"), std::string::npos);
  ASSERT_TRUE(config.apply_flag("--role", "agent").ok());
  EXPECT_NE(config.options().status().message().find("data_dir"), std::string::npos);
  ASSERT_TRUE(config.apply_flag("--data-dir", "/tmp/x").ok());
  EXPECT_NE(config.options().status().message().find("coordinator"), std::string::npos);
  ASSERT_TRUE(config.apply_flag("--coordinator", "10.0.0.1:7070").ok());
  EXPECT_TRUE(config.options().ok());
  Status role = config.apply_flag("--role", "gardener");
  EXPECT_NE(role.message().find("--role: unknown role"), std::string::npos) << role.message();
  EXPECT_FALSE(config.apply_flag("--log-level", "loud").ok());
  EXPECT_FALSE(config.apply_flag("--frobnicate", "1").ok());
  EXPECT_TRUE(DaemonConfig::is_setting_flag("--stop-grace-ms"));
  EXPECT_FALSE(DaemonConfig::is_setting_flag("--config"));
}

TEST(DaemonConfigTest, JobUserAndUserMap) {
  DaemonConfig config;
  Status applied =
      config.apply_yaml("job_user: svc-jobs\nuser_map:\n  alice: alice\n  bob: svc-bob\n", "c.yaml");
  ASSERT_TRUE(applied.ok()) << applied.to_string();
  ASSERT_TRUE(config.apply_flag("--role", "all").ok());
  ASSERT_TRUE(config.apply_flag("--data-dir", "/tmp/d").ok());
  auto options = config.options();
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  EXPECT_EQ(options->job_user, "svc-jobs");
  EXPECT_EQ(options->user_map, (std::map<std::string, std::string>{{"alice", "alice"}, {"bob", "svc-bob"}}));
  ASSERT_TRUE(config.apply_flag("--user-map", "carol=carol").ok());
  EXPECT_EQ(config.options()->user_map.size(), 1u);
  Status bad = config.apply_flag("--user-map", "carol");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("NAME=USER"), std::string::npos) << bad.message();
}

// shared_job_user is off unless set: job_user then serves one owner per node.
TEST(DaemonConfigTest, SharedJobUserIsOffByDefaultAndOnlyTrueOrFalse) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: agent\ndata_dir: /d\ncoordinator: c:1\n", "c.yaml").ok());
  EXPECT_FALSE(config.options()->shared_job_user);
  ASSERT_TRUE(config.apply_yaml("shared_job_user: true\n", "c.yaml").ok());
  EXPECT_TRUE(config.options()->shared_job_user);
  ASSERT_TRUE(config.apply_flag("--shared-job-user", "false").ok());
  EXPECT_FALSE(config.options()->shared_job_user);
  Status bad = config.apply_yaml("shared_job_user: yes please\n", "c.yaml");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("c.yaml:1: shared_job_user: 'yes please' is not true or false"), std::string::npos)
      << bad.message();
}

// A cohortd that is not root runs no job unless told every user may act as the operator.
TEST(DaemonConfigTest, RunJobsAsDaemonUserIsOffByDefaultAndOnlyTrueOrFalse) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: agent\ndata_dir: /d\ncoordinator: c:1\n", "c.yaml").ok());
  EXPECT_FALSE(config.options()->run_jobs_as_daemon_user);
  ASSERT_TRUE(config.apply_flag("--run-jobs-as-daemon-user", "true").ok());
  EXPECT_TRUE(config.options()->run_jobs_as_daemon_user);
  Status bad = config.apply_yaml("run_jobs_as_daemon_user: 1\n", "c.yaml");
  EXPECT_EQ(bad.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("c.yaml:1: run_jobs_as_daemon_user: '1' is not true or false"), std::string::npos)
      << bad.message();
}

TEST(DaemonConfigTest, HangDetectionPeriodsAreKeysAndFlags) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: agent\ndata_dir: /d\ncoordinator: c:1\n", "c.yaml").ok());
  auto defaults = config.options();
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->stopped_task_limit, agent::kDefaultStoppedTaskLimit);
  EXPECT_EQ(defaults->task_heartbeat_timeout, agent::kDefaultHeartbeatTimeout);
  EXPECT_EQ(defaults->task_heartbeat_interval, kDefaultRankHeartbeatInterval);

  Status applied = config.apply_yaml(
      "stopped_task_limit_ms: 1500\ntask_heartbeat_timeout_ms: 3000\ntask_heartbeat_interval_ms: 500\n", "c.yaml");
  ASSERT_TRUE(applied.ok()) << applied.to_string();
  ASSERT_TRUE(config.apply_flag("--stopped-task-limit-ms", "0").ok());  // 0: the check is off
  auto options = config.options();
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  EXPECT_EQ(options->stopped_task_limit.count(), 0);
  EXPECT_EQ(options->task_heartbeat_timeout.count(), 3000);
  EXPECT_EQ(options->task_heartbeat_interval.count(), 500);
}

TEST(DaemonConfigTest, HangDetectionPeriodsOutOfRangeAreClearErrors) {
  struct Case {
    const char* yaml;
    const char* expected;
  };
  const Case cases[] = {
      {"stopped_task_limit_ms: 50\n", "c.yaml:1: stopped_task_limit_ms: 50 ms is too short"},
      {"stopped_task_limit_ms: -1\n", "c.yaml:1: stopped_task_limit_ms: '-1' is not a whole number in 0..3600000"},
      {"task_heartbeat_timeout_ms: 99\n", "c.yaml:1: task_heartbeat_timeout_ms: 99 ms is too short"},
      {"task_heartbeat_timeout_ms: 3600001\n", "'3600001' is not a whole number in 0..3600000"},
      {"task_heartbeat_interval_ms: 10\n", "c.yaml:1: task_heartbeat_interval_ms: '10' is not a whole number in 50..600000"},
      {"task_heartbeat_interval_ms: 2s\n", "task_heartbeat_interval_ms: '2s' is not a whole number"},
  };
  for (const Case& c : cases) {
    DaemonConfig config;
    Status status = config.apply_yaml(c.yaml, "c.yaml");
    ASSERT_EQ(status.code(), StatusCode::kInvalidArgument) << c.yaml;
    EXPECT_NE(status.message().find(c.expected), std::string::npos) << status.message();
  }
  // Each is fine alone; together a timeout under two intervals would kill a rank for one late beat.
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: all\ndata_dir: /d\n", "c.yaml").ok());
  ASSERT_TRUE(config.apply_flag("--task-heartbeat-timeout-ms", "3000").ok());
  ASSERT_TRUE(config.apply_flag("--task-heartbeat-interval-ms", "2000").ok());
  auto options = config.options();
  ASSERT_FALSE(options.ok());
  EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find(
                "task_heartbeat_timeout_ms (3000 ms) is less than twice task_heartbeat_interval_ms (2000 ms)"),
            std::string::npos)
      << options.status().message();
  // With the timeout off, any interval goes.
  ASSERT_TRUE(config.apply_flag("--task-heartbeat-timeout-ms", "0").ok());
  EXPECT_TRUE(config.options().ok());
}

TEST(DaemonConfigTest, JobRetentionTakesANumberAndAUnitInRange) {
  DaemonConfig config;
  ASSERT_TRUE(config.apply_yaml("role: all\ndata_dir: /d\n", "c.yaml").ok());
  auto defaults = config.options();
  ASSERT_TRUE(defaults.ok()) << defaults.status().to_string();
  EXPECT_EQ(defaults->job_retention, std::chrono::hours(24 * 7));  // 7 days
  ASSERT_TRUE(config.apply_yaml("job_retention: 36h\n", "c.yaml").ok());
  EXPECT_EQ(config.options()->job_retention, std::chrono::hours(36));
  ASSERT_TRUE(config.apply_flag("--job-retention", "90m").ok());
  EXPECT_EQ(config.options()->job_retention, std::chrono::minutes(90));
  ASSERT_TRUE(config.apply_flag("--job-retention", "3650d").ok());
  EXPECT_EQ(config.options()->job_retention, std::chrono::hours(24 * 3650));
  for (const char* bad : {"9m", "3651d", "7", "7w", "d", "-1d", "1.5d", "7 d", "99999999999d"}) {
    DaemonConfig other;
    Status status = other.apply_yaml(std::string("job_retention: '") + bad + "'\n", "c.yaml");
    ASSERT_EQ(status.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(status.message().find(std::string("c.yaml:1: job_retention: '") + bad + "'"), std::string::npos)
        << status.message();
    EXPECT_NE(status.message().find("e.g. 7d, 36h or 90m, from 10m to 3650d"), std::string::npos)
        << status.message();
  }
}

TEST(DaemonConfigTest, TheShippedExampleConfigLoads) {
  // configs/cohortd.yaml documents every key; it must stay loadable.
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string path = "configs/cohortd.yaml";
  if (srcdir != nullptr && workspace != nullptr) path = std::string(srcdir) + "/" + workspace + "/" + path;
  DaemonConfig config;
  Status loaded = config.apply_file(path);
  ASSERT_TRUE(loaded.ok()) << loaded.to_string();
  auto options = config.options();
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  EXPECT_EQ(options->role, DaemonRole::kAll);
  EXPECT_EQ(options->data_dir, "/var/lib/cohort");
  EXPECT_FALSE(options->shared_job_user);  // secure by default: one owner per node under job_user
  EXPECT_FALSE(options->run_jobs_as_daemon_user);
}

}  // namespace
}  // namespace cohort::daemon
