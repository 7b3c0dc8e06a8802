#include "daemon/server/daemon_config.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <type_traits>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "daemon/coordinator/job_spec_validation.h"
#include "worker/base/path_confinement.h"

namespace cohort::daemon {
namespace {

constexpr const char* kLogLevels[] = {"trace", "debug", "info", "warn", "error", "off"};
// stopped_task_limit_ms and task_heartbeat_timeout_ms, when not 0 (off): from a tenth of a second
// (tests and chaos runs) to an hour (a rank allowed to sit stopped longer is not being watched).
constexpr long long kMinHangLimitMs = 100;
constexpr long long kMaxHangLimitMs = 3600LL * 1000;
// start_timeout_ms: shorter than this would fail attempts whose launches merely wait behind others
// (orders go out one at a time) on a busy cluster.
constexpr long long kMinStartTimeoutMs = 10 * 1000;
// exec_timeout_ms: a healthy exec, even of a large binary on a slow network filesystem, takes well
// under a second; past an hour a hung mount is not being watched any more.
constexpr long long kMinExecTimeoutMs = 1000;
constexpr long long kMaxExecTimeoutMs = 3600LL * 1000;
// job_retention's range: shorter would delete a job while someone still looks at it; longer is a typo.
constexpr std::chrono::milliseconds kMinJobRetention = std::chrono::minutes(10);
constexpr std::chrono::milliseconds kMaxJobRetention = std::chrono::hours(24 * 3650);

StatusOr<long long> parse_integer(const std::string& value, long long min, long long max,
                                  const std::string& where, const std::string& key) {
  errno = 0;
  char* end = nullptr;
  const long long number = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || errno != 0 || number < min || number > max) {
    return invalid_argument_error("{}: {}: '{}' is not a whole number in {}..{}", where, key, value, min,
                                  max);
  }
  return number;
}

// argv split on spaces, for the worker setting ("/usr/bin/env FOO=1 /opt/cohort-worker").
std::vector<std::string> split_words(const std::string& value) {
  std::vector<std::string> words;
  std::istringstream in(value);
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

// job_retention: a whole number and a unit, "90m", "36h" or "7d", within kMin/kMaxJobRetention.
StatusOr<std::chrono::milliseconds> parse_retention(const std::string& value, const std::string& where) {
  const auto bad = [&](const std::string& why) {
    return invalid_argument_error("{}: job_retention: '{}' {}; give a number and a unit (m, h or d), e.g. 7d, "
                                  "36h or 90m, from 10m to 3650d",
                                  where, value, why);
  };
  if (value.size() < 2 || value.find_first_not_of("0123456789") != value.size() - 1)
    return bad("is not a number and a unit");
  const char unit = value.back();
  std::chrono::minutes per_unit(0);
  if (unit == 'm') per_unit = std::chrono::minutes(1);
  if (unit == 'h') per_unit = std::chrono::hours(1);
  if (unit == 'd') per_unit = std::chrono::hours(24);
  if (per_unit.count() == 0) return bad(fmt::format("has the unit '{}'", unit));
  const std::string digits = value.substr(0, value.size() - 1);
  if (digits.size() > 9) return bad("is too long");
  const std::chrono::milliseconds retention = std::stoll(digits) * per_unit;
  if (retention < kMinJobRetention || retention > kMaxJobRetention) return bad("is out of range");
  return retention;
}

}  // namespace

const std::vector<DaemonSetting>& daemon_settings() {
  static const std::vector<DaemonSetting> settings = {
      {"role", "--role", "ROLE", "coordinator, agent (runs this node's workers), or all (both)"},
      {"listen", "--listen", "HOST:PORT", "where to serve gRPC (port 0 picks a free port)"},
      {"data_dir", "--data-dir", "DIR",
       "the coordinator's job database; rank logs under DIR/logs (required)"},
      {"coordinator", "--coordinator", "HOST:PORT", "the coordinator an agent registers with (agent role)"},
      {"slots", "--slots", "N", "worker processes this node runs at once (agent, all)"},
      {"node_id", "--node-id", "ID", "the node's id in the cluster (default: the host name)"},
      {"log_dir", "--log-dir", "DIR", "where rank logs go (default DATA_DIR/logs)"},
      {"worker", "--worker", "PATH", "the worker command each task runs (absolute path first)"},
      {"tick_interval_ms", "--tick-interval-ms", "MS",
       "how often the coordinator places jobs and expires nodes"},
      {"node_lease_ms", "--node-lease-ms", "MS", "a node silent this long is lost (coordinator)"},
      {"stop_grace_ms", "--stop-grace-ms", "MS", "SIGTERM to SIGKILL when stopping tasks (agent)"},
      {"shutdown_grace_ms", "--shutdown-grace-ms", "MS", "how long shutdown lets in-flight calls finish"},
      {"peer_rpc_timeout_ms", "--peer-rpc-timeout-ms", "MS", "deadline of one call between daemons"},
      {"start_timeout_ms", "--start-timeout-ms", "MS",
       "coordinator: a placed attempt whose nodes have not all reported its tasks started this long after its "
       "placement fails, naming those nodes (default 300000; 10000..86400000, and in the coordinator and all "
       "roles more than peer_rpc_timeout_ms: at least the larger of 10000 and peer_rpc_timeout_ms + 1)"},
      {"exec_timeout_ms", "--exec-timeout-ms", "MS",
       "agent: a task that has not exec'd its program this long after its fork (its working_dir or command on "
       "a hung mount) fails its launch and is killed (default 8000; 1000..3600000). A node's ranks exec one "
       "after another within one LaunchTasks call, whose deadline is the coordinator's peer_rpc_timeout_ms: "
       "past that the coordinator gets 'deadline exceeded' instead of the launch's error"},
      {"log_level", "--log-level", "LEVEL", "trace, debug, info, warn, error or off"},
      {"stopped_task_limit_ms", "--stopped-task-limit-ms", "MS",
       "agent: a rank stopped this long (SIGSTOP, SIGTSTP, a tracer: process state T) is killed and its "
       "job fails or restarts (default 5000; 100..3600000, or 0: never)"},
      {"task_heartbeat_timeout_ms", "--task-heartbeat-timeout-ms", "MS",
       "agent: a rank that beat once (COHORT_HEARTBEAT_FILE) and then stays silent this long is killed "
       "(default 10000; 100..3600000, or 0: never); at least twice task_heartbeat_interval_ms"},
      {"task_heartbeat_interval_ms", "--task-heartbeat-interval-ms", "MS",
       "agent: how often ranks are asked to beat (COHORT_HEARTBEAT_INTERVAL_MS; default 2000; 50..600000)"},
      {"max_log_bytes_per_job", "--max-log-bytes-per-job", "BYTES",
       "agent: the rank logs of one job on this node, all its attempts and ranks together, keep at "
       "most this many bytes on disk (a new attempt removes older attempts' files, oldest first, "
       "until they keep at most half; each rank's file rotates at half its share, the newest output "
       "is kept; default 1073741824, 1 GiB; 0: no cap)"},
      {"job_retention", "--job-retention", "DURATION",
       "how long a finished job is kept: the coordinator deletes its records (job, events, metrics "
       "history) and agents its rank logs this long after it ended; a number with a unit, m, h or d "
       "(default 7d; 10m..3650d)"},
      {"allowed_path_roots", "--allowed-path-roots", "DIR[,DIR...]",
       "directories (besides each job's own) that a spec's checkpoint.dir, dataset.path and "
       "torchscript_file may lie under (default /usr/share/datasets); a YAML list or comma-separated"},
      {"allowed_commands", "--allowed-commands", "PATH[,PATH...]",
       "executables (absolute paths) that command jobs may run; empty (the default) allows any; a YAML "
       "list or comma-separated. Graph jobs (cohort-worker) are not affected"},
      {"job_user", "--job-user", "USER",
       "the Unix user jobs run as when their owner has no user_map entry (an agent running as root; "
       "default cohort-job)"},
      {"user_map", "--user-map", "NAME=USER[,...]",
       "cohort user -> Unix user that user's jobs run as; a YAML mapping or comma-separated NAME=USER"},
      {"shared_job_user", "--shared-job-user", "true|false",
       "false (the default): job_user serves only the first owner whose job runs on this node "
       "(recorded in DATA_DIR/job_user.holder; remove it to release), other unmapped owners are "
       "refused; true: they share it and can read and signal each other's jobs"},
      {"run_jobs_as_daemon_user", "--run-jobs-as-daemon-user", "true|false",
       "a cohortd not running as root cannot switch users: true lets it run jobs as its own uid, which "
       "can read DATA_DIR's CA key and admin credentials, so only when every cohort user may act as the "
       "operator; false (the default): it refuses jobs (run cohortd as root instead)"},
      {"join_token", "--join-token", "TOKEN",
       "agent role, first start: join the cluster with this token (`cohort node token` prints one); the "
       "node's certificate is then kept in DATA_DIR/node"},
      {"insecure", "--insecure", "true|false",
       "serve plaintext without authentication (development only; refused unless listen is a loopback "
       "address)"},
      {"http_listen", "--http-listen", "HOST:PORT",
       "serve HTTPS (/metrics for Prometheus) here, with the gRPC port's certificate and bearer tokens; "
       "empty (the default): no HTTP port"},
      {"http_token_file", "--http-token-file", "FILE",
       "a file (mode 0600) holding a bearer token the HTTPS port accepts besides users' tokens; required "
       "on agents, which have no user database (put the same scrape token on every node)"},
      {"election", "--election", "etcd://HOST:PORT[,...]",
       "coordinator, high availability: elect the leader among 2-3 coordinators in this etcd cluster; this "
       "one starts as a standby (calls answer UNAVAILABLE naming the leader) and leads when elected"},
      {"job_store", "--job-store", "etcd://HOST:PORT[,...]",
       "coordinator: keep the jobs in this etcd cluster instead of SQLite in data_dir (high availability: "
       "every coordinator reads the same jobs)"},
      {"etcd_ca", "--etcd-ca", "FILE", "PEM CA certificate of the etcd cluster (TLS to etcd)"},
      {"etcd_cert", "--etcd-cert", "FILE", "PEM client certificate for etcd (--client-cert-auth)"},
      {"etcd_key", "--etcd-key", "FILE", "the private key of etcd_cert"},
      {"leader_lease_ms", "--leader-lease-ms", "MS",
       "coordinator, with election: the leader's etcd lease; a dead leader is replaced within about this "
       "long (default 5000, at least 2000)"},
      {"etcd_compaction_ms", "--etcd-compaction-ms", "MS",
       "coordinator, with job_store etcd://: the leader compacts etcd's history this often, keeping one to two "
       "intervals of it, so etcd's database stays below its space quota (default 300000; 0: never, when etcd "
       "runs with --auto-compaction-retention)"},
      {"advertise", "--advertise", "HOST:PORT",
       "coordinator: the address clients and agents reach this daemon at, published to the election and "
       "named by standbys (default: the listen address with its bound port)"},
  };
  return settings;
}

DaemonConfig::DaemonConfig() = default;

bool DaemonConfig::is_setting_flag(const std::string& flag) {
  for (const DaemonSetting& setting : daemon_settings()) {
    if (flag == setting.flag) return true;
  }
  return false;
}

Status DaemonConfig::set(const std::string& key, const std::string& value, const std::string& where) {
  using std::chrono::milliseconds;
  constexpr long long kMaxMs = 24LL * 3600 * 1000;  // a day: anything longer is a typo
  // The *_ms settings: whole milliseconds from `min` up to a day, into `field`'s duration type.
  auto set_milliseconds = [&](long long min, auto& field) -> Status {
    COHORT_ASSIGN_OR_RETURN(long long ms, parse_integer(value, min, kMaxMs, where, key));
    field = std::chrono::duration_cast<std::decay_t<decltype(field)>>(milliseconds(ms));
    return ok_status();
  };
  if (key == "role") {
    StatusOr<DaemonRole> role = parse_daemon_role(value);
    if (!role.ok()) return invalid_argument_error("{}: {}", where, role.status().message());
    options_.role = *role;
    role_set_ = true;
  } else if (key == "listen") {
    options_.listen = value;
  } else if (key == "data_dir") {
    options_.data_dir = value;
  } else if (key == "coordinator") {
    options_.coordinator_address = value;
  } else if (key == "slots") {
    COHORT_ASSIGN_OR_RETURN(long long slots, parse_integer(value, 1, 4096, where, key));
    options_.slots = static_cast<int>(slots);
  } else if (key == "node_id") {
    options_.node_id = value;
  } else if (key == "log_dir") {
    options_.log_dir = value;
  } else if (key == "worker") {
    std::vector<std::string> words = split_words(value);
    if (words.empty() || words[0][0] != '/') {
      return invalid_argument_error("{}: worker: '{}' must start with an absolute path, e.g. {}", where,
                                    value, kDefaultWorkerPath);
    }
    options_.worker_command = std::move(words);
  } else if (key == "tick_interval_ms") {
    return set_milliseconds(1, options_.tick_interval);
  } else if (key == "node_lease_ms") {
    return set_milliseconds(1, options_.node_lease);
  } else if (key == "stop_grace_ms") {
    return set_milliseconds(0, options_.stop_grace_period);
  } else if (key == "shutdown_grace_ms") {
    return set_milliseconds(0, options_.shutdown_grace);
  } else if (key == "peer_rpc_timeout_ms") {
    return set_milliseconds(1, options_.peer_rpc_timeout);
  } else if (key == "start_timeout_ms") {
    return set_milliseconds(kMinStartTimeoutMs, options_.start_timeout);
  } else if (key == "exec_timeout_ms") {
    COHORT_ASSIGN_OR_RETURN(long long ms, parse_integer(value, kMinExecTimeoutMs, kMaxExecTimeoutMs, where, key));
    options_.exec_timeout = milliseconds(ms);
  } else if (key == "stopped_task_limit_ms" || key == "task_heartbeat_timeout_ms") {
    // 0 turns the check off; otherwise at least kMinHangLimitMs, or a loaded machine's scheduling
    // delay would pass for a hang.
    COHORT_ASSIGN_OR_RETURN(long long ms, parse_integer(value, 0, kMaxHangLimitMs, where, key));
    if (ms != 0 && ms < kMinHangLimitMs) {
      return invalid_argument_error("{}: {}: {} ms is too short to tell a hang from a busy machine; give "
                                    "{}..{} ms, or 0 to turn the check off",
                                    where, key, ms, kMinHangLimitMs, kMaxHangLimitMs);
    }
    (key == "stopped_task_limit_ms" ? options_.stopped_task_limit : options_.task_heartbeat_timeout) =
        std::chrono::duration_cast<agent::Duration>(milliseconds(ms));
  } else if (key == "task_heartbeat_interval_ms") {
    COHORT_ASSIGN_OR_RETURN(long long ms, parse_integer(value, kMinRankHeartbeatInterval.count(),
                                                        kMaxRankHeartbeatInterval.count(), where, key));
    options_.task_heartbeat_interval = std::chrono::duration_cast<agent::Duration>(milliseconds(ms));
  } else if (key == "allowed_path_roots") {
    std::vector<std::string> roots;
    std::istringstream in(value);
    for (std::string root; std::getline(in, root, ',');) {
      if (!root.empty()) roots.push_back(root);
    }
    if (Status valid = validate_path_roots(roots); !valid.ok())
      return invalid_argument_error("{}: {}", where, valid.message());
    options_.allowed_path_roots = std::move(roots);
  } else if (key == "allowed_commands") {
    std::vector<std::string> commands;
    std::istringstream in(value);
    for (std::string command; std::getline(in, command, ',');) {
      if (!command.empty()) commands.push_back(command);
    }
    if (Status valid = coordinator::validate_allowed_commands(commands); !valid.ok())
      return invalid_argument_error("{}: {}", where, valid.message());
    options_.allowed_commands = std::move(commands);
  } else if (key == "job_user") {
    if (value.empty())
      return invalid_argument_error("{}: job_user is empty; name a Unix user, e.g. cohort-job", where);
    options_.job_user = value;
  } else if (key == "shared_job_user") {
    if (value != "true" && value != "false")
      return invalid_argument_error("{}: shared_job_user: '{}' is not true or false", where, value);
    options_.shared_job_user = value == "true";
  } else if (key == "run_jobs_as_daemon_user") {
    if (value != "true" && value != "false")
      return invalid_argument_error("{}: run_jobs_as_daemon_user: '{}' is not true or false", where, value);
    options_.run_jobs_as_daemon_user = value == "true";
  } else if (key == "user_map") {
    std::map<std::string, std::string> map;
    std::istringstream in(value);
    for (std::string entry; std::getline(in, entry, ',');) {
      const size_t eq = entry.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size()) {
        return invalid_argument_error("{}: user_map: '{}' is not NAME=USER (cohort user = Unix user)", where,
                                      entry);
      }
      map[entry.substr(0, eq)] = entry.substr(eq + 1);
    }
    options_.user_map = std::move(map);
  } else if (key == "max_log_bytes_per_job") {
    // Up to a pebibyte: anything larger is a typo.
    COHORT_ASSIGN_OR_RETURN(long long bytes, parse_integer(value, 0, 1LL << 50, where, key));
    options_.max_log_bytes_per_job = static_cast<uint64_t>(bytes);
  } else if (key == "job_retention") {
    COHORT_ASSIGN_OR_RETURN(options_.job_retention, parse_retention(value, where));
  } else if (key == "join_token") {
    options_.join_token = value;
  } else if (key == "http_listen") {
    options_.http_listen = value;
  } else if (key == "http_token_file") {
    options_.http_token_file = value;
  } else if (key == "election") {
    options_.election = value;
  } else if (key == "job_store") {
    options_.job_store = value;
  } else if (key == "etcd_ca") {
    options_.etcd_ca_file = value;
  } else if (key == "etcd_cert") {
    options_.etcd_cert_file = value;
  } else if (key == "etcd_key") {
    options_.etcd_key_file = value;
  } else if (key == "leader_lease_ms") {
    COHORT_ASSIGN_OR_RETURN(long long ms, parse_integer(value, 2000, kMaxMs, where, key));
    options_.leader_lease_ttl = std::chrono::seconds((ms + 999) / 1000);
  } else if (key == "etcd_compaction_ms") {
    return set_milliseconds(0, options_.etcd_compaction_interval);
  } else if (key == "advertise") {
    options_.advertise_address = value;
  } else if (key == "insecure") {
    if (value != "true" && value != "false")
      return invalid_argument_error("{}: insecure: '{}' is not true or false", where, value);
    options_.insecure = value == "true";
  } else if (key == "log_level") {
    bool known = false;
    for (const char* level : kLogLevels) known = known || value == level;
    if (!known) {
      return invalid_argument_error("{}: log_level: '{}' is not one of trace, debug, info, warn, error, off",
                                    where, value);
    }
    log_level_ = value;
  } else {
    std::string keys;
    for (const DaemonSetting& setting : daemon_settings())
      keys += (keys.empty() ? "" : ", ") + std::string(setting.key);
    return invalid_argument_error("{}: unknown key '{}'; the keys are {}", where, key, keys);
  }
  return ok_status();
}

