#include "daemon/coordinator/job_spec_validation.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cohort::coordinator {

namespace {

// Job names become part of job ids, which appear in URLs (cohort://host:port/<job>) and paths.
constexpr size_t kMaxJobNameLength = 64;

// Collects problems; each one a complete sentence naming the field and value.
class Problems {
 public:
  template <typename... Args>
  void add(fmt::format_string<Args...> format, Args&&... args) {
    list_.push_back(fmt::format(format, std::forward<Args>(args)...));
  }
  void at_least(const char* field, int64_t value, int64_t minimum) {
    if (value < minimum) add("{} is {}; it must be at least {}", field, value, minimum);
  }
  Status status() const {
    if (list_.empty()) return ok_status();
    std::string text = "invalid job spec: ";
    for (size_t i = 0; i < list_.size(); ++i) text += (i == 0 ? "" : "; ") + list_[i];
    return invalid_argument_error("{}", text);
  }

 private:
  std::vector<std::string> list_;
};

void check_name(const std::string& name, Problems& problems) {
  if (name.empty()) {
    problems.add("name is empty; give the job a name of letters, digits, '.', '_' or '-'");
    return;
  }
  if (name.size() > kMaxJobNameLength) {
    problems.add("name '{}' is {} characters; at most {} are allowed", name, name.size(), kMaxJobNameLength);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    if (!std::isalnum(c) && c != '.' && c != '_' && c != '-') {
      problems.add("name '{}' has '{}' at position {}; use letters, digits, '.', '_' or '-'", name, name[i],
                   i);
      return;
    }
  }
}

void check_communicator(const cohort::v1::JobSpec& spec, Problems& problems) {
  const std::string& kind = spec.communicator();
  if (kind.empty()) return;  // the worker chooses
  const bool known = std::any_of(std::begin(kCommunicatorKinds), std::end(kCommunicatorKinds),
                                 [&](const char* k) { return kind == k; });
  if (!known) {
    problems.add("communicator '{}' is not a communicator kind; use one of {}", kind,
                 fmt::join(std::begin(kCommunicatorKinds), std::end(kCommunicatorKinds), ", "));
  } else if (kind == "pure_nccl" && spec.gpus_per_proc() < 1) {
    problems.add(
        "communicator 'pure_nccl' needs GPUs, but gpus_per_proc is {}; set it to at least 1 or "
        "choose flat",
        spec.gpus_per_proc());
  }
}

void check_dataset(const cohort::v1::Dataset& dataset, Problems& problems) {
  switch (dataset.kind()) {
    case cohort::v1::DATASET_KIND_UNSPECIFIED:
      problems.add("dataset.kind is not set; use fashion_mnist, idx_dir or synthetic");
      return;
    case cohort::v1::IDX_DIR:
      if (dataset.path().empty())
        problems.add("dataset.path is empty; idx_dir needs the directory of IDX files");
      break;
    case cohort::v1::SYNTHETIC:
      problems.at_least("dataset.train_size", dataset.train_size(), 1);
      problems.at_least("dataset.num_classes", dataset.num_classes(), 1);
      if (dataset.input_shape().empty()) {
        problems.add("dataset.input_shape is empty; synthetic data needs a sample shape such as [1, 28, 28]");
      }
      for (int i = 0; i < dataset.input_shape_size(); ++i) {
        if (dataset.input_shape(i) < 1) {
          problems.add("dataset.input_shape[{}] is {}; dimensions must be at least 1", i,
                       dataset.input_shape(i));
        }
      }
      break;
    default:
      break;
  }
  problems.at_least("dataset.train_size", dataset.train_size(), 0);
  problems.at_least("dataset.test_size", dataset.test_size(), 0);
}

// Spec paths must lie under the allowed roots (worker/base/path_confinement.h says why). The same
// message whether or not the path exists: nothing here looks at the file system.
void check_path(const char* field, const std::string& path, const PathConfinement& confinement,
                Problems& problems) {
  StatusOr<std::string> confined = confine_path(field, path, confinement);
  if (!confined.ok()) problems.add("{}", confined.status().message());
}

void check_paths(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options,
                 Problems& problems) {
  PathConfinement confinement;
  confinement.roots = options.allowed_path_roots;
  check_path("checkpoint.dir", spec.checkpoint().dir(), confinement, problems);
  check_path("dataset.path", spec.dataset().path(), confinement, problems);
  if (spec.has_model_parallel()) {
    for (int i = 0; i < spec.model_parallel().stages_size(); ++i) {
      const cohort::v1::Stage& stage = spec.model_parallel().stages(i);
      if (stage.body_case() != cohort::v1::Stage::kTorchscriptFile) continue;
      const std::string field = fmt::format("model_parallel.stages[{}].torchscript_file", i);
      check_path(field.c_str(), stage.torchscript_file(), confinement, problems);
    }
  }
}

bool contains(const google::protobuf::RepeatedField<int32_t>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Stage ranks inside the world, and every edge declared at both ends: a stage that receives from a
// rank nobody sends from would wait forever.
void check_model_parallel(const cohort::v1::ModelParallelModel& model, int64_t world_size,
                          Problems& problems) {
  if (model.stages().empty()) {
    problems.add("model_parallel.stages is empty; a model-parallel job needs at least one stage");
    return;
  }
  // A rank may run several stages (in list order), so an edge is matched by any of them.
  auto any_stage_on = [&](int rank, int peer, bool sends) {
    return std::any_of(model.stages().begin(), model.stages().end(), [&](const cohort::v1::Stage& stage) {
      return stage.rank() == rank && contains(sends ? stage.rank_out() : stage.rank_in(), peer);
    });
  };
  auto in_world = [&](int rank) { return rank >= 0 && rank < world_size; };
  for (int i = 0; i < model.stages_size(); ++i) {
    const cohort::v1::Stage& stage = model.stages(i);
    if (stage.body_case() == cohort::v1::Stage::BODY_NOT_SET) {
      problems.add("model_parallel.stages[{}] has neither graph nor torchscript_file", i);
    } else if (stage.has_graph() && stage.graph().layers().empty()) {
      problems.add("model_parallel.stages[{}].graph has no layers", i);
    }
    if (!in_world(stage.rank())) {
      problems.add(
          "model_parallel.stages[{}].rank is {}; the world has ranks 0 .. {} (nodes × procs_per_node)", i,
          stage.rank(), world_size - 1);
      continue;
    }
    for (int j = 0; j < stage.rank_in_size(); ++j) {
      const int src = stage.rank_in(j);
      if (!in_world(src)) {
        problems.add("model_parallel.stages[{}].rank_in[{}] is {}; the world has ranks 0 .. {}", i, j, src,
                     world_size - 1);
      } else if (!any_stage_on(src, stage.rank(), /*sends=*/true)) {
        problems.add("model_parallel.stages[{}].rank_in[{}] is {}, but no stage on rank {} sends to rank {}",
                     i, j, src, src, stage.rank());
      }
    }
    for (int j = 0; j < stage.rank_out_size(); ++j) {
      const int dst = stage.rank_out(j);
      if (!in_world(dst)) {
        problems.add("model_parallel.stages[{}].rank_out[{}] is {}; the world has ranks 0 .. {}", i, j, dst,
                     world_size - 1);
      } else if (!any_stage_on(dst, stage.rank(), /*sends=*/false)) {
        problems.add(
            "model_parallel.stages[{}].rank_out[{}] is {}, but no stage on rank {} receives from rank {}", i,
            j, dst, dst, stage.rank());
      }
    }
  }
}

void check_model(const cohort::v1::JobSpec& spec, Problems& problems) {
  const int64_t world_size = static_cast<int64_t>(spec.nodes()) * spec.procs_per_node();
  switch (spec.model_case()) {
    case cohort::v1::JobSpec::MODEL_NOT_SET:
      problems.add("model is not set; give data_parallel (one graph) or model_parallel (stages)");
      break;
    case cohort::v1::JobSpec::kDataParallel:
      if (spec.data_parallel().graph().layers().empty()) problems.add("data_parallel.graph has no layers");
      break;
    case cohort::v1::JobSpec::kModelParallel:
      if (world_size >= 1) check_model_parallel(spec.model_parallel(), world_size, problems);
      break;
  }
}

void check_optimizer(const cohort::v1::Optimizer& optimizer, Problems& problems) {
  if (optimizer.kind() == cohort::v1::OPTIMIZER_KIND_UNSPECIFIED) {
    problems.add("optimizer.kind is not set; use sgd, momentum or adam");
  }
  if (!(optimizer.lr() > 0)) problems.add("optimizer.lr is {}; it must be positive", optimizer.lr());
  if (optimizer.weight_decay() < 0) {
    problems.add("optimizer.weight_decay is {}; it must not be negative", optimizer.weight_decay());
  }
  if (optimizer.momentum() < 0 || optimizer.momentum() >= 1) {
    problems.add("optimizer.momentum is {}; it must be in [0, 1)", optimizer.momentum());
  }
}

}  // namespace

Status validate_job_spec(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options) {
  Problems problems;
  check_name(spec.name(), problems);
  problems.at_least("nodes", spec.nodes(), 1);
  problems.at_least("procs_per_node", spec.procs_per_node(), 1);
  problems.at_least("batch_size", spec.batch_size(), 1);
  problems.at_least("epochs", spec.epochs(), 1);
  problems.at_least("gpus_per_proc", spec.gpus_per_proc(), 0);
  problems.at_least("restart_policy.max_restarts", spec.restart_policy().max_restarts(), 0);
  if (!spec.checkpoint().dir().empty()) {
    problems.at_least("checkpoint.interval_epochs", spec.checkpoint().interval_epochs(), 1);
  }
  // Without a checkpoint directory there is nothing to resume from: the restart would silently
  // start from scratch, which is not what the spec asked for.
  if (spec.restart_policy().from_checkpoint() && spec.checkpoint().dir().empty()) {
    problems.add(
        "restart_policy.from_checkpoint is true but checkpoint.dir is empty; set checkpoint.dir (e.g. "
        "'checkpoints', inside the job's directory) and checkpoint.interval_epochs, or set "
        "from_checkpoint: false to restart from scratch");
  }
  check_paths(spec, options, problems);
  check_communicator(spec, problems);
  check_dataset(spec.dataset(), problems);
  check_model(spec, problems);
  check_optimizer(spec.optimizer(), problems);
  return problems.status();
}

Status validate_spec_paths(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options) {
  Problems problems;
  check_paths(spec, options, problems);
  return problems.status();
}

}  // namespace cohort::coordinator
