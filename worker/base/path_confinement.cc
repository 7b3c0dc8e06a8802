#include "worker/base/path_confinement.h"

#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cohort {

namespace {

namespace fs = std::filesystem;

// The same text for every refusal of one path, whatever the file system holds there.
Status outside_roots_error(const std::string& field, const std::string& path,
                           const PathConfinement& confinement) {
  std::vector<std::string> allowed;
  allowed.push_back(confinement.job_dir.empty() ? "the job's directory (relative paths)"
                                                : fmt::format("the job's directory {}", confinement.job_dir));
  for (const std::string& root : confinement.roots) allowed.push_back(root);
  return invalid_argument_error(
      "{} '{}' lies outside the allowed roots ({}); use a path under one of them (a relative path is "
      "taken inside the job's directory), or ask the operator to add its directory to {} in the "
      "daemon config",
      field, path, fmt::join(allowed, ", "), kAllowedPathRootsSetting);
}

// Symlinks resolved in the part that exists; the rest stays as written (already normalized).
std::string resolve(const std::string& path) {
  std::error_code error;
  fs::path resolved = fs::weakly_canonical(fs::path(path), error);
  if (error) return path;  // unreadable: compare as written; opening it later fails the same way
  return normalize_path_lexically(resolved.string());
}

}  // namespace

std::string normalize_path_lexically(const std::string& path) {
  if (path.empty()) return path;
  const bool absolute = path[0] == '/';
  std::vector<std::string> parts;
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(begin, end - begin);
    begin = end + 1;
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (!parts.empty() && parts.back() != "..") {
        parts.pop_back();
      } else if (!absolute) {
        parts.push_back(part);  // climbs above a relative start: kept so callers can refuse it
      }                         // ".." at "/" stays at "/"
      continue;
    }
    parts.push_back(part);
  }
  std::string out = absolute ? "/" : "";
  for (size_t i = 0; i < parts.size(); ++i) out += (i == 0 ? "" : "/") + parts[i];
  return out.empty() ? "." : out;
}

bool path_is_within(const std::string& path, const std::string& root) {
  if (root == "/") return !path.empty() && path[0] == '/';
  if (path.compare(0, root.size(), root) != 0) return false;
  return path.size() == root.size() || path[root.size()] == '/';
}

Status validate_path_roots(const std::vector<std::string>& roots) {
  for (const std::string& root : roots) {
    if (root.empty() || root[0] != '/') {
      return invalid_argument_error("{}: '{}' is not an absolute directory; list absolute paths such as {}",
                                    kAllowedPathRootsSetting, root, kDefaultAllowedPathRoot);
    }
  }
  return ok_status();
}

StatusOr<std::string> confine_path(const std::string& field, const std::string& path,
                                   const PathConfinement& confinement) {
  if (path.empty()) return path;
  std::string normal = normalize_path_lexically(path);
  const bool relative = normal[0] != '/';
  if (relative) {
    if (normal == ".." || normal.compare(0, 3, "../") == 0)
      return outside_roots_error(field, path, confinement);
    if (confinement.job_dir.empty()) return normal;  // under the job's directory once it exists
    normal = normalize_path_lexically(confinement.job_dir + "/" + normal);
  }
  std::string job_dir = normalize_path_lexically(confinement.job_dir);
  std::vector<std::string> roots;
  for (const std::string& root : confinement.roots) {
    if (!root.empty() && root[0] == '/') roots.push_back(normalize_path_lexically(root));
  }
  if (confinement.resolve_symlinks) {
    normal = resolve(normal);
    if (!job_dir.empty()) job_dir = resolve(job_dir);
    for (std::string& root : roots) root = resolve(root);
  }
  if (!job_dir.empty() && path_is_within(normal, job_dir)) return normal;
  for (const std::string& root : roots) {
    if (path_is_within(normal, root)) return normal;
  }
  return outside_roots_error(field, path, confinement);
}

std::vector<std::string> split_path_roots(const std::string& joined) {
  std::vector<std::string> roots;
  size_t begin = 0;
  while (begin <= joined.size()) {
    size_t end = joined.find(':', begin);
    if (end == std::string::npos) end = joined.size();
    if (end > begin) roots.push_back(joined.substr(begin, end - begin));
    begin = end + 1;
  }
  return roots;
}

}  // namespace cohort
