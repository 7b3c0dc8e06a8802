// cohort's flag library (CLI11): help shape, --version, usage errors exit 2 naming the argument,
// environment fallbacks that a flag on the line overrides.

#include "worker/base/cli_flags.h"

#include <cstdlib>
#include <sstream>

#include <gtest/gtest.h>

#include "worker/base/version.h"

namespace cohort::cli_flags {
namespace {

struct Parsed {
  std::optional<int> exit;
  std::string out;
  std::string err;
};

Parsed run(CLI::App& app, std::vector<std::string> args) {
  std::ostringstream out, err;
  Parsed parsed;
  parsed.exit = parse(app, std::move(args), out, err);
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

TEST(CliFlagsTest, HelpStartsWithUsageThenDescriptionOptionsAndFooter) {
  auto app = make_app("tool", "tool does one thing.");
  int rank = 0;
  app->add_option("--rank,-r", rank, "this process's rank")->envname("COHORT_TEST_RANK");
  app->footer("examples:\n  tool --rank 1");
  Parsed help = run(*app, {"--help"});
  ASSERT_EQ(help.exit, 0);
  EXPECT_EQ(help.out.rfind("usage: tool [options]", 0), 0u) << help.out;
  const size_t description = help.out.find("tool does one thing.");
  const size_t option = help.out.find("--rank");
  const size_t footer = help.out.find("examples:");
  ASSERT_NE(description, std::string::npos) << help.out;
  ASSERT_NE(option, std::string::npos) << help.out;
  ASSERT_NE(footer, std::string::npos) << help.out;
  EXPECT_LT(description, option);
  EXPECT_LT(option, footer);
  EXPECT_NE(help.out.find("COHORT_TEST_RANK"), std::string::npos) << help.out;
}

TEST(CliFlagsTest, VersionPrintsProgramAndVersion) {
  auto app = make_app("tool", "");
  Parsed version = run(*app, {"--version"});
  ASSERT_EQ(version.exit, 0);
  EXPECT_EQ(version.out, std::string("tool ") + cohort::kVersion + "\n");
  auto custom = make_app("tool", "", "9.9");
  EXPECT_EQ(run(*custom, {"--version"}).out, "tool 9.9\n");
}

TEST(CliFlagsTest, UsageErrorsExitTwoAndNameTheArgument) {
  auto app = make_app("tool", "");
  int rank = 0;
  app->add_option("--rank", rank, "rank");
  Parsed unknown = run(*app, {"--rnak", "1"});
  EXPECT_EQ(unknown.exit, kExitUsage);
  EXPECT_NE(unknown.err.find("tool: "), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("--rnak"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("tool --help"), std::string::npos) << unknown.err;
  Parsed missing = run(*app, {"--rank"});
  EXPECT_EQ(missing.exit, kExitUsage);
  EXPECT_NE(missing.err.find("--rank needs a value"), std::string::npos) << missing.err;
  Parsed not_number = run(*app, {"--rank", "three"});
  EXPECT_EQ(not_number.exit, kExitUsage);
  EXPECT_NE(not_number.err.find("three"), std::string::npos) << not_number.err;
  EXPECT_EQ(run(*app, {"--rank=4"}).exit, std::nullopt);
  EXPECT_EQ(rank, 4);
}

TEST(CliFlagsTest, EnvironmentFallbackAndFlagWins) {
  auto app = make_app("tool", "");
  std::string address = "default";
  app->add_option("--address", address, "where")->envname("COHORT_CLI_FLAGS_TEST_ADDRESS");
  setenv("COHORT_CLI_FLAGS_TEST_ADDRESS", "from-env", 1);
  EXPECT_EQ(run(*app, {}).exit, std::nullopt);
  EXPECT_EQ(address, "from-env");
  auto again = make_app("tool", "");
  again->add_option("--address", address, "where")->envname("COHORT_CLI_FLAGS_TEST_ADDRESS");
  EXPECT_EQ(run(*again, {"--address", "from-flag"}).exit, std::nullopt);
  EXPECT_EQ(address, "from-flag");
  unsetenv("COHORT_CLI_FLAGS_TEST_ADDRESS");
}

TEST(CliFlagsTest, SubcommandErrorsNameTheSubcommand) {
  auto app = make_app("tool", "");
  CLI::App* sub = app->add_subcommand("go", "go somewhere");
  std::string where;
  sub->add_option("where", where, "where to")->required();
  Parsed missing = run(*app, {"go"});
  EXPECT_EQ(missing.exit, kExitUsage);
  EXPECT_NE(missing.err.find("tool go: "), std::string::npos) << missing.err;
  Parsed help = run(*app, {"go", "--help"});
  EXPECT_EQ(help.exit, 0);
  EXPECT_EQ(help.out.rfind("usage: tool go", 0), 0u) << help.out;
}

}  // namespace
}  // namespace cohort::cli_flags
