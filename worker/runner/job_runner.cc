#include "worker/runner/job_runner.h"

#include <algorithm>
#include <exception>
#include <string>

#include <fmt/format.h>

#include "worker/graph/shape_inference.h"
#include "worker/runner/job_run.h"

// run_job and the order of a run's phases; the phases themselves are in job_data.cc,
// job_model.cc, job_loop.cc, job_evaluation.cc and job_checkpoints.cc (worker/runner/job_run.h).

namespace cohort::worker {
namespace job_run {
namespace {

bool has_layer(const v1::Graph& graph, const std::string& type) {
  return std::any_of(graph.layers().begin(), graph.layers().end(),
                     [&](const v1::Layer& layer) { return layer.type() == type; });
}

}  // namespace

Status agree(comm::Communicator& comm, const Status& local, const char* what) {
  COHORT_ASSIGN_OR_RETURN(double failed, comm.allreduce_obj(local.ok() ? 0.0 : 1.0, comm::ReduceOp::kMax));
  if (!local.ok()) return local;
  if (failed > 0) return aborted_error("{} failed on another rank (its log says why)", what);
  return ok_status();
}

Status JobRun::setup() {
  if (spec_.batch_size() < 1)
    return invalid_argument_error("batch_size is {}; it must be >= 1", spec_.batch_size());
  if (spec_.epochs() < 1) return invalid_argument_error("epochs is {}; it must be >= 1", spec_.epochs());
  COHORT_ASSIGN_OR_RETURN(loss_, parse_loss(spec_.loss()));
  // The coordinator validated the spec already, but a worker started by hand (mpirun, a shell
  // loop) gets the same layer-by-layer shape errors here instead of a libtorch exception at step
  // 0. Deterministic, so every rank fails alike; files are checked where they are read instead.
  graph::ModelValidationOptions validation;
  validation.check_stage_ranks = false;  // against the real world size below
  validation.check_files = false;
  COHORT_RETURN_IF_ERROR(graph::validate_model(spec_, validation));
  switch (spec_.model_case()) {
    case v1::JobSpec::kDataParallel:
      // ParallelConvolution2D needs the same input on every rank: such graphs see broadcast batches.
      sharded_ = !has_layer(spec_.data_parallel().graph(), "parallel_conv2d");
      break;
    case v1::JobSpec::kModelParallel:
      sharded_ = false;
      break;
    default:
      return invalid_argument_error("model: neither data_parallel nor model_parallel is set");
  }
  // Before the dataset and the model: a checkpoint directory that refuses this run costs nothing.
  COHORT_RETURN_IF_ERROR(open_checkpoint_dir());
  COHORT_RETURN_IF_ERROR(load_data());
  COHORT_RETURN_IF_ERROR(build_model());
  COHORT_RETURN_IF_ERROR(build_optimizer());
  return create_checkpointer();
}

StatusOr<JobResult> JobRun::run() {
  int epoch = 0;
  try {
    COHORT_RETURN_IF_ERROR(setup());
    COHORT_ASSIGN_OR_RETURN(step_, resume());
    result_.steps_per_epoch = steps_per_epoch_;
    // Checkpoints are written at epoch ends, so a resumed step starts an epoch.
    for (epoch = static_cast<int>(step_ / steps_per_epoch_); epoch < spec_.epochs(); ++epoch) {
      step_ = epoch * steps_per_epoch_;
      COHORT_RETURN_IF_ERROR(train_epoch(epoch));
      COHORT_RETURN_IF_ERROR(checkpoint_epoch_end(epoch));
    }
    if (result_.epochs.empty()) {
      // Resumed after the last epoch: evaluate once so the result (and the final line) exist.
      COHORT_RETURN_IF_ERROR(evaluate(spec_.epochs() - 1, 0, 0, 0, 0));
    }
  } catch (const std::exception& e) {
    return internal_error("training failed in epoch {} at step {}: {}", epoch + 1, step_, e.what());
  }
  result_.steps = step_;
  print(fmt::format("test accuracy {:.4f}", result_.test_accuracy));
  return result_;
}

}  // namespace job_run

StatusOr<JobResult> run_job(const v1::JobSpec& spec, comm::Communicator& comm,
                            const JobRunnerOptions& options) {
  job_run::JobRun run(spec, comm, options);
  return run.run();
}

}  // namespace cohort::worker
