#include "daemon/coordinator/job_spec_validation.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
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
  check_path("working_dir", spec.working_dir(), confinement, problems);
  if (spec.has_model_parallel()) {
    for (int i = 0; i < spec.model_parallel().stages_size(); ++i) {
      const cohort::v1::Stage& stage = spec.model_parallel().stages(i);
      if (stage.body_case() != cohort::v1::Stage::kTorchscriptFile) continue;
      const std::string field = fmt::format("model_parallel.stages[{}].torchscript_file", i);
      check_path(field.c_str(), stage.torchscript_file(), confinement, problems);
    }
  }
}

bool is_env_name(const std::string& name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0]))) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

bool is_reserved_env_name(const std::string& name) {
  if (name.rfind("COHORT_", 0) == 0) return true;
  return std::any_of(std::begin(kReservedEnvNames), std::end(kReservedEnvNames),
                     [&](const char* reserved) { return name == reserved; });
}

// `env` applies to graph and command jobs alike.
void check_env(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options, Problems& problems) {
  if (spec.env_size() > kMaxEnvVariables) {
    problems.add("env has {} variables; at most {} (kMaxEnvVariables) are allowed", spec.env_size(),
                 kMaxEnvVariables);
  }
  size_t bytes = 0;
  std::vector<std::string> names;
  for (const auto& [name, value] : spec.env()) names.push_back(name);
  std::sort(names.begin(), names.end());  // a map's order is random; problems come out stable
  for (const std::string& name : names) {
    const std::string& value = spec.env().at(name);
    bytes += name.size() + value.size() + 2;
    if (!is_env_name(name)) {
      problems.add("env.{:?} is not a variable name; use letters, digits and '_', not starting with a digit",
                   name);
    } else if (is_reserved_env_name(name)) {
      problems.add(
          "env.{} is set by cohort on every rank (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK, "
          "MASTER_ADDR, MASTER_PORT, CUDA_VISIBLE_DEVICES and COHORT_* are reserved); remove it from env",
          name);
    }
    if (value.find('\0') != std::string::npos) problems.add("env.{} holds a NUL byte; remove it", name);
  }
  if (bytes > kMaxEnvBytes) {
    problems.add("env holds {} bytes; at most {} (kMaxEnvBytes) are allowed", bytes, kMaxEnvBytes);
  }
  if (Status loading = check_env_under_allowed_commands(names, options.allowed_commands, "env"); !loading.ok())
    problems.add("{}", loading.message());
}

// The fields only cohort-worker reads: a command job must leave them unset, or the user would
// believe they take effect.
std::vector<std::string> graph_fields_set(const cohort::v1::JobSpec& spec) {
  std::vector<std::string> set;
  if (spec.model_case() != cohort::v1::JobSpec::MODEL_NOT_SET)
    set.push_back(spec.has_data_parallel() ? "data_parallel" : "model_parallel");
  if (spec.has_dataset()) set.push_back("dataset");
  if (!spec.loss().empty()) set.push_back("loss");
  if (spec.has_optimizer()) set.push_back("optimizer");
  if (spec.batch_size() != 0) set.push_back("batch_size");
  if (spec.epochs() != 0) set.push_back("epochs");
  if (spec.has_checkpoint()) set.push_back("checkpoint");
  if (!spec.communicator().empty()) set.push_back("communicator");
  return set;
}

void check_command(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options,
                   Problems& problems) {
  if (std::vector<std::string> set = graph_fields_set(spec); !set.empty()) {
    problems.add(
        "command is set, and so is {}: a job runs either its own command or a model that cohort-worker "
        "trains, never both; remove {} (a command job picks its communicator, data and model in its own code)",
        fmt::join(set, ", "), set.size() == 1 ? "it" : "them");
  }
  if (spec.command_size() > kMaxCommandArguments) {
    problems.add("command has {} arguments; at most {} (kMaxCommandArguments) are allowed", spec.command_size(),
                 kMaxCommandArguments);
  }
  size_t bytes = 0;
  for (int i = 0; i < spec.command_size(); ++i) {
    bytes += spec.command(i).size() + 1;
    if (spec.command(i).find('\0') != std::string::npos) problems.add("command[{}] holds a NUL byte", i);
  }
  if (bytes > kMaxCommandBytes) {
    problems.add("command holds {} bytes; at most {} (kMaxCommandBytes) are allowed", bytes, kMaxCommandBytes);
  }
  const std::string& executable = spec.command(0);
  if (executable.empty()) {
    problems.add("command[0] is empty; give the program to run, e.g. command: [/usr/bin/python3, train.py]");
    return;
  }
  if (executable.find_first_of(" \t") != std::string::npos && spec.command_size() == 1) {
    std::vector<std::string> words;
    std::istringstream in(executable);
    for (std::string word; in >> word;) words.push_back(word);
    problems.add(
        "command[0] is {:?}, a whole command line in one string; command is a list of arguments, run "
        "without a shell: write command: [{}]",
        executable, fmt::join(words, ", "));
  }
  if (Status allowed = check_command_allowed(executable, options.allowed_commands, "command[0]"); !allowed.ok())
    problems.add("{}", allowed.message());
}

bool contains(const google::protobuf::RepeatedField<int32_t>& ranks, int rank) {
  return std::find(ranks.begin(), ranks.end(), rank) != ranks.end();
}

