// cohort-worker: one training process (one rank) of a cohort job. It reads the job spec, joins
// the job's rendezvous, trains what the spec describes (worker/runner/job_runner.h) and exits 0, or 1
// with a one-line error naming what failed.
//
//   cohort-worker                                      # started by cohortd's agent: all from the environment
//   cohort-worker --job-spec job.yaml --init env://    # torchrun / mpirun / srun variables
//   for r in 0 1; do                                   # two ranks from a shell loop
//     cohort-worker --job-spec job.pbtxt --init "file:///tmp/job-store?rank=$r&world_size=2" &
//   done; wait
//
// main only parses flags; the run itself is run_worker below, training lives in worker/job_runner,
// communication in worker/comm.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include <spdlog/spdlog.h>

#include "worker/base/blas_threads.h"
#include "worker/base/cli_flags.h"
#include "worker/base/cpu_binding.h"
#include "worker/base/logging.h"
#include "worker/base/rank_heartbeat.h"
#include "worker/base/status.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/init/cohort/cohort_init_method.h"
#include "worker/runner/device_selection.h"
#include "worker/runner/job_runner.h"
#include "worker/runner/job_spec_file.h"
#include "worker/runner/metrics_reporter.h"
#include "worker/runner/spec_path_check.h"
#include "worker/runner/worker_info.h"
#include "worker/train/host_allocator.h"

namespace {

constexpr const char* kDescription = R"(cohort-worker is one training process (one rank) of a cohort job. cohortd's agent starts it with no
arguments and the job in its environment; any other launcher (mpirun, srun, a shell loop) can start
it with flags.)";

constexpr const char* kFooter = R"(A job with gpus_per_proc > 0 trains on the rank's GPU (cuda:0 under the agent's CUDA_VISIBLE_DEVICES,
else cuda:LOCAL_RANK mod the GPU count); that needs a cohort-worker built against a CUDA libtorch.

Environment: COHORT_RESUME=1 resumes from the newest checkpoint; COHORT_COORDINATOR, COHORT_JOB_ID
and COHORT_ATTEMPT make rank 0 report metrics to the coordinator; COHORT_LOG_LEVEL sets logging.
COHORT_HEARTBEAT_FILE (set by the agent) is touched every COHORT_HEARTBEAT_INTERVAL_MS (the agent's
task_heartbeat_interval_ms; 2 s without it) so the agent can tell a busy rank from a stopped one. COHORT_JOB_DIR and COHORT_ALLOWED_PATH_ROOTS (set by the agent) confine the spec's checkpoint.dir,
dataset.path and torchscript_file to the job's directory and those roots, symlinks resolved.

example: two ranks on this machine
  for r in 0 1; do
    cohort-worker --job-spec job.yaml --init "file:///tmp/job-store?rank=$r&world_size=2" &
  done; wait)";

struct WorkerFlags {
  std::string job_spec;            // path (or $COHORT_JOB_SPEC)
  std::string init = "env://";     // URL (or $COHORT_INIT)
  std::string communicator;        // kind; "" = the spec's
};

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' ? value : fallback;
}

