#pragma once

// DaemonFlags: cohortd's command line on CLI11 (worker/base/cli_flags.h), built from the settings
// table (daemon_config.h): `--config FILE` plus one option per setting, with the setting's value
// name and help, so a setting added to the table is a flag and a config key at once.
//
// Precedence, lowest first: built-in defaults, the config file, the flags (each given flag
// overrides the file's key; a flag given twice: the last wins).
//
//   auto app = cli_flags::make_app("cohortd", "...");
//   DaemonFlags flags(*app);
//   if (std::optional<int> exit = cli_flags::parse(*app, argc, argv)) return *exit;
//   DaemonConfig config;
//   if (!flags.config_file().empty()) COHORT_RETURN_IF_ERROR(config.apply_file(flags.config_file()));
//   COHORT_RETURN_IF_ERROR(flags.apply(config));
//
// Not thread-safe. The App keeps pointers into this object: it must outlive the parse.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "daemon/server/daemon_config.h"
#include "worker/base/status.h"

namespace cohort::daemon {

// Environment variable naming the config file when --config is not given (containers, units).
inline constexpr const char* kConfigFileEnv = "COHORTD_CONFIG";

class DaemonFlags {
 public:
  // Adds --config and every setting's flag to `app`.
  explicit DaemonFlags(CLI::App& app);
  DaemonFlags(const DaemonFlags&) = delete;
  DaemonFlags& operator=(const DaemonFlags&) = delete;

  // The file given with --config (or COHORTD_CONFIG); empty when none. Valid after the parse.
  const std::string& config_file() const { return config_file_; }
  // Applies every setting given on the command line to `config`, in the table's order. The first
  // bad value's error, naming the flag and what is expected (INVALID_ARGUMENT).
  Status apply(DaemonConfig& config) const;

 private:
  struct Given {
    const DaemonSetting* setting;
    CLI::Option* option;
    std::string value;
  };
  std::string config_file_;
  std::vector<Given> given_;  // one per setting; sized once, so the App's pointers stay valid
};

}  // namespace cohort::daemon
