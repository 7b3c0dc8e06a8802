// cohort run JOB.yaml [--procs N] [--data-dir DIR] [--worker PATH] [--oversubscribe]
//
// The embedded default: an in-process coordinator and agent(s) on this machine, one job, the exit
// status of the job. A job of several nodes gets one in-process agent per node (node ids local-0,
// local-1, ...), so it runs exactly as it would on that many machines.

#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "client/cli/job_follower.h"
#include "client/cli/output.h"
#include "client/cli/worker_locator.h"
#include "client/client.h"
#include "worker/base/credentials_file.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"
#include "client/job_spec_yaml.h"
#include "daemon/agent/node_inventory.h"
#include "daemon/server/daemon_server.h"

namespace cohort::client::commands {
namespace {

int64_t unix_millis_now() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}


using namespace cli;

// The in-process coordinator places and notices exits this often: a short job should not wait a
// whole default tick (1 s) to start or to end.
constexpr auto kRunTickInterval = std::chrono::milliseconds(100);
// Lines of rank 0's output shown when the job did not succeed.
constexpr size_t kFailureTailLines = 20;
// What one machine is asked to host without --oversubscribe: every rank is a process training on
// the machine's cores, and every simulated node an in-process agent with its own gRPC server and
// heartbeats. Beyond these the machine thrashes (load in the hundreds) and heartbeats time out.
constexpr int64_t kMaxLocalRanksPerCore = 4;
constexpr int64_t kMaxLocalNodes = 64;

constexpr const char* kDescription =
    "Runs one job on this machine with no daemon: starts an in-process coordinator and agent (one agent\n"
    "per node of the job, all local), submits the job, shows its progress (a bar on a terminal), prints\n"
    "rank 0's result lines (`test accuracy ...`; for a command job, the last lines of rank 0's output),\n"
    "and exits 0 only if the job SUCCEEDED (3 if it FAILED). A command job (`command:` in the file) runs\n"
    "its own program on every rank and needs no worker binary. -o json / -o yaml print the job's final\n"
    "record instead of the progress.";

constexpr const char* kFooter = R"(examples:
  cohort run configs/jobs/fashion_mnist_dp.yaml
  cohort run job.yaml --procs 4 --data-dir /tmp/run1 --set epochs=1
  COHORT_WORKER=$PWD/bazel-bin/worker/runner/cohort-worker cohort run job.yaml
)";

// Ranks per node --procs accepts.
constexpr int kMaxProcsFlag = 4096;

struct Options {
  std::string file;
  std::vector<std::string> sets;
  int procs = 0;  // 0: the file's procs_per_node
  std::string data_dir;
  std::string worker;
  bool oversubscribe = false;
};

// The job's in-process cluster: a coordinator with node local-0's agent, plus one agent server per
// further node. Shut down in reverse order by the destructor.
class LocalCluster {
 public:
  static StatusOr<std::unique_ptr<LocalCluster>> start(const std::string& data_dir, int nodes,
                                                       int procs_per_node, const std::string& worker) {
    auto cluster = std::unique_ptr<LocalCluster>(new LocalCluster());
    cluster->data_dir_ = data_dir;
    for (int node = 0; node < nodes; ++node) {
      daemon::DaemonServerOptions options;
      options.role = node == 0 ? daemon::DaemonRole::kAll : daemon::DaemonRole::kAgent;
      options.listen = "127.0.0.1:0";
      options.data_dir = node == 0 ? data_dir : fmt::format("{}/node-{}", data_dir, node);
      options.log_dir = fmt::format("{}/logs", data_dir);  // one tree: <job>/rank-<r>.log for every rank
      options.tick_interval = kRunTickInterval;
      options.node_id = fmt::format("local-{}", node);
      options.slots = procs_per_node;
      if (!worker.empty()) options.worker_command = {worker};  // none for a command job
      // Single-user: the only cohort user is the one running `cohort run`, who owns this data
      // directory (its CA key and admin credentials) anyway; run as them, the agent cannot switch.
      options.run_jobs_as_daemon_user = true;
      if (node > 0) {
        // Further nodes join like real ones: with a join token from the in-process coordinator.
        daemon::DaemonServer& coordinator = *cluster->servers_.front();
        options.coordinator_address = coordinator.address();
        COHORT_ASSIGN_OR_RETURN(std::string secret, coordinator.security().identities()->add_join_token(
                                                         std::chrono::hours(1), unix_millis_now()));
        options.join_token = coordinator.security().join_token_text(secret);
      }
      std::error_code ignored;
      std::filesystem::create_directories(options.data_dir, ignored);
      COHORT_ASSIGN_OR_RETURN(std::unique_ptr<daemon::DaemonServer> server,
                              daemon::DaemonServer::start(options));
      cluster->servers_.push_back(std::move(server));
    }
    return cluster;
  }
  ~LocalCluster() {
    for (auto it = servers_.rbegin(); it != servers_.rend(); ++it) (*it)->shutdown();
  }
  const std::string& address() const { return servers_.front()->address(); }
  // The in-process coordinator's first admin (written to its data dir at start): TLS and a token.
  StatusOr<ClientOptions> admin_options() const {
    COHORT_ASSIGN_OR_RETURN(Credentials credentials,
                            load_credentials(data_dir_ + "/" + security::kAdminCredentialsFile));
    ClientOptions options;
    options.security.insecure = false;
    options.security.ca_pem = credentials.ca_certificate;
    options.security.bearer_token = credentials.token;
    return options;
  }

