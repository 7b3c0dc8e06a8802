#pragma once

// Process-wide logging setup over spdlog. Every binary calls init_logging() once in main.
// Level from COHORT_LOG_LEVEL (trace, debug, info, warn, error, critical, off), default info; any
// other value is an error, so a typo does not silently turn logging off.

#include <string_view>

#include <spdlog/spdlog.h>

#include "worker/base/status.h"

namespace cohort {

// The environment variable every cohort binary reads its log level from.
inline constexpr const char* kLogLevelEnv = "COHORT_LOG_LEVEL";
// The level names COHORT_LOG_LEVEL accepts, for help and error texts.
inline constexpr const char* kLogLevelNames = "trace, debug, info, warn, error, critical, off";

// A level by name (one of kLogLevelNames; "warning" and "err" too, as spdlog spells them).
// INVALID_ARGUMENT naming the accepted values otherwise.
StatusOr<spdlog::level::level_enum> parse_log_level(std::string_view name);

// The level COHORT_LOG_LEVEL asks for; info when it is unset or empty. INVALID_ARGUMENT for an
// unknown value, naming the variable, the value and the accepted ones.
StatusOr<spdlog::level::level_enum> log_level_from_env();

// Sets the default logger's pattern to "[time] [name] [level] message" on stderr, at the level of
// log_level_from_env(). Returns its error (and changes nothing) for an unknown level: main should
// print it and exit with its usage status. Call before starting threads.
Status init_logging(std::string_view process_name);

}  // namespace cohort
