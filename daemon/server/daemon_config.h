#pragma once

// cohortd's settings, from a YAML file (configs/cohortd.yaml; `cohortd --config FILE`) and from
// flags, which override the file. One table lists every setting once: its YAML key, its flag, what
// it means, and how it parses into DaemonServerOptions, so the file, the flags and --help cannot
// drift apart.
//
//   DaemonConfig config;                                     // the built-in defaults
//   COHORT_RETURN_IF_ERROR(config.apply_file("/etc/cohort/cohortd.yaml"));
//   COHORT_RETURN_IF_ERROR(config.apply_flag("--slots", "8"));
//   COHORT_ASSIGN_OR_RETURN(DaemonServerOptions options, config.options());
//
// An unknown key, a value of the wrong kind or a bad number is an error naming the file and line
// (or the flag) and what is expected; every problem in a file is reported at once, one per line.

#include <string>
#include <vector>

#include "daemon/server/daemon_server.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// One setting: file key, flag, help.
struct DaemonSetting {
  const char* key;         // YAML key, e.g. "data_dir"
  const char* flag;        // "--data-dir"
  const char* value_name;  // "DIR", for help text
  const char* help;        // one line
};

// Every setting, in the order the help and the example config list them.
const std::vector<DaemonSetting>& daemon_settings();

class DaemonConfig {
 public:
  // Starts from DaemonServerOptions' defaults, with no role chosen.
  DaemonConfig();

  // Applies the YAML mapping in `text`; `file_name` labels errors ("cohortd.yaml:7: ..."). Keys
  // the text leaves out keep their current values. INVALID_ARGUMENT listing every problem.
  Status apply_yaml(const std::string& text, const std::string& file_name);
  // Reads `path` and applies it. NOT_FOUND naming the path when it cannot be read.
  Status apply_file(const std::string& path);
  // Applies one flag ("--slots", "8"). INVALID_ARGUMENT for an unknown flag or a bad value.
  Status apply_flag(const std::string& flag, const std::string& value);
  // Whether `flag` is one of the settings' flags.
  static bool is_setting_flag(const std::string& flag);

  // The options to start the server with. INVALID_ARGUMENT when a required setting is missing
  // (role; data_dir; coordinator for the agent role).
  StatusOr<DaemonServerOptions> options() const;
  // The log level setting (trace, debug, info, warn, error, off); empty: the environment's.
  const std::string& log_level() const { return log_level_; }
  // How often to ping the systemd watchdog is derived from WATCHDOG_USEC, not configured here.

 private:
  // Sets one setting by key from its text; `where` labels errors ("cohortd.yaml:7" or "--slots").
  Status set(const std::string& key, const std::string& value, const std::string& where);

  DaemonServerOptions options_;
  bool role_set_ = false;
  std::string log_level_;
};

}  // namespace cohort::daemon
