#include "worker/runner/spec_path_check.h"

#include <cstdlib>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace cohort::worker {

std::optional<PathConfinement> spec_path_confinement_from_environment() {
  const char* job_dir = std::getenv(kJobDirEnv);
  const char* roots = std::getenv(kAllowedPathRootsEnv);
  if (job_dir == nullptr && roots == nullptr) return std::nullopt;
  PathConfinement confinement;
  confinement.job_dir = job_dir != nullptr ? job_dir : "";
  confinement.roots =
      roots != nullptr ? split_path_roots(roots) : std::vector<std::string>{kDefaultAllowedPathRoot};
  confinement.resolve_symlinks = true;
  return confinement;
}

Status confine_spec_paths(cohort::v1::JobSpec& spec, const PathConfinement& confinement) {
  cohort::v1::JobSpec confined = spec;
  std::vector<std::string> problems;
  auto confine = [&](const std::string& field, std::string* path) {
    StatusOr<std::string> resolved = confine_path(field, *path, confinement);
    if (resolved.ok()) {
      *path = *resolved;
    } else {
      problems.push_back(resolved.status().message());
    }
  };
  confine("checkpoint.dir", confined.mutable_checkpoint()->mutable_dir());
  confine("dataset.path", confined.mutable_dataset()->mutable_path());
  if (confined.has_model_parallel()) {
    for (int i = 0; i < confined.model_parallel().stages_size(); ++i) {
      cohort::v1::Stage* stage = confined.mutable_model_parallel()->mutable_stages(i);
      if (stage->body_case() != cohort::v1::Stage::kTorchscriptFile) continue;
      confine(fmt::format("model_parallel.stages[{}].torchscript_file", i),
              stage->mutable_torchscript_file());
    }
  }
  if (!problems.empty()) {
    std::string text;
    for (const std::string& problem : problems) text += (text.empty() ? "" : "; ") + problem;
    return invalid_argument_error("the job spec's paths: {}", text);
  }
  spec = std::move(confined);
  return ok_status();
}

}  // namespace cohort::worker