// Stage ranks inside the world, and every edge declared at both ends: a stage that receives from a
// rank nobody sends from would wait forever. What a rank's MultiNodeChainList refuses when the
// stage is added is refused here too, so the job fails at submit instead of on every worker: an
// edge to the stage's own rank, and a second stage on one rank without rank_out (a rank's chain
// has one output; a stage without rank_out need not be its last, as in ChainerMN's
// NonConnectedGraph2). Orders that cannot complete are graph::validate_model's to find.
void check_model_parallel(const cohort::v1::ModelParallelModel& model, int64_t world_size,
                          Problems& problems) {
  if (model.stages().empty()) {
    problems.add("model_parallel.stages is empty; a model-parallel job needs at least one stage");
    return;
  }
  std::map<int, int> output_stage;  // rank → its stage without rank_out
  for (int i = 0; i < model.stages_size(); ++i) {
    const cohort::v1::Stage& stage = model.stages(i);
    for (int j = 0; j < stage.rank_in_size(); ++j) {
      if (stage.rank_in(j) == stage.rank()) {
        problems.add(
            "model_parallel.stages[{}].rank_in[{}] is {}, the stage's own rank; a stage receives from another "
            "rank (run the two computations in one stage instead)",
            i, j, stage.rank());
      }
    }
    for (int j = 0; j < stage.rank_out_size(); ++j) {
      if (stage.rank_out(j) == stage.rank()) {
        problems.add(
            "model_parallel.stages[{}].rank_out[{}] is {}, the stage's own rank; a stage sends to another rank "
            "(run the two computations in one stage instead)",
            i, j, stage.rank());
      }
    }
    if (stage.rank_out().empty()) {
      auto [first, inserted] = output_stage.emplace(stage.rank(), i);
      if (!inserted) {
        problems.add(
            "model_parallel.stages[{}] and stages[{}] both run on rank {} without rank_out; a rank's stages "
            "give one output (to the loss): send one of them on with rank_out, or merge them",
            first->second, i, stage.rank());
      }
    }
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
  problems.at_least("gpus_per_proc", spec.gpus_per_proc(), 0);
  problems.at_least("restart_policy.max_restarts", spec.restart_policy().max_restarts(), 0);
  check_env(spec, options, problems);
  check_paths(spec, options, problems);
  if (spec.command_size() > 0) {
    // The program's own data, model and checkpoints are its business; from_checkpoint only says
    // whether COHORT_RESUME is set on a restart.
    check_command(spec, options, problems);
    return problems.status();
  }
  problems.at_least("batch_size", spec.batch_size(), 1);
  problems.at_least("epochs", spec.epochs(), 1);
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
  check_communicator(spec, problems);
  check_dataset(spec.dataset(), problems);
  check_model(spec, problems);
  check_optimizer(spec.optimizer(), problems);
  return problems.status();
}

bool is_code_loading_env_name(const std::string& name) {
  static constexpr const char* kPrefixes[] = {"LD_", "PYTHON", "PERL", "RUBY", "NODE_", "LUA_", "JAVA_", "_JAVA_"};
  static constexpr const char* kNames[] = {"PATH",     "GCONV_PATH", "GLIBC_TUNABLES",    "BASH_ENV", "ENV",
                                           "LOCPATH",  "NLSPATH",    "JAVA_TOOL_OPTIONS", "CLASSPATH",
                                           "TCLLIBPATH", "OPENSSL_CONF", "OPENSSL_ENGINES"};
  for (const char* prefix : kPrefixes) {
    if (name.rfind(prefix, 0) == 0) return true;
  }
  return std::any_of(std::begin(kNames), std::end(kNames), [&](const char* n) { return name == n; });
}

Status check_env_under_allowed_commands(const std::vector<std::string>& env_names,
                                        const std::vector<std::string>& allowed_commands, const std::string& where) {
  if (allowed_commands.empty()) return ok_status();
  std::vector<std::string> loading;
  for (const std::string& name : env_names) {
    if (is_code_loading_env_name(name)) loading.push_back(name);
  }
  if (loading.empty()) return ok_status();
  std::sort(loading.begin(), loading.end());
  return invalid_argument_error(
      "{} sets {}, which would make an allowed program load or run other code; this cluster restricts what "
      "runs (daemon config allowed_commands), so a job may not set the loader's, interpreters' or PATH "
      "variables; remove them, or ask an admin",
      where, fmt::join(loading, ", "));
}

Status check_command_allowed(const std::string& executable, const std::vector<std::string>& allowed,
                             const std::string& where) {
  if (allowed.empty()) return ok_status();
  if (std::find(allowed.begin(), allowed.end(), executable) != allowed.end()) return ok_status();
  return invalid_argument_error(
      "{} {:?} is not an allowed command; this cluster runs only these executables (daemon config "
      "allowed_commands): {}{}; ask an admin to add it",
      where, executable, fmt::join(allowed, ", "),
      executable.empty() || executable.front() != '/' ? " (give the absolute path)" : "");
}

Status validate_allowed_commands(const std::vector<std::string>& allowed) {
  for (const std::string& path : allowed) {
    if (path.empty() || path.front() != '/' || path.find("/./") != std::string::npos ||
        path.find("/../") != std::string::npos || path.back() == '/') {
      return invalid_argument_error(
          "allowed_commands entry {:?} is not an absolute path to an executable; write paths such as "
          "/usr/bin/python3",
          path);
    }
  }
  return ok_status();
}

Status validate_spec_paths(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options) {
  Problems problems;
  check_paths(spec, options, problems);
  return problems.status();
}

}  // namespace cohort::coordinator
