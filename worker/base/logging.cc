#include "worker/base/logging.h"

#include <cstdlib>
#include <string>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace cohort {

void init_logging(std::string_view process_name) {
  auto logger = spdlog::stderr_color_mt(std::string(process_name));
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%^%l%$] %v");
  const char* level = std::getenv("COHORT_LOG_LEVEL");
  logger->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::info);
  spdlog::set_default_logger(std::move(logger));
}

}  // namespace cohort