 private:
  LocalCluster() = default;
  std::vector<std::unique_ptr<daemon::DaemonServer>> servers_;
  std::string data_dir_;
};

// While alive, SIGINT and SIGTERM cancel the job instead of killing `cohort run`: the workers run
// in their own process groups, so a killed `cohort run` would leave them behind. The signals are
// blocked before the in-process daemon starts its threads (which inherit the mask) and taken by
// one thread with sigtimedwait; the old mask comes back on destruction.
class InterruptCanceller {
 public:
  InterruptCanceller() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, &old_mask_);
  }
  ~InterruptCanceller() {
    done_ = true;
    if (thread_.joinable()) thread_.join();
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  // Starts watching for the signals; `cancel` runs on the watcher thread at the first one. A
  // second one means "stop now": the watcher restores the default action and re-raises it, which
  // ends `cohort run` (the workers may then be left behind, as the user asked).
  void start(std::function<void(int signal)> cancel) {
    thread_ = std::thread([this, cancel = std::move(cancel)] {
      const timespec poll = {0, 200 * 1000 * 1000};  // how soon the destructor is noticed
      while (!done_) {
        const int signal = sigtimedwait(&signals_, nullptr, &poll);
        if (signal <= 0) continue;
        if (first_signal_ == 0) {
          first_signal_ = signal;
          cancel(signal);
          continue;
        }
        std::signal(signal, SIG_DFL);
        sigset_t just_this;
        sigemptyset(&just_this);
        sigaddset(&just_this, signal);
        pthread_sigmask(SIG_UNBLOCK, &just_this, nullptr);
        raise(signal);  // delivered to this thread, now unblocked: the default action ends the process
      }
    });
  }
  // The first signal taken (0: none yet). Thread-safe.
  int first_signal() const { return first_signal_; }

 private:
  sigset_t signals_;
  sigset_t old_mask_;
  std::atomic<bool> done_{false};
  std::atomic<int> first_signal_{0};
  std::thread thread_;
};

