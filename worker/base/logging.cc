#include "worker/base/logging.h"

#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace cohort {

StatusOr<spdlog::level::level_enum> parse_log_level(std::string_view name) {
  // spdlog::level::from_str maps every unknown name to `off`; look names up ourselves instead.
  struct Named {
    std::string_view name;
    spdlog::level::level_enum level;
  };
  static constexpr Named kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},       {"info", spdlog::level::info},
      {"warn", spdlog::level::warn},   {"warning", spdlog::level::warn},      {"error", spdlog::level::err},
      {"err", spdlog::level::err},     {"critical", spdlog::level::critical}, {"off", spdlog::level::off},
  };
  for (const Named& level : kLevels) {
    if (level.name == name) return level.level;
  }
  return invalid_argument_error("log level '{}' is not one of {}", name, kLogLevelNames);
}

StatusOr<spdlog::level::level_enum> log_level_from_env() {
  const char* value = std::getenv(kLogLevelEnv);
  if (value == nullptr || *value == '\0') return spdlog::level::info;
  StatusOr<spdlog::level::level_enum> level = parse_log_level(value);
  if (!level.ok()) {
    return invalid_argument_error("{}={}: {}; set it to one of those or unset it (default info)", kLogLevelEnv,
                                  value, level.status().message());
  }
  return level;
}

Status init_logging(std::string_view process_name) {
  COHORT_ASSIGN_OR_RETURN(spdlog::level::level_enum level, log_level_from_env());
  auto logger = spdlog::stderr_color_mt(std::string(process_name));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  logger->set_level(level);
  spdlog::set_default_logger(std::move(logger));
  return ok_status();
}

}  // namespace cohort
