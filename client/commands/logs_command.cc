// cohort logs JOB [--rank R] [--tail N] [--since DURATION] [--attempt A] [-f]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

// With -f, how often to look again for a job that is not placed or launched yet.
constexpr auto kLogsRetryInterval = std::chrono::milliseconds(500);
// --tail takes at most this many lines (a larger tail is the whole log: leave --tail out).
constexpr int kMaxTailLines = 1000000;

constexpr const char* kDescription =
    "Prints the output of every rank of a job (stdout and stderr interleaved), each line prefixed\n"
    "\"[rank N]\", one rank after another (interleaved as it arrives with -f). The agent of the rank's\n"
    "node serves it from memory while it holds the job, and from the rank's log files on disk once it\n"
    "restarted or forgot the job, or for an earlier attempt. -o json prints one {job_id, rank, text}\n"
    "object per chunk, one per line.";

constexpr const char* kFooter = R"(examples:
  cohort logs mnist-1
  cohort logs mnist-1 --rank 3 -f
  cohort logs mnist-1 --tail 20 --since 10m
  cohort logs mnist-1 --attempt 1 --rank 0
)";

// The highest rank and attempt numbers the flags accept.
constexpr int kMaxRankFlag = 1 << 20;
constexpr int kMaxAttemptFlag = 1 << 20;

struct Options {
  std::string job_id;
  int rank = 0;
  bool rank_given = false;
  int tail = 0;
  std::string since;
  bool since_given = false;
  int attempt = 0;
  bool follow = false;
};

// "1h30m" → milliseconds. Units s, m, h, d; at least one number-unit pair.
StatusOr<int64_t> parse_duration_ms(const std::string& text) {
  int64_t total = 0;
  size_t i = 0;
  if (text.empty()) return invalid_argument_error("--since needs a duration such as 30s, 10m, 2h or 1h30m");
  while (i < text.size()) {
    size_t digits = i;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    if (digits == i || digits == text.size() || digits - i > 9) {
      return invalid_argument_error("--since {}: write a duration as numbers with units s, m, h, d (30s, 1h30m)",
                                    text);
    }
    const int64_t value = std::stoll(text.substr(i, digits - i));
    int64_t unit = 0;
    switch (text[digits]) {
      case 's': unit = 1000; break;
      case 'm': unit = 60 * 1000; break;
      case 'h': unit = 3600 * 1000; break;
      case 'd': unit = 24 * 3600 * 1000; break;
      default:
        return invalid_argument_error("--since {}: unknown unit '{}'; use s, m, h or d", text, text[digits]);
    }
    total += value * unit;
    i = digits + 1;
  }
  return total;
}

// Writes ranks' output to the context's streams, whole lines at a time when prefixing, so the
// lines of ranks followed at once never mix. Thread-safe.
class LogPrinter {
 public:
  LogPrinter(const CommandContext& context, std::string job_id, bool prefix)
      : context_(context), job_id_(std::move(job_id)), prefix_(prefix) {}

  // Bytes of `rank` as they arrive.
  bool print(int rank, std::string_view bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string& held = held_[rank];
    held.append(bytes);
    size_t complete = 0;
    if (context_.format == OutputFormat::kJson) {
      // A character split across chunks is held back to the next one, so each object's text is whole UTF-8.
      complete = utf8_complete_prefix(held);
      if (complete > 0) print_json_locked(rank, held.substr(0, complete));
    } else if (!prefix_) {
      complete = held.size();
      context_.out->write(held.data(), static_cast<std::streamsize>(held.size()));
    } else {
      const size_t newline = held.rfind('\n');
      complete = newline == std::string::npos ? 0 : newline + 1;
      write_prefixed_locked(rank, std::string_view(held).substr(0, complete));
    }
    held.erase(0, complete);
    context_.out->flush();
    return true;
  }

  // The rank's output ended: print what is held (a last line without a newline, or bytes that
  // end inside a character, which json_quote marks invalid).
  void finish(int rank) {
    std::lock_guard<std::mutex> lock(mu_);
    std::string& held = held_[rank];
    if (held.empty()) return;
    if (context_.format == OutputFormat::kJson) {
      print_json_locked(rank, held);
    } else if (prefix_) {
      write_prefixed_locked(rank, held + "\n");
    } else {
      *context_.out << held;
    }
    held.clear();
    context_.out->flush();
  }

  // The agent keeps only the newest output in memory: say what is missing and where it is.
  void gap(int rank, int64_t skipped, const std::string& log_path, const std::string& node_id) {
    std::lock_guard<std::mutex> lock(mu_);
    *context_.err << fmt::format("[{}{} bytes skipped; the full log is {} on node {}]\n",
                                 prefix_ ? fmt::format("rank {}: ", rank) : "", skipped,
                                 log_path.empty() ? "the rank's log file" : log_path, node_id);
    context_.err->flush();
  }

  void error(int rank, const Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    *context_.err << fmt::format("cohort: rank {}: {}\n", rank, status.message());
    context_.err->flush();
  }

 private:
  void print_json_locked(int rank, const std::string& text) {
    *context_.out << fmt::format("{{\"job_id\": {}, \"rank\": {}, \"text\": {}}}\n", json_quote(job_id_), rank,
                                 json_quote(text));
  }

  void write_prefixed_locked(int rank, std::string_view lines) {
    const std::string prefix = fmt::format("[rank {}] ", rank);
    while (!lines.empty()) {
      const size_t end = lines.find('\n');
      const size_t n = end == std::string_view::npos ? lines.size() : end + 1;
      *context_.out << prefix << lines.substr(0, n);
      lines.remove_prefix(n);
    }
  }