Status DaemonConfig::apply_yaml(const std::string& text, const std::string& file_name) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    return invalid_argument_error("{}:{}:{}: not YAML: {}", file_name, error.mark.line + 1,
                                  error.mark.column + 1, error.msg);
  }
  if (root.IsNull()) return ok_status();  // an empty file (or only comments) changes nothing
  if (!root.IsMap()) {
    return invalid_argument_error(
        "{}:{}: the file must be a mapping of settings (key: value), see "
        "configs/cohortd.yaml",
        file_name, root.Mark().line + 1);
  }
  std::vector<std::string> problems;
  for (const auto& entry : root) {
    const std::string where = fmt::format("{}:{}", file_name, entry.first.Mark().line + 1);
    const std::string key = entry.first.Scalar();
    if (entry.second.IsNull()) continue;  // `log_dir:` with no value keeps the default
    if ((key == "allowed_path_roots" || key == "allowed_commands") && entry.second.IsSequence()) {
      std::string joined;
      for (const auto& item : entry.second) joined += (joined.empty() ? "" : ",") + item.as<std::string>("");
      Status status = set(key, joined, where);
      if (!status.ok()) problems.push_back(status.message());
      continue;
    }
    if (key == "user_map" && entry.second.IsMap()) {  // the one mapping-valued setting
      std::string joined;
      for (const auto& pair : entry.second)
        joined += (joined.empty() ? "" : ",") + pair.first.as<std::string>("") + "=" +
                  pair.second.as<std::string>("");
      Status status = set(key, joined, where);
      if (!status.ok()) problems.push_back(status.message());
      continue;
    }
    if (!entry.second.IsScalar()) {
      problems.push_back(fmt::format("{}: {}: expected a single value, not a list or mapping", where, key));
      continue;
    }
    Status status = set(key, entry.second.Scalar(), where);
    if (!status.ok()) problems.push_back(status.message());
  }
  if (problems.empty()) return ok_status();
  std::string message;
  for (const std::string& problem : problems) message += (message.empty() ? "" : "\n") + problem;
  return invalid_argument_error("{}", message);
}