// Removes a temporary data directory when it goes out of scope (early returns included), unless
// keep() was called: a job that ran and failed leaves its logs for the user to read.
class TempDirGuard {
 public:
  explicit TempDirGuard(std::string path) : path_(std::move(path)) {}
  ~TempDirGuard() {
    if (path_.empty() || keep_) return;
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDirGuard(const TempDirGuard&) = delete;
  TempDirGuard& operator=(const TempDirGuard&) = delete;
  void keep() { keep_ = true; }

 private:
  std::string path_;  // empty: nothing to remove (--data-dir)
  bool keep_ = false;
};

// FAILED_PRECONDITION when the job wants more GPUs than this machine has: every local node shares
// the machine's GPUs, so placement would wait PENDING forever.
Status check_local_gpus(const cohort::v1::JobSpec& spec) {
  if (spec.gpus_per_proc() <= 0) return ok_status();
  const int64_t needed = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node() * spec.gpus_per_proc();
  const int64_t available = static_cast<int64_t>(agent::probe_gpus(agent::system_gpu_probe_sources()).size());
  if (needed <= available) return ok_status();
  return failed_precondition_error(
      "the job needs {} GPU(s) (nodes {} x procs_per_node {} x gpus_per_proc {}) but this machine has {}; "
      "lower procs_per_node (--procs) or nodes so it fits, or set gpus_per_proc: 0 to run on CPU",
      needed, spec.nodes(), spec.procs_per_node(), spec.gpus_per_proc(), available);
}

// The cores this process may run on (its affinity mask, which containers and taskset narrow).
int64_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// FAILED_PRECONDITION when the job asks for more simulated nodes or ranks than this machine can
// host (unless --oversubscribe), naming the numbers and the flag. Checked before anything starts.
Status check_local_capacity(const cohort::v1::JobSpec& spec, int64_t cores) {
  if (spec.nodes() > kMaxLocalNodes) {
    return failed_precondition_error(
        "the job asks for {} nodes; cohort run simulates at most {} on one machine (each is an in-process "
        "agent); lower nodes, submit it to a cluster, or pass --oversubscribe to start them anyway",
        spec.nodes(), kMaxLocalNodes);
  }
  const int64_t ranks = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
  const int64_t most = kMaxLocalRanksPerCore * cores;
  if (ranks > most) {
    return failed_precondition_error(
        "the job asks for {} ranks (nodes {} x procs_per_node {}) but this machine has {} core(s), and "
        "cohort run starts at most {} ranks per core ({}); lower procs_per_node (--procs) or nodes, or "
        "pass --oversubscribe to start them anyway",
        ranks, spec.nodes(), spec.procs_per_node(), cores, kMaxLocalRanksPerCore, most);
  }
  return ok_status();
}

// A fresh directory under $TMPDIR (or /tmp).
StatusOr<std::string> make_temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/cohort-run-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return errno_status("mkdtemp(" + pattern + ")", errno);
  // mkdtemp makes it 0700; run as root, the ranks run as the job user (cohort-job), which must
  // pass through it to its job directory and spec. 0711: searchable, not listable.
  if (geteuid() == 0 && chmod(pattern.c_str(), 0711) != 0) return errno_status("chmod(" + pattern + ")", errno);
  return pattern;
}

// The lines of `text` that contain `needle`, or its last `tail` lines when `needle` is empty.
std::vector<std::string> pick_lines(const std::string& text, const std::string& needle, size_t tail) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (needle.empty() || line.find(needle) != std::string::npos) lines.push_back(line);
  }
  if (needle.empty() && lines.size() > tail)
    lines.erase(lines.begin(), lines.end() - static_cast<long>(tail));
  return lines;
}

