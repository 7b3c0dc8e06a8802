#include "worker/base/logging.h"

#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

namespace cohort {
namespace {

bool contains(const std::string& text, const std::string& fragment) {
  return text.find(fragment) != std::string::npos;
}

TEST(LoggingTest, EveryDocumentedLevelNameParses) {
  EXPECT_EQ(*parse_log_level("trace"), spdlog::level::trace);
  EXPECT_EQ(*parse_log_level("debug"), spdlog::level::debug);
  EXPECT_EQ(*parse_log_level("info"), spdlog::level::info);
  EXPECT_EQ(*parse_log_level("warn"), spdlog::level::warn);
  EXPECT_EQ(*parse_log_level("error"), spdlog::level::err);
  EXPECT_EQ(*parse_log_level("critical"), spdlog::level::critical);
  EXPECT_EQ(*parse_log_level("off"), spdlog::level::off);
}

TEST(LoggingTest, AnUnknownLevelIsAnErrorNamingTheAcceptedOnes) {
  StatusOr<spdlog::level::level_enum> level = parse_log_level("verbose");
  ASSERT_FALSE(level.ok());
  EXPECT_EQ(level.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(contains(level.status().message(), "'verbose'")) << level.status().message();
  EXPECT_TRUE(contains(level.status().message(), kLogLevelNames)) << level.status().message();
}

TEST(LoggingTest, TheEnvironmentVariableIsCheckedAndDefaultsToInfo) {
  ::unsetenv(kLogLevelEnv);
  EXPECT_EQ(*log_level_from_env(), spdlog::level::info);
  ::setenv(kLogLevelEnv, "debug", 1);
  EXPECT_EQ(*log_level_from_env(), spdlog::level::debug);
  ::setenv(kLogLevelEnv, "loud", 1);
  StatusOr<spdlog::level::level_enum> level = log_level_from_env();
  ASSERT_FALSE(level.ok());
  EXPECT_TRUE(contains(level.status().message(), "COHORT_LOG_LEVEL=loud")) << level.status().message();
  EXPECT_TRUE(contains(level.status().message(), kLogLevelNames)) << level.status().message();
  // init_logging refuses it too, instead of silently turning logging off.
  Status init = init_logging("logging-test");
  EXPECT_EQ(init.code(), StatusCode::kInvalidArgument);
  ::unsetenv(kLogLevelEnv);
}

}  // namespace
}  // namespace cohort