Status DaemonConfig::apply_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return not_found_error("cannot read config file {}: {}; see configs/cohortd.yaml for an example", path,
                           std::strerror(errno));
  }
  std::stringstream text;
  text << in.rdbuf();
  return apply_yaml(text.str(), path);
}

Status DaemonConfig::apply_flag(const std::string& flag, const std::string& value) {
  for (const DaemonSetting& setting : daemon_settings()) {
    if (flag == setting.flag) return set(setting.key, value, flag);
  }
  return invalid_argument_error("unknown flag '{}'", flag);
}

StatusOr<DaemonServerOptions> DaemonConfig::options() const {
  if (!role_set_)
    return invalid_argument_error("no role given: set `role:` in the config file or pass --role");
  if (options_.data_dir.empty())
    return invalid_argument_error(
        "no data directory given: set `data_dir:` in the config file or pass --data-dir");
  if (options_.task_heartbeat_timeout.count() > 0 &&
      options_.task_heartbeat_timeout < 2 * options_.task_heartbeat_interval) {
    return invalid_argument_error(
        "task_heartbeat_timeout_ms ({} ms) is less than twice task_heartbeat_interval_ms ({} ms): one late beat "
        "would get a healthy rank killed; raise the timeout or shorten the interval",
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.task_heartbeat_timeout).count(),
        std::chrono::duration_cast<std::chrono::milliseconds>(options_.task_heartbeat_interval).count());
  }
  if (options_.role != DaemonRole::kAgent && options_.start_timeout <= options_.peer_rpc_timeout) {
    // A launch call alone may take peer_rpc_timeout: attempts would fail before their answer came.
    // Only a coordinator uses start_timeout; an agent's is never read.
    return invalid_argument_error(
        "start_timeout_ms ({} ms) must be more than peer_rpc_timeout_ms ({} ms): a launch call may take that "
        "long before its node reports the tasks started; raise start_timeout_ms",
        options_.start_timeout.count(), options_.peer_rpc_timeout.count());
  }
  if (options_.role == DaemonRole::kAgent && options_.coordinator_address.empty()) {
    return invalid_argument_error(
        "the agent role needs the coordinator's address: set `coordinator:` or pass --coordinator HOST:PORT");
  }
  return options_;
}

}  // namespace cohort::daemon