// Joins the job, trains, reports. Every error says which step failed.
cohort::Status run_worker(WorkerFlags flags) {
  using cohort::Status;
  // Started by an agent: beat from a thread of our own for the whole run, so a long step or a long
  // collective is never taken for a hang, and a stopped or frozen process is.
  std::unique_ptr<cohort::RankHeartbeat> heartbeat = cohort::RankHeartbeat::from_environment();
  if (flags.job_spec.empty()) {
    return cohort::invalid_argument_error("no job spec: pass --job-spec FILE or set COHORT_JOB_SPEC");
  }

  COHORT_ASSIGN_OR_RETURN(cohort::v1::JobSpec spec, cohort::worker::read_job_spec_file(flags.job_spec));
  // Started by an agent: the spec's paths must lie under its allowed roots, symlinks resolved.
  if (std::optional<cohort::PathConfinement> confinement =
          cohort::worker::spec_path_confinement_from_environment())
    COHORT_RETURN_IF_ERROR(cohort::worker::confine_spec_paths(spec, *confinement));
  COHORT_RETURN_IF_ERROR(cohort::comm::register_cohort_init_method());
  // Before joining: a job that asks for GPUs this worker cannot use fails here, naming the fix.
  COHORT_ASSIGN_OR_RETURN(
      c10::Device device,
      cohort::worker::select_device(spec.gpus_per_proc(), cohort::worker::DeviceEnvironment::current()));
  std::string kind = flags.communicator;
  if (kind.empty()) kind = spec.communicator();
  if (kind.empty()) kind = cohort::worker::default_communicator(device);

  // NCCL and staging use the GPU the rank trains on, whichever thread runs the operation.
  cohort::comm::CommunicatorOptions comm_options;
  if (device.is_cuda()) comm_options.cuda_device = device.index();
  auto comm =
      cohort::comm::create_communicator(kind, cohort::comm::InitOptions::from_url(flags.init), comm_options);
  if (!comm.ok()) return comm.status().with_context(fmt::format("joining the job via {}", flags.init));
  // Every rank says it joined and how it ended, so `cohort logs --rank R` shows each rank's part
  // (progress lines come from rank 0 only).
  spdlog::info("rank {} of {} joined via {} ({} communicator, {} rank(s) on this node), training on {}",
               (*comm)->rank(), (*comm)->size(), flags.init, kind, (*comm)->intra_size(), device.str());
  // The ranks on this node share its cores: libtorch's intra-op threads and OpenBLAS's alike
  // (worker/base/blas_threads.h), OMP_NUM_THREADS when the job or the agent set it (the agent's
  // default counts its slots), else this process's CPUs over the node's ranks.
  std::string ignored;
  const int threads = cohort::cpu_threads_for_rank((*comm)->intra_size(), &ignored);
  if (!ignored.empty()) {
    spdlog::warn("OMP_NUM_THREADS='{}' holds no thread count in 1..{}; using {} (this process's CPUs over the {} "
                 "rank(s) on this node)", ignored, cohort::kMaxCpuThreads, threads, (*comm)->intra_size());
  }
  at::set_num_threads(threads);
  cohort::set_openblas_threads(threads);
  if (const char* warning = cohort::blas_threads_warning(threads); *warning != '\0') spdlog::warn("{}", warning);

  std::unique_ptr<cohort::worker::MetricsReporter> reporter;
  if ((*comm)->rank() == 0) reporter = cohort::worker::MetricsReporter::from_environment();
  cohort::worker::JobRunnerOptions options;
  options.resume = env_or("COHORT_RESUME", "") == "1";
  options.metrics = reporter.get();
  options.device = device;
  auto result = cohort::worker::run_job(spec, **comm, options);
  if (!result.ok()) return result.status().with_context(fmt::format("rank {}: training", (*comm)->rank()));
  spdlog::info("rank {} finished after {} step(s)", (*comm)->rank(), result->steps);
  return cohort::ok_status();
}

// The error on one line (flight-recorder dumps span several).
std::string one_line(std::string text) {
  std::replace(text.begin(), text.end(), '\n', ' ');
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  WorkerFlags flags;
  auto app = cohort::cli_flags::make_app("cohort-worker", kDescription);
  // --version also names what it was built against.
  app->set_version_flag("--version", cohort::worker::version_string(),
                        "print the version and what it was built against, and exit");
  app->footer(kFooter);
  app->add_option("--job-spec", flags.job_spec,
                  "the job: .pb (binary cohort.v1.JobSpec), .pbtxt / .textproto (text format) or .yaml / .yml")
      ->type_name("FILE")
      ->envname("COHORT_JOB_SPEC");
  app->add_option("--init", flags.init,
                  "how to join the job: cohort://host:port/JOB?attempt=A&local_rank=L, env:// (MASTER_ADDR, "
                  "MASTER_PORT, RANK, WORLD_SIZE), tcp://host:port?rank=R&world_size=N, "
                  "file:///path?rank=R&world_size=N")
      ->type_name("URL")
      ->envname("COHORT_INIT")
      ->capture_default_str();
  app->add_option("--communicator", flags.communicator,
                  "naive, flat, hierarchical, two_dimensional, single_node, pure_nccl (default: the spec's, "
                  "else pure_nccl when training on a GPU, else flat)")
      ->type_name("KIND");
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
  // Before the dataset and the model allocate: each step's tensors stay in the heap instead of
  // being faulted in again every step (worker/train/host_allocator.h).
  cohort::train::tune_host_allocator();
  if (cohort::Status logging = cohort::init_logging("cohort-worker"); !logging.ok()) {
    std::fprintf(stderr, "cohort-worker: %s\n", logging.message().c_str());
    return 2;
  }
  cohort::Status status = run_worker(flags);
  if (!status.ok()) {
    std::fprintf(stderr, "cohort-worker: %s\n", one_line(status.to_string()).c_str());
    return 1;
  }
  return 0;
}
