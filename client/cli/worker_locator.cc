#include "client/cli/worker_locator.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

namespace cohort::client::cli {
namespace {

// Empty when `path` is an executable regular file; otherwise why not.
std::string rejection(const std::string& path) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) return "does not exist";
  if (!S_ISREG(info.st_mode)) return "is not a file";
  if (::access(path.c_str(), X_OK) != 0) return "is not executable";
  return "";
}

std::string absolute(const std::string& path) {
  std::error_code error;
  std::filesystem::path full = std::filesystem::absolute(path, error);
  return error ? path : full.lexically_normal().string();
}

}  // namespace

WorkerSearch worker_search_from_environment(const std::string& flag, const std::string& program_path) {
  WorkerSearch search;
  search.flag = flag;
  const char* env = std::getenv("COHORT_WORKER");
  search.env = env != nullptr ? env : "";
  search.program_path = program_path;
  const char* path = std::getenv("PATH");
  search.path_env = path != nullptr ? path : "";
  return search;
}

StatusOr<std::string> locate_worker(const WorkerSearch& search) {
  std::vector<std::string> looked;
  auto try_path = [&](const std::string& label, const std::string& path) -> bool {
    const std::string why = rejection(path);
    if (why.empty()) return true;
    looked.push_back(fmt::format("  {}: {} {}", label, path, why));
    return false;
  };
  // An explicit choice that is wrong is an error, not a reason to run some other worker.
  if (!search.flag.empty()) {
    if (try_path("--worker", search.flag)) return absolute(search.flag);
    return not_found_error("the worker given with --worker cannot run:\n{}", looked.front());
  }
  if (!search.env.empty()) {
    if (try_path("$COHORT_WORKER", search.env)) return absolute(search.env);
    return not_found_error("the worker in $COHORT_WORKER cannot run:\n{}", looked.front());
  }
  if (!search.program_path.empty()) {
    const std::filesystem::path dir = std::filesystem::path(search.program_path).parent_path();
    const std::string beside = (dir / kWorkerBinaryName).string();
    if (try_path("next to cohort", beside)) return absolute(beside);
    const std::string bazel = (dir / ".." / "worker" / "runner" / kWorkerBinaryName).lexically_normal().string();
    if (try_path("Bazel layout", bazel)) return absolute(bazel);
  } else {
    looked.push_back("  next to cohort: the running binary's path is unknown");
  }
  size_t start = 0;
  bool any_path_entry = false;
  while (start <= search.path_env.size()) {
    size_t end = search.path_env.find(':', start);
    if (end == std::string::npos) end = search.path_env.size();
    const std::string dir = search.path_env.substr(start, end - start);
    if (!dir.empty()) {
      any_path_entry = true;
      const std::string candidate = (std::filesystem::path(dir) / kWorkerBinaryName).string();
      if (rejection(candidate).empty()) return absolute(candidate);
    }
    start = end + 1;
  }
  looked.push_back(any_path_entry ? fmt::format("  $PATH: no {} in {}", kWorkerBinaryName, search.path_env)
                                  : "  $PATH: empty");
  std::string list;
  for (const std::string& line : looked) list += line + "\n";
  return not_found_error(
      "cannot find the {} binary; looked in:\n{}build it with `bazel build //worker/runner:cohort-worker`, or give "
      "--worker PATH or COHORT_WORKER=PATH",
      kWorkerBinaryName, list);
}

}  // namespace cohort::client::cli
