#include "daemon/server/daemon_flags.h"

namespace cohort::daemon {

DaemonFlags::DaemonFlags(CLI::App& app) {
  app.add_option("--config", config_file_,
                 "read settings from a YAML file (configs/cohortd.yaml lists every key); flags given as well "
                 "override the file")
      ->type_name("FILE")
      ->envname(kConfigFileEnv);
  const std::vector<DaemonSetting>& settings = daemon_settings();
  given_.resize(settings.size());  // never resized again: the options below point into it
  for (size_t i = 0; i < settings.size(); ++i) {
    given_[i].setting = &settings[i];
    given_[i].option = app.add_option(settings[i].flag, given_[i].value, settings[i].help)
                           ->type_name(settings[i].value_name)
                           ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  }
}

Status DaemonFlags::apply(DaemonConfig& config) const {
  for (const Given& given : given_) {
    if (given.option->count() == 0) continue;
    COHORT_RETURN_IF_ERROR(config.apply_flag(given.setting->flag, given.value));
  }
  return ok_status();
}

}  // namespace cohort::daemon
