#pragma once

// PathConfinement: where paths taken from a job spec (checkpoint.dir, dataset.path,
// model_parallel.stages[i].torchscript_file) may point. Workers read and write them as the job's
// user, so a spec must not be able to aim a checkpoint at /etc or a dataset at another user's home.
//
// A path is allowed when it lies under the job's own directory (<data_dir>/jobs/<job_id> on the
// agent; a relative path is taken relative to it) or under one of the configured roots (the daemon
// config's `allowed_path_roots`, by default /usr/share/datasets). The coordinator checks lexically
// at submit time ("..", "." and repeated '/' removed; it cannot see the agents' files); the worker
// checks again with symlinks resolved (std::filesystem::weakly_canonical), and then uses the
// resolved path, so a symlink planted inside a root cannot lead out of it.
//
// The error for a path outside the roots is the same whether or not the path exists, so a
// submitter cannot probe the file system with it.
//
//   PathConfinement confinement;
//   confinement.roots = {"/usr/share/datasets"};
//   StatusOr<std::string> dir = confine_path("checkpoint.dir", "ckpt/../ckpt2", confinement);  // "ckpt2"
//
// Pure functions, except that resolve_symlinks reads the file system; thread-safe.

#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort {

// The default root besides the job's directory: Debian's dataset packages install here.
inline constexpr const char* kDefaultAllowedPathRoot = "/usr/share/datasets";
// The daemon config setting that lists the roots (named in every error, so the fix is one line).
inline constexpr const char* kAllowedPathRootsSetting = "allowed_path_roots";
// The environment variables an agent hands to ranks: the job's directory, and the roots ':'-joined.
inline constexpr const char* kJobDirEnv = "COHORT_JOB_DIR";
inline constexpr const char* kAllowedPathRootsEnv = "COHORT_ALLOWED_PATH_ROOTS";

struct PathConfinement {
  // The job's own directory, absolute; relative spec paths resolve under it. Empty at submit time
  // (not yet known): a relative path is then only checked not to climb out with "..".
  std::string job_dir;
  // Absolute directories (besides job_dir) that spec paths may lie under.
  std::vector<std::string> roots = {kDefaultAllowedPathRoot};
  // Resolve symlinks of the part of the path that exists (the worker); lexical only otherwise.
  bool resolve_symlinks = false;
};

// `path` with ".", ".." and repeated or trailing '/' removed, without touching the file system
// ("/a/./b/../c/" → "/a/c"; "a/../../b" → "../b"; "" → ""). ".." at the root stays at the root.
std::string normalize_path_lexically(const std::string& path);

// Whether normalized absolute `path` is `root` or lies below it ("/data2" is not under "/data").
bool path_is_within(const std::string& path, const std::string& root);

// INVALID_ARGUMENT when a root is empty or not absolute, naming the setting.
Status validate_path_roots(const std::vector<std::string>& roots);

// The confined form of spec path `path` for the field named `field`: normalized, made absolute
// under job_dir when relative (and job_dir is known), symlinks resolved when asked. INVALID_ARGUMENT
// naming the field, the value, the allowed roots and the setting to change when it lies outside
// them (the same message whether or not the path exists).
StatusOr<std::string> confine_path(const std::string& field, const std::string& path,
                                   const PathConfinement& confinement);

// Roots from a ':'-joined list (COHORT_ALLOWED_PATH_ROOTS), empty entries dropped.
std::vector<std::string> split_path_roots(const std::string& joined);

}  // namespace cohort