int run(const CommandContext& context, const Options& options) {
  std::vector<JobSpecOverride> overrides;
  for (const std::string& set : options.sets) {
    StatusOr<JobSpecOverride> override_ = parse_job_spec_override(set);
    if (!override_.ok()) return usage_error(context, "run", override_.status().message());
    overrides.push_back(*std::move(override_));
  }
  StatusOr<cohort::v1::JobSpec> spec = load_job_spec_file(options.file, overrides);
  if (!spec.ok()) return report_error(context, spec.status());
  if (options.procs > 0) spec->set_procs_per_node(options.procs);
  if (spec->nodes() < 1) spec->set_nodes(1);
  if (!options.oversubscribe) {
    if (Status fits = check_local_capacity(*spec, usable_cores()); !fits.ok())
      return report_error(context, fits);
  }
  // A command job runs its own program; only graph jobs need cohort-worker.
  const bool command_job = spec->command_size() > 0;
  StatusOr<std::string> worker = std::string();
  if (!command_job)
    worker = locate_worker(worker_search_from_environment(options.worker, context.program_path));
  if (!worker.ok()) return report_error(context, worker.status());
  if (Status gpus = check_local_gpus(*spec); !gpus.ok()) return report_error(context, gpus);

  // The daemon's own chatter (registrations, placements) is noise here; the job's states are shown.
  if (std::getenv("COHORT_LOG_LEVEL") == nullptr) spdlog::set_level(spdlog::level::warn);
  const bool temporary = options.data_dir.empty();
  std::string data_dir = options.data_dir;
  if (temporary) {
    StatusOr<std::string> made = make_temp_dir();
    if (!made.ok()) return report_error(context, made.status());
    data_dir = *made;
  }
  TempDirGuard temp_dir(temporary ? data_dir : "");
  int exit_status = kExitFailure;
  bool succeeded = false;
  {
    InterruptCanceller interrupts;
    StatusOr<std::unique_ptr<LocalCluster>> cluster =
        LocalCluster::start(data_dir, spec->nodes(), spec->procs_per_node(), *worker);
    if (!cluster.ok())
      return report_error(context, cluster.status().with_context("cannot start the local cohortd"));
    StatusOr<ClientOptions> admin = (*cluster)->admin_options();
    if (!admin.ok()) return report_error(context, admin.status().with_context("the local cohortd's credentials"));
    Client client((*cluster)->address(), *admin);
    // The local agents register as they start: the job waits for them rather than being refused
    // by the coordinator's capacity check.
    StatusOr<std::string> id = client.submit(*spec, /*wait_for_capacity=*/true);
    if (!id.ok()) return report_error(context, id.status());
    interrupts.start([&context, address = (*cluster)->address(), admin = *admin, job_id = *id](int signal) {
      *context.err << "\ncohort: " << strsignal(signal) << ": cancelling job " << job_id << '\n';
      auto cancelled = Client(address, admin).cancel(job_id, fmt::format("cohort run got {}", strsignal(signal)));
      if (!cancelled.ok()) *context.err << "cohort: " << cancelled.status().message() << '\n';
    });
    if (context.human()) {
      *context.out << fmt::format("job {}: {} node(s) x {} rank(s) on this machine, {} {}\n", *id, spec->nodes(),
                                  spec->procs_per_node(), command_job ? "command" : "worker",
                                  command_job ? fmt::format("{}", fmt::join(spec->command(), " ")) : *worker);
    }
    StatusOr<cohort::v1::JobRecord> job = follow_job(client, *id, context);
    if (!job.ok()) return report_error(context, job.status());
    succeeded = job->state() == cohort::v1::SUCCEEDED;
    std::string output;
    Status read = client.logs(*id, /*rank=*/0, /*follow=*/false, [&](std::string_view bytes) {
      output.append(bytes);
      return true;
    });
    if (context.structured()) {
      print_structured(context, to_json(*job));
    } else if (!read.ok()) {
      *context.err << "cohort: cannot read rank 0's output: " << read.message() << '\n';
    } else {
      // cohort-worker's result is its `test accuracy` line; a command's output is its own, so its
      // last lines are shown.
      std::vector<std::string> lines =
          pick_lines(output, succeeded && !command_job ? "test accuracy" : "", kFailureTailLines);
      if (!lines.empty()) *context.out << (succeeded ? "rank 0:\n" : "rank 0's last output:\n");
      for (const std::string& line : lines) *context.out << "  " << line << '\n';
    }
    exit_status = succeeded ? kExitOk : kExitJobFailed;
    // Cancelled by Ctrl-C / SIGTERM: exit as a shell expects of an interrupted command.
    if (job->state() == cohort::v1::CANCELLED && interrupts.first_signal() != 0)
      exit_status = 128 + interrupts.first_signal();
  }
  // The job ran: keep a failed run's directory (its logs explain the failure).
  if (!succeeded) temp_dir.keep();
  if ((!succeeded || !temporary) && context.human())
    *context.out << "rank logs in " << data_dir << "/logs\n";
  return exit_status;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  auto options = std::make_shared<Options>();
  app->add_option("JOB.yaml", options->file, "the job file")->required();
  app->add_option("--set", options->sets,
                  "replace (or add) one field of the file, as `cohort submit --set` (optimizer.lr=0.01); "
                  "repeat for several")
      ->type_name("PATH=VALUE")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app->add_option("-n,--procs", options->procs, "ranks per node (overrides the file's procs_per_node)")
      ->type_name("N")
      ->check(CLI::Range(1, kMaxProcsFlag));
  app->add_option("--data-dir", options->data_dir,
                  "keep the job database and rank logs in DIR (default: a temporary directory, removed "
                  "after a successful run and kept after a failed one)")
      ->type_name("DIR");
  app->add_option("--worker", options->worker,
                  "the worker binary; otherwise $COHORT_WORKER, cohort-worker next to this cohort binary, "
                  "<dir of cohort>/../worker/runner/cohort-worker (bazel-bin), then $PATH")
      ->type_name("PATH");
  app->add_flag("--oversubscribe", options->oversubscribe,
                "start the job even when it asks for more than this machine can host (more than 4 ranks "
                "per core, or more than 64 simulated nodes)");
  return [options](const CommandContext& context) { return run(context, *options); };
}

}  // namespace

const Command kRunCommand = {"run", "run one job on this machine (in-process daemon) and exit with its result",
                             define};

}  // namespace cohort::client::commands
