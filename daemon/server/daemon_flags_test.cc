#include "daemon/server/daemon_flags.h"

#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "worker/base/cli_flags.h"

namespace cohort::daemon {
namespace {

struct Parsed {
  std::optional<int> exit;  // set when the command line ends the program (help, version, usage error)
  std::string out;
  std::string err;
};

Parsed parse(CLI::App& app, const std::vector<std::string>& args) {
  std::ostringstream out;
  std::ostringstream err;
  Parsed parsed;
  parsed.exit = cli_flags::parse(app, args, out, err);
  parsed.out = out.str();
  parsed.err = err.str();
  return parsed;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DaemonFlagsTest, FlagsOverrideTheFileAndTheLastFlagWins) {
  const std::string file = write_file("a.yaml", "role: agent\ndata_dir: /tmp/a\nslots: 2\ncoordinator: 10.0.0.1:7070\n");
  auto app = cli_flags::make_app("cohortd", "test");
  DaemonFlags flags(*app);
  Parsed parsed = parse(*app, {"--config", file, "--slots", "4", "--slots=6", "--listen=127.0.0.1:0"});
  ASSERT_FALSE(parsed.exit) << parsed.err;
  EXPECT_EQ(flags.config_file(), file);
  DaemonConfig config;
  ASSERT_TRUE(config.apply_file(flags.config_file()).ok());
  ASSERT_TRUE(flags.apply(config).ok());
  StatusOr<DaemonServerOptions> options = config.options();
  ASSERT_TRUE(options.ok()) << options.status().to_string();
  EXPECT_EQ(options->slots, 6);
  EXPECT_EQ(options->listen, "127.0.0.1:0");
  EXPECT_EQ(options->data_dir, "/tmp/a");  // from the file, not overridden
  EXPECT_EQ(options->role, DaemonRole::kAgent);
}

TEST(DaemonFlagsTest, EverySettingIsAFlagInTheHelp) {
  auto app = cli_flags::make_app("cohortd", "test");
  DaemonFlags flags(*app);
  Parsed parsed = parse(*app, {"--help"});
  ASSERT_EQ(parsed.exit, 0);
  EXPECT_EQ(parsed.out.rfind("usage: cohortd", 0), 0u) << parsed.out;
  for (const DaemonSetting& setting : daemon_settings()) {
    EXPECT_NE(parsed.out.find(std::string(setting.flag) + " " + setting.value_name), std::string::npos)
        << setting.flag << " missing from:\n" << parsed.out;
  }
  EXPECT_NE(parsed.out.find("--config FILE"), std::string::npos);
  EXPECT_NE(parsed.out.find(kConfigFileEnv), std::string::npos) << parsed.out;
}

TEST(DaemonFlagsTest, BadValuesNameTheFlag) {
  auto app = cli_flags::make_app("cohortd", "test");
  DaemonFlags flags(*app);
  Parsed parsed = parse(*app, {"--slots", "many", "--role", "all"});
  ASSERT_FALSE(parsed.exit) << parsed.err;
  DaemonConfig config;
  Status applied = flags.apply(config);
  EXPECT_EQ(applied.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(applied.message().find("--slots"), std::string::npos) << applied.message();
  EXPECT_NE(applied.message().find("many"), std::string::npos) << applied.message();
}

TEST(DaemonFlagsTest, UnknownFlagsAndMissingValuesAreUsageErrors) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--bogus"}, {"--role"}, {"stray"}}) {
    auto app = cli_flags::make_app("cohortd", "test");
    DaemonFlags flags(*app);
    Parsed parsed = parse(*app, args);
    EXPECT_EQ(parsed.exit, cli_flags::kExitUsage) << args[0];
    EXPECT_EQ(parsed.err.rfind("cohortd: ", 0), 0u) << parsed.err;
  }
}

TEST(DaemonFlagsTest, ConfigFileFromTheEnvironmentUnlessGiven) {
  setenv(kConfigFileEnv, "/etc/cohort/from-env.yaml", 1);
  {
    auto app = cli_flags::make_app("cohortd", "test");
    DaemonFlags flags(*app);
    ASSERT_FALSE(parse(*app, {}).exit);
    EXPECT_EQ(flags.config_file(), "/etc/cohort/from-env.yaml");
  }
  {
    auto app = cli_flags::make_app("cohortd", "test");
    DaemonFlags flags(*app);
    ASSERT_FALSE(parse(*app, {"--config", "/x.yaml"}).exit);
    EXPECT_EQ(flags.config_file(), "/x.yaml");
  }
  unsetenv(kConfigFileEnv);
}

}  // namespace
}  // namespace cohort::daemon
