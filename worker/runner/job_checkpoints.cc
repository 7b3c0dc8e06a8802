#include "worker/runner/job_run.h"

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

// JobRun's checkpoints: the multi-node checkpointer over model, optimizer and training iterator,
// its saves at epoch ends, and resume (worker/runner/job_run.h).

namespace cohort::worker::job_run {
namespace {

namespace fs = std::filesystem;

// The checkpoint name when the spec has none.
constexpr const char* kDefaultCheckpointName = "job";

}  // namespace

Status JobRun::open_checkpoint_dir() {
  if (spec_.checkpoint().dir().empty()) return ok_status();
  if (spec_.checkpoint().interval_epochs() < 1) {
    return invalid_argument_error("checkpoint: interval_epochs is {}; it must be >= 1 when dir is set",
                                  spec_.checkpoint().interval_epochs());
  }
  checkpointer_ = train::create_multi_node_checkpointer(
      spec_.name().empty() ? kDefaultCheckpointName : spec_.name(), comm_, spec_.checkpoint().dir());
  if (options_.resume) return ok_status();  // resume() looks at the directory
  // A run that does not resume must not find another run's checkpoints where it will write its
  // own: save() would refuse only at the first checkpoint, after an epoch of training. A relative
  // dir lies in the job's own directory (the ranks' working directory under cohortd), which a new
  // job id gets new, so there only a restarted attempt without restart_policy.from_checkpoint
  // finds files (its earlier attempts'); an explicit shared dir finds any earlier run's.
  const std::string& dir = spec_.checkpoint().dir();
  std::error_code error;
  const fs::path cwd = fs::path(dir).is_relative() ? fs::current_path(error) : fs::path();
  const char* attempt_text = std::getenv("COHORT_ATTEMPT");
  const long attempt = attempt_text != nullptr ? std::strtol(attempt_text, nullptr, 10) : 0;
  if (attempt > 1 && !cwd.empty()) {
    // A restarted attempt told to start from scratch (restart_policy.from_checkpoint: false), in
    // the job's own directory: the files there are this job's earlier attempts', superseded by
    // this one. They go, so its saves are not refused and no later resume loads them.
    COHORT_ASSIGN_OR_RETURN(int removed, checkpointer_->start_over());
    if (removed > 0) {
      spdlog::info("attempt {} starts from scratch (restart_policy.from_checkpoint is false): removed {} checkpoint "
                   "file(s) of earlier attempts from {}",
                   attempt, removed, (cwd / dir).string());
    }
    return ok_status();
  }
  return checkpointer_
      ->check_fresh_start(
          "resume it (COHORT_RESUME=1; under cohortd, restart_policy.from_checkpoint: true resumes "
          "a restarted attempt)")
      .with_context(cwd.empty() ? fmt::format("checkpoint.dir {}", dir)
                                : fmt::format("checkpoint.dir {} (relative to {})", dir, cwd.string()));
}

Status JobRun::create_checkpointer() {
  if (checkpointer_) {
    checkpointer_->add_module("model", *model_.module);
    checkpointer_->add_optimizer("optimizer", *optimizer_);
    checkpointer_->add_iterator("train", *train_batches_);
  }
  return ok_status();
}

Status JobRun::checkpoint_epoch_end(int epoch) {
  if (checkpointer_ && (epoch + 1) % spec_.checkpoint().interval_epochs() == 0) {
    COHORT_RETURN_IF_ERROR(
        checkpointer_->save(step_).with_context(fmt::format("checkpoint of epoch {}", epoch + 1)));
  }
  return ok_status();
}

StatusOr<int64_t> JobRun::resume() {
  if (!options_.resume) return int64_t{0};
  if (checkpointer_ == nullptr) {
    if (is_reporter())
      spdlog::warn("resume requested but the job has no checkpoint.dir; starting from scratch");
    return int64_t{0};
  }
  COHORT_ASSIGN_OR_RETURN(std::optional<int64_t> step, checkpointer_->resume());
  if (!step.has_value()) {
    if (is_reporter()) spdlog::info("no checkpoint in {}; starting from scratch", spec_.checkpoint().dir());
    return int64_t{0};
  }
  result_.resumed_from = *step;
  if (is_reporter()) spdlog::info("resumed from the checkpoint of step {}", *step);
  return *step;
}

}  // namespace cohort::worker::job_run
