// The CLI's pieces that need no server: argument parsing (CLI11), exit codes, worker discovery,
// progress lines, tables, YAML output, the completion script.

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "client/cli/cli.h"
#include "client/cli/job_follower.h"
#include "client/cli/metrics_printer.h"
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
  for (const char* name : {"submit", "status", "list", "wait", "logs", "metrics", "cancel", "nodes", "run", "version",
                           "user", "node", "completion"}) {
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
  EXPECT_EQ(run_cli({"list", "-o", "xml"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_NE(err.str().find("not 'xml'"), std::string::npos) << err.str();
  // Unknown options name themselves; an option needing a value says so; a missing argument too.
  std::ostringstream unknown_err;
  EXPECT_EQ(run_cli({"status", "job-1", "--frobnicate"}, {&out, &unknown_err, false, ""}), kExitUsage);
  EXPECT_NE(unknown_err.str().find("--frobnicate"), std::string::npos) << unknown_err.str();
  std::ostringstream value_err;
  EXPECT_EQ(run_cli({"cancel", "job-1", "--reason"}, {&out, &value_err, false, ""}), kExitUsage);
  EXPECT_NE(value_err.str().find("--reason needs a value"), std::string::npos) << value_err.str();
  std::ostringstream missing_err;
  EXPECT_EQ(run_cli({"submit"}, {&out, &missing_err, false, ""}), kExitUsage);
  EXPECT_NE(missing_err.str().find("cohort submit: JOB.yaml is required"), std::string::npos) << missing_err.str();
  EXPECT_EQ(run_cli({"user"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"node", "token", "--ttl", "0"}, {&out, &err, false, ""}), kExitUsage);
  EXPECT_EQ(run_cli({"wait", "job-1", "--timeout", "soon"}, {&out, &err, false, ""}), kExitUsage);
}

TEST(CliTest, HelpDocumentsExitCodesAndVersionPrints) {
  std::ostringstream out, err;
  ASSERT_EQ(run_cli({"--help"}, {&out, &err, false, ""}), kExitOk);
  EXPECT_EQ(out.str().rfind("usage: cohort", 0), 0u) << out.str();
  for (const char* line : {"exit status:", "  1  a call failed", "  2  usage", "  3  the job ended FAILED or CANCELLED",
                           "COHORT_COORDINATOR", "COHORT_CREDENTIALS"}) {
    EXPECT_NE(out.str().find(line), std::string::npos) << line << "\n" << out.str();
  }
  std::ostringstream version;
  ASSERT_EQ(run_cli({"--version"}, {&version, &err, false, ""}), kExitOk);
  EXPECT_EQ(version.str().rfind("cohort ", 0), 0u) << version.str();
  // Global options after the command, CLI11's fallthrough: -o reaches the tool's option.
  std::ostringstream submit_help;
  ASSERT_EQ(run_cli({"submit", "--help"}, {&submit_help, &err, false, ""}), kExitOk);
  EXPECT_NE(submit_help.str().find("--set PATH=VALUE"), std::string::npos) << submit_help.str();
}

TEST(CliTest, OutputFormatsBelongToTheirCommands) {
  std::ostringstream out;
  std::ostringstream wide_err;
  EXPECT_EQ(run_cli({"logs", "job-1", "-o", "wide"}, {&out, &wide_err, false, ""}), kExitUsage);
  EXPECT_NE(wide_err.str().find("-o wide is for cohort list, status and nodes"), std::string::npos) << wide_err.str();
  std::ostringstream yaml_err;
  EXPECT_EQ(run_cli({"metrics", "job-1", "-o", "yaml"}, {&out, &yaml_err, false, ""}), kExitUsage);
  EXPECT_NE(yaml_err.str().find("-o yaml"), std::string::npos) << yaml_err.str();
}

TEST(CliTest, SetOverridesAreCheckedBeforeAnyCall) {
  ScratchDir dir;
  const std::string job = dir.path() + "/job.yaml";
  std::ofstream(job) << "name: sweep\nnodes: 1\nprocs_per_node: 1\ncommand: [/bin/true]\n";
  std::ostringstream out;
  struct Case {
    std::string set;
    std::string expected;  // in the error
  };
  for (const Case& c : std::vector<Case>{{"optimizer.lrr=0.1", "no field 'lrr' (did you mean 'lr'?)"},
                                         {"optimizer.lr=fast", "optimizer.lr: 'fast' is not a number"},
                                         {"epochs=3.5", "epochs: '3.5' is not a whole number"},
                                         {"optimizer=sgd", "optimizer is a mapping"},
                                         {"no_equals_sign", "write PATH=VALUE"}}) {
    std::ostringstream err;
    EXPECT_EQ(run_cli({"submit", job, "--set", c.set, "--coordinator", "127.0.0.1:1"}, {&out, &err, false, ""}),
              kExitUsage)
        << c.set;
    EXPECT_NE(err.str().find(c.expected), std::string::npos) << c.set << ": " << err.str();
    EXPECT_NE(err.str().find(c.set.substr(0, c.set.find('='))), std::string::npos) << err.str();
  }
}

TEST(CliTest, CompletionScriptNamesCommandsOptionsAndJobIds) {
  std::ostringstream out, err;
  ASSERT_EQ(run_cli({"completion", "bash"}, {&out, &err, false, ""}), kExitOk) << err.str();
  const std::string script = out.str();
  EXPECT_NE(script.find("complete -F _cohort cohort"), std::string::npos);
  EXPECT_NE(script.find("submit status list wait logs"), std::string::npos) << script;
  EXPECT_NE(script.find("list -o json"), std::string::npos);
  EXPECT_NE(script.find("--wait-for-capacity"), std::string::npos);
  EXPECT_EQ(run_cli({"completion", "zsh"}, {&out, &err, false, ""}), kExitUsage);
}

TEST(OutputTest, JsonRecordsBecomeBlockYamlKeepingStringsStrings) {
  const std::string yaml =
      json_to_yaml("{\"jobs\": [{\"id\": \"a-1\", \"state\": \"RUNNING\", \"attempt\": 2, "
                   "\"name\": \"true\", \"n\": \"123\", \"empty\": \"\"}], \"x\": {}}");
  EXPECT_NE(yaml.find("jobs:\n  - id: a-1\n    state: RUNNING\n    attempt: 2\n"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("name: \"true\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("n: \"123\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("empty: \"\""), std::string::npos) << yaml;
}

// Two stored reports as GetMetrics returns them: the second with a communication wait.
std::vector<MetricsRow> two_reports() {
  cohort::v1::MetricsPoint first;
  first.set_seq(11);
  first.set_attempt(2);
  first.mutable_time()->set_seconds(1700000000);
  first.mutable_time()->set_nanos(250000000);
  first.mutable_metrics()->set_step(10);
  first.mutable_metrics()->set_loss(0.5);
  first.mutable_metrics()->set_samples_per_s(100);
  cohort::v1::MetricsPoint second = first;
  second.set_seq(14);
  second.mutable_metrics()->set_step(20);
  second.mutable_metrics()->set_comm_wait_s(7.5);
  second.mutable_metrics()->set_comm_wait_ratio(0.25);
  return {MetricsRow::of(first), MetricsRow::of(second)};
}

std::string print_reports(OutputFormat format) {
  std::ostringstream out, err;
  CommandContext context;
  context.format = format;
  context.out = &out;
  context.err = &err;
  MetricsPrinter printer(context);
  for (const MetricsRow& row : two_reports()) printer.print(row);
  return out.str();
}

TEST(MetricsPrinterTest, EveryFormatShowsTheCommunicationWait) {
  std::istringstream csv(print_reports(OutputFormat::kCsv));
  std::vector<std::string> rows;
  for (std::string row; std::getline(csv, row);) rows.push_back(row);
  ASSERT_EQ(rows.size(), 3u);
  // The older columns keep their places; the communication wait comes last.
  EXPECT_EQ(rows[0], "seq,attempt,unix_ms,step,epoch,loss,accuracy,samples_per_s,rank,comm_wait_s,comm_wait_ratio");
  EXPECT_EQ(rows[1], "11,2,1700000000250,10,0,0.5,0,100,0,0,0");
  EXPECT_EQ(rows[2], "14,2,1700000000250,20,0,0.5,0,100,0,7.5,0.25");

  const std::string json = print_reports(OutputFormat::kJson);
  const size_t second_line = json.find('\n') + 1;
  ASSERT_NE(second_line, 0u);
  EXPECT_NE(json.find("\"comm_wait_s\": 0, \"comm_wait_ratio\": 0}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"comm_wait_s\": 7.5, \"comm_wait_ratio\": 0.25}\n", second_line), std::string::npos) << json;
  EXPECT_NE(json.find("{\"seq\": 14, \"attempt\": 2, \"unix_ms\": 1700000000250, \"step\": 20,"), std::string::npos)
      << json;

  std::istringstream table(print_reports(OutputFormat::kHuman));
  std::vector<std::string> lines;
  for (std::string line; std::getline(table, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_NE(lines[0].find("COMM WAIT"), std::string::npos) << lines[0];
  // Unmeasured is "-", not a wait of zero; measured: cumulative seconds and the share of time.
  EXPECT_EQ(lines[1].substr(lines[1].size() - 2), " -") << lines[1];
  EXPECT_EQ(lines[2].substr(lines[2].size() - 9), " 7.5s 25%") << lines[2];
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
