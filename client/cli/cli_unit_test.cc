// The CLI's pieces that need no server: argument parsing, worker discovery, progress lines, tables.

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "client/cli/args.h"
#include "client/cli/cli.h"
#include "client/cli/job_follower.h"
#include "client/cli/output.h"
#include "client/cli/worker_locator.h"

namespace cohort::client::cli {
namespace {

class ScratchDir {
 public:
  ScratchDir() {
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/cohort-cli-XXXXXX";
    path_ = mkdtemp(pattern.data());
  }
  ~ScratchDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }
  // Creates an executable file at `relative`; returns its path.
  std::string executable(const std::string& relative) const {
    const std::string full = path_ + "/" + relative;
    std::filesystem::create_directories(std::filesystem::path(full).parent_path());
    std::ofstream(full) << "#!/bin/sh\n";
    chmod(full.c_str(), 0755);
    return full;
  }

 private:
  std::string path_;
};

TEST(ArgsTest, FlagsInAnyOrderWithValuesAndSwitches) {
  auto args = Args::parse({"job-1", "--rank=3", "-f"}, {{"--rank", "-r", true}, {"--follow", "-f", false}});
  ASSERT_TRUE(args.ok()) << args.status().to_string();
  EXPECT_TRUE(args->has("--follow"));
  EXPECT_EQ(args->value("--rank"), "3");
  ASSERT_EQ(args->positional().size(), 1u);
  EXPECT_EQ(args->positional()[0], "job-1");
  auto rank = args->int_value("--rank", 0, 0, 2);
  ASSERT_FALSE(rank.ok());
  EXPECT_NE(rank.status().message().find("'3'"), std::string::npos);
}

TEST(ArgsTest, UnknownFlagAndMissingValueAreNamed) {
  auto unknown = Args::parse({"--rnak", "1"}, {{"--rank", "-r", true}});
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("--rnak"), std::string::npos);
  auto missing = Args::parse({"--rank"}, {{"--rank", "-r", true}});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("needs a value"), std::string::npos);
}

TEST(WorkerLocatorTest, SearchOrderFlagEnvBesideBazelPath) {
  ScratchDir dir;
  WorkerSearch search;
  search.program_path = dir.path() + "/bin/cohort";
  search.path_env = dir.path() + "/path";
  // Nothing anywhere: the error names every place looked.
  auto none = locate_worker(search);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(dir.path() + "/bin/cohort-worker"), std::string::npos);
  EXPECT_NE(none.status().message().find(dir.path() + "/worker/runner/cohort-worker"), std::string::npos);
  EXPECT_NE(none.status().message().find("$PATH"), std::string::npos);
  EXPECT_NE(none.status().message().find("--worker"), std::string::npos);

  const std::string on_path = dir.executable("path/cohort-worker");
  EXPECT_EQ(*locate_worker(search), on_path);
  const std::string bazel = dir.executable("worker/runner/cohort-worker");
  EXPECT_EQ(*locate_worker(search), bazel);
  const std::string beside = dir.executable("bin/cohort-worker");
  EXPECT_EQ(*locate_worker(search), beside);
  search.env = dir.executable("env-worker");
  EXPECT_EQ(*locate_worker(search), search.env);
  search.flag = dir.path() + "/missing";
  auto bad_flag = locate_worker(search);
  ASSERT_FALSE(bad_flag.ok());
  EXPECT_NE(bad_flag.status().message().find("missing does not exist"), std::string::npos);
}

