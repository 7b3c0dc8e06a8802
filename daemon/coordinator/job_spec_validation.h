#pragma once

// Structural validation of a JobSpec at submit time, before anything is queued: the checks the
// coordinator can make from the spec alone (counts, names, the communicator kind, dataset and model
// presence, model-parallel stage ranks and wiring). Layer-level checks — unknown layer types,
// shapes that do not fit — need the layer zoo's shape inference and belong to worker/graph; the
// gRPC adapter runs both.
//
// Every problem is reported, not only the first, each naming the field path and its value:
//   "nodes is 0; it must be at least 1; communicator 'ring' is not a communicator kind (...)".

#include <string>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "worker/base/path_confinement.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// Communicator kinds by ChainerMN's names, as worker/comm builds them.
inline constexpr const char* kCommunicatorKinds[] = {"naive",           "flat",        "hierarchical",
                                                     "two_dimensional", "single_node", "pure_nccl"};

struct JobSpecValidationOptions {
  // Roots (besides the job's own directory) that checkpoint.dir, dataset.path and
  // torchscript_file may lie under: the daemon config's allowed_path_roots. Checked lexically here
  // (the agents' file systems are not visible); the worker checks again with symlinks resolved.
  std::vector<std::string> allowed_path_roots = {kDefaultAllowedPathRoot};
  // Executables a command job may run (daemon config allowed_commands): absolute paths, compared
  // with command[0] exactly. Empty: any command.
  std::vector<std::string> allowed_commands;
};

// Limits on a command job's argv and environment: together they must fit the kernel's
// ARG_MAX (2 MiB on Linux) with room for the launch environment cohort adds.
inline constexpr int kMaxCommandArguments = 4096;
inline constexpr size_t kMaxCommandBytes = 256 * 1024;  // argv, all strings together
inline constexpr int kMaxEnvVariables = 1024;
inline constexpr size_t kMaxEnvBytes = 256 * 1024;  // env names and values together

// Variables cohort sets on every rank; a spec's `env` may not set them (the launch environment
// would silently win). COHORT_* names are all reserved as well.
inline constexpr const char* kReservedEnvNames[] = {
    "RANK",        "WORLD_SIZE",  "LOCAL_RANK",           "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
    "MASTER_PORT", "GROUP_RANK",  "CUDA_VISIBLE_DEVICES", "TORCHELASTIC_USE_AGENT_STORE"};

// Whether setting `name` can make an allowed program load or run other code: the dynamic loader's
// variables (LD_*, GCONV_PATH, GLIBC_TUNABLES), interpreters' start-up hooks (PYTHON*, PERL*, RUBY*,
// NODE_*, BASH_ENV, ENV, JAVA_TOOL_OPTIONS, ...) and PATH. With allowed_commands set, a spec's env
// may not set them (in graph jobs either), or the list would restrict nothing.
bool is_code_loading_env_name(const std::string& name);

// OK when `allowed_commands` is empty or no name in `env` is_code_loading_env_name;
// INVALID_ARGUMENT naming the variables and the setting otherwise. `where` starts the message.
Status check_env_under_allowed_commands(const std::vector<std::string>& env_names,
                                        const std::vector<std::string>& allowed_commands, const std::string& where);

// OK when `allowed` is empty or holds `command[0]`; INVALID_ARGUMENT naming the list otherwise
// (the agent checks its own list again at launch). `where` starts the message.
Status check_command_allowed(const std::string& executable, const std::vector<std::string>& allowed,
                             const std::string& where);

// OK when every entry of a daemon config's allowed_commands is an absolute, normalized path.
Status validate_allowed_commands(const std::vector<std::string>& allowed);

// OK when checkpoint.dir, dataset.path and every torchscript_file lie under the allowed roots
// (validate_job_spec includes this); INVALID_ARGUMENT listing the paths that do not. Callers that
// look at the files a spec names (does the dataset exist?) check this first, so that the answer
// never tells whether a path outside the roots exists. Pure function; thread-safe.
Status validate_spec_paths(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options = {});

// OK, or INVALID_ARGUMENT listing every problem. Pure function; thread-safe.
Status validate_job_spec(const cohort::v1::JobSpec& spec, const JobSpecValidationOptions& options = {});

}  // namespace cohort::coordinator
