#pragma once

// Process-wide logging setup over spdlog. Every binary calls init_logging() once in main.
// Level from COHORT_LOG_LEVEL (trace, debug, info, warn, error, off), default info.

#include <string_view>

#include <spdlog/spdlog.h>

namespace cohort {

// Sets the default logger's pattern to "[time] [name] [level] message" on stderr.
// Thread-safe after it returns; call before starting threads.
void init_logging(std::string_view process_name);

}  // namespace cohort