  const CommandContext& context_;
  const std::string job_id_;
  const bool prefix_;
  std::mutex mu_;
  std::map<int, std::string> held_;  // by rank: bytes not printed yet
};

// Reads one rank's output; with `follow`, waits for a queued job or tasks still being launched.
Status read_rank(Client& client, const std::string& job_id, int rank, bool follow, const LogSelection& selection,
                 LogPrinter& printer) {
  while (true) {
    Status status = client.logs(
        job_id, rank, follow, [&](std::string_view bytes) { return printer.print(rank, bytes); }, std::nullopt,
        [&](int64_t skipped, const std::string& log_path, const std::string& node_id) {
          printer.gap(rank, skipped, log_path, node_id);
        },
        selection);
    printer.finish(rank);
    // Following a job that is queued (no placement) or whose tasks are still being launched (the
    // agent does not know it yet): wait for it, unless it ended without ever running.
    const bool not_there_yet =
        status.code() == StatusCode::kFailedPrecondition || status.code() == StatusCode::kNotFound;
    if (status.ok() || !follow || !not_there_yet) return status;
    StatusOr<cohort::v1::JobRecord> job = client.get(job_id);
    if (!job.ok()) return job.status();
    if (is_final_state(job->state())) {
      // It ended between the two calls: say so rather than the stale "not placed yet".
      if (job->placement().nodes_size() == 0) {
        return failed_precondition_error("job {} ended ({}) without running, so it has no logs", job_id,
                                         state_name(job->state()));
      }
      return status;
    }
    std::this_thread::sleep_for(kLogsRetryInterval);
  }
}

int run(const CommandContext& context, const Options& options) {
  LogSelection selection;
  selection.tail_lines = options.tail;
  selection.attempt = options.attempt;
  if (options.since_given) {
    StatusOr<int64_t> since = parse_duration_ms(options.since);
    if (!since.ok()) return usage_error(context, "logs", since.status().message());
    const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    selection.since_unix_ms = std::max<int64_t>(now_ms - *since, 1);
  }
  const std::string& job_id = options.job_id;
  const bool follow = options.follow;
  Client client(context.coordinator, context.client_options);

  if (options.rank_given) {
    LogPrinter printer(context, job_id, /*prefix=*/false);
    Status status = read_rank(client, job_id, options.rank, follow, selection, printer);
    return status.ok() ? kExitOk : report_error(context, status);
  }

  // Every rank: the world comes from the placement, so a followed job must be placed first.
  StatusOr<cohort::v1::JobRecord> job = client.get(job_id);
  while (job.ok() && follow && job->placement().nodes_size() == 0 && !is_final_state(job->state())) {
    std::this_thread::sleep_for(kLogsRetryInterval);
    job = client.get(job_id);
  }
  if (!job.ok()) return report_error(context, job.status());
  const int world_size = job->placement().world_size();
  if (world_size == 0) {
    // Not placed: the per-rank call says why (queued, or ended without running).
    LogPrinter printer(context, job_id, /*prefix=*/true);
    Status status = read_rank(client, job_id, 0, follow, selection, printer);
    return status.ok() ? kExitOk : report_error(context, status);
  }
  LogPrinter printer(context, job_id, /*prefix=*/true);
  std::vector<Status> results(static_cast<size_t>(world_size), ok_status());
  if (follow) {
    std::vector<std::thread> readers;
    for (int r = 0; r < world_size; ++r) {
      readers.emplace_back([&, r] { results[r] = read_rank(client, job_id, r, follow, selection, printer); });
    }
    for (std::thread& reader : readers) reader.join();
  } else {
    for (int r = 0; r < world_size; ++r) results[r] = read_rank(client, job_id, r, false, selection, printer);
  }
  // One rank's missing log (its node is gone) does not hide the others': report each, fail once.
  int failed = 0;
  Status first_error = ok_status();
  for (int r = 0; r < world_size; ++r) {
    if (results[r].ok()) continue;
    if (++failed == 1) first_error = results[r];
    if (world_size > 1) printer.error(r, results[r]);
  }
  if (failed == 0) return kExitOk;
  return world_size > 1 ? kExitFailure : report_error(context, first_error);
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB", options->job_id, "the job's id")->required();
  CLI::Option* rank = app->add_option("-r,--rank", options->rank, "only rank R, without the prefix")
                          ->type_name("R")
                          ->check(CLI::Range(0, kMaxRankFlag));
  app->add_option("-n,--tail", options->tail, "only the last N lines of each rank")
      ->type_name("N")
      ->check(CLI::Range(0, kMaxTailLines));
  CLI::Option* since =
      app->add_option("--since", options->since, "only output written in the last DURATION: 30s, 10m, 2h, 1d, 1h30m")
          ->type_name("DURATION");
  app->add_option("-a,--attempt", options->attempt,
                  "the output of attempt A (default: the newest); earlier attempts are read from disk on the "
                  "node of the newest placement")
      ->type_name("A")
      ->check(CLI::Range(0, kMaxAttemptFlag));
  app->add_flag("-f,--follow", options->follow,
                "keep printing new output until the ranks exit (waits for a queued job)");
  return [options, rank, since](const CommandContext& context) {
    options->rank_given = rank->count() > 0;
    options->since_given = since->count() > 0;
    return run(context, *options);
  };
}

}  // namespace

const Command kLogsCommand = {"logs", "print the output of a job's ranks (-f to follow)", define};

}  // namespace cohort::client::commands