TEST(ProgressTest, LineShowsEpochStepLossAccuracyThroughputAndEta) {
  cohort::v1::JobSpec spec;
  spec.set_epochs(2);
  spec.set_batch_size(10);
  spec.set_nodes(1);
  spec.set_procs_per_node(2);
  cohort::v1::Metrics metrics;
  metrics.set_epoch(0);
  metrics.set_step(50);
  metrics.set_loss(0.25);
  metrics.set_accuracy(0.875);
  metrics.set_samples_per_s(200);
  const std::string line = format_progress(metrics, spec, /*bar=*/false);
  EXPECT_NE(line.find("epoch 1/2"), std::string::npos) << line;
  EXPECT_NE(line.find("step 50"), std::string::npos) << line;
  EXPECT_NE(line.find("loss 0.2500"), std::string::npos) << line;
  EXPECT_NE(line.find("acc 87.50%"), std::string::npos) << line;
  EXPECT_NE(line.find("200 samples/s"), std::string::npos) << line;
  // With the total known (Metrics.total_steps), the ETA: 50 steps left x 20 samples / 200 per s.
  metrics.set_total_steps(100);
  const std::string with_total = format_progress(metrics, spec, /*bar=*/true);
  EXPECT_NE(with_total.find("step 50/100"), std::string::npos) << with_total;
  EXPECT_NE(with_total.find("ETA 5s"), std::string::npos) << with_total;
  EXPECT_NE(with_total.find(" 50%"), std::string::npos) << with_total;
  EXPECT_EQ(with_total.rfind("[============>           ]", 0), 0u) << with_total;
  // A model-parallel worker says its ranks share one batch: 50 steps x 10 samples / 200 per s.
  metrics.set_samples_per_step(10);
  EXPECT_NE(format_progress(metrics, spec, true).find("ETA 3s"), std::string::npos);
  metrics.set_samples_per_step(0);
  metrics.set_total_epochs(3);
  EXPECT_NE(format_progress(metrics, spec, false).find("epoch 1/3"), std::string::npos);
  // Without the worker's total, a spec with a fixed train_size implies it: 3 x ceil(990 / 20).
  metrics.set_total_steps(0);
  spec.mutable_dataset()->set_train_size(990);
  EXPECT_NE(format_progress(metrics, spec, false).find("step 50/150"), std::string::npos);
}

TEST(OutputTest, JsonQuoteKeepsUtf8AndReplacesInvalidBytes) {
  EXPECT_EQ(json_quote("caf\xc3\xa9 \"x\"\n"), "\"caf\xc3\xa9 \\\"x\\\"\\n\"");
  EXPECT_EQ(json_quote("a\xff\xc3"), "\"a\\ufffd\\ufffd\"");
  EXPECT_EQ(json_quote("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");  // a surrogate
  // A character cut at the end of a chunk is held back; a whole one or a stray byte is not.
  EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xf0\x9f\x98"), 2u);
  EXPECT_EQ(utf8_complete_prefix("ab\xe2\x82\xac"), 5u);
  EXPECT_EQ(utf8_complete_prefix("ab\xff"), 3u);
  EXPECT_EQ(utf8_complete_prefix("ab\x82"), 3u);
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
}

TEST(OutputTest, TableColumnsAlign) {
  std::ostringstream out;
  print_table(out, {"JOB", "STATE"}, {{"a-1", "RUNNING"}, {"longer-22", "FAILED"}});
  EXPECT_EQ(out.str(), "JOB        STATE\na-1        RUNNING\nlonger-22  FAILED\n");
}

TEST(CliTest, HelpListsEveryCommandAndEachCommandHasExamples) {
  std::ostringstream out, err;
  ASSERT_EQ(run_cli({"--help"}, {&out, &err, false, ""}), kExitOk);
  for (const char* name : {"submit", "status", "list", "logs", "metrics", "cancel", "nodes", "run", "version"}) {
    EXPECT_NE(out.str().find(std::string("  ") + name), std::string::npos) << name;
    std::ostringstream command_out;
    ASSERT_EQ(run_cli({name, "--help"}, {&command_out, &err, false, ""}), kExitOk) << name;
    EXPECT_NE(command_out.str().find("usage: cohort " + std::string(name)), std::string::npos) << name;
    EXPECT_NE(command_out.str().find("examples:"), std::string::npos) << name;
  }
}

TEST(CliTest, UsageErrorsExitTwo) {
  std::ostringstream out, err;
  EXPECT_EQ(run_cli({}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"frobnicate"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_NE(err.str().find("unknown command 'frobnicate'"), std::string::npos);
  EXPECT_EQ(run_cli({"status"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"list", "-o", "yaml"}, {&out, &err, false, ""}), kExitUsage);
}

TEST(CliTest, CsvIsForMetricsAndLogsFlagsAreCheckedBeforeAnyCall) {
  std::ostringstream out, err;
  EXPECT_EQ(run_cli({"list", "-o", "csv"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_NE(err.str().find("-o csv is for cohort metrics"), std::string::npos) << err.str();
  EXPECT_EQ(run_cli({"metrics"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"metrics", "job-1", "--attempt", "-1"}, {&out, &err, false, ""}), kExitUsage);
  std::ostringstream since_err;
  EXPECT_EQ(run_cli({"logs", "job-1", "--since", "10y"}, {&out, &since_err, false, ""}), kExitUsage);
  EXPECT_NE(since_err.str().find("unknown unit 'y'"), std::string::npos) << since_err.str();
  EXPECT_EQ(run_cli({"logs", "job-1", "--since", "m"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"logs", "job-1", "--tail", "-3"}, {&out, &err, false, ""}), kExitUsage);
}

}  // namespace
}  // namespace cohort::client::cli
