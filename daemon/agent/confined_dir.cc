#include "daemon/agent/confined_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <system_error>

#include <fmt/format.h>

namespace cohort::agent {
namespace {

constexpr int kDirectoryFlags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;

// The error for a failed openat of a component: a link or a non-directory is named as such.
Status component_error(const std::string& path, int err) {
  if (err == ELOOP || err == ENOTDIR) {
    return failed_precondition_error(
        "{} is a symbolic link or not a directory; the agent never follows links in its data directory: "
        "remove it",
        path);
  }
  return errno_status(fmt::format("open({})", path), err);
}

// A name no other writer picks: pid, a per-process counter and a random number.
std::string unique_temp_name(const std::string& name) {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 random{std::random_device{}()};
  return fmt::format(".{}.{}.{}.{:x}.tmp", name, ::getpid(), counter.fetch_add(1), random());
}

}  // namespace

Status validate_path_component(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos || name.size() > NAME_MAX) {
    return invalid_argument_error(
        "{:?} is not a single file name (empty, '.', '..', has '/' or is longer than {} bytes)", name, NAME_MAX);
  }
  return ok_status();
}

StatusOr<ConfinedDir> ConfinedDir::open(const std::string& path, mode_t mode) {
  if (path.empty()) return invalid_argument_error("directory path is empty");
  std::error_code error;
  if (!std::filesystem::exists(path, error)) {
    // Create missing parents one by one so each gets `mode` (create_directories uses the umask).
    std::filesystem::path partial;
    for (const auto& part : std::filesystem::path(path)) {
      partial /= part;
      if (::mkdir(partial.c_str(), mode) == 0) {
        ::chmod(partial.c_str(), mode);  // mkdir applied the umask
      } else if (errno != EEXIST) {
        return errno_status(fmt::format("mkdir({})", partial.string()), errno)
            .with_suffix("; check the agent's data and log directory settings");
      }
    }
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno_status(fmt::format("open({})", path), errno);
  return ConfinedDir(fd, path);
}

ConfinedDir& ConfinedDir::operator=(ConfinedDir&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    path_ = std::move(other.path_);
  }
  return *this;
}

ConfinedDir::~ConfinedDir() {
  if (fd_ >= 0) ::close(fd_);
}

StatusOr<ConfinedDir> ConfinedDir::subdir(const std::vector<std::string>& components, mode_t mode) const {
  int parent = fd_;
  std::string path = path_;
  std::optional<ConfinedDir> current;
  for (const std::string& component : components) {
    COHORT_RETURN_IF_ERROR(validate_path_component(component).with_context(fmt::format("under {}", path)));
    path += "/" + component;
    if (::mkdirat(parent, component.c_str(), mode) != 0 && errno != EEXIST) {
      return errno_status(fmt::format("mkdir({})", path), errno);
    }
    int fd = ::openat(parent, component.c_str(), kDirectoryFlags);
    if (fd < 0) return component_error(path, errno);
    current.emplace(ConfinedDir(fd, path));
    // mkdirat applied the umask, and an existing directory keeps what an older agent gave it.
    COHORT_RETURN_IF_ERROR(current->set_mode(mode));
    parent = fd;
  }
  if (!current.has_value()) return invalid_argument_error("subdir of {}: no path components given", path_);
  return std::move(*current);
}

StatusOr<int> ConfinedDir::open_file(const std::string& name, int flags, mode_t mode) const {
  COHORT_RETURN_IF_ERROR(validate_path_component(name).with_context(fmt::format("under {}", path_)));
  int fd = ::openat(fd_, name.c_str(), flags | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    if (errno == ELOOP) {
      return failed_precondition_error(
          "{}/{} is a symbolic link; the agent never follows links in its data directory: remove it", path_,
          name);
    }
    return errno_status(fmt::format("open({}/{})", path_, name), errno);
  }
  return fd;
}

Status ConfinedDir::write_file_atomically(const std::string& name, std::string_view bytes, mode_t mode,
                                          std::optional<FileOwner> owner) const {
  COHORT_RETURN_IF_ERROR(validate_path_component(name).with_context(fmt::format("under {}", path_)));
  const std::string temp = unique_temp_name(name);
  COHORT_ASSIGN_OR_RETURN(int fd, open_file(temp, O_WRONLY | O_CREAT | O_EXCL, 0600));
  auto fail = [&](const std::string& call, int err) {
    ::close(fd);
    ::unlinkat(fd_, temp.c_str(), 0);
    return errno_status(fmt::format("{}({}/{})", call, path_, temp), err);
  };
  std::string_view rest = bytes;
  while (!rest.empty()) {
    ssize_t n = ::write(fd, rest.data(), rest.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write", errno);
    rest.remove_prefix(static_cast<size_t>(n));
  }
  if (owner.has_value() && ::fchown(fd, owner->uid, owner->gid) != 0) return fail("fchown", errno);
  if (::fchmod(fd, mode) != 0) return fail("fchmod", errno);
  if (::close(fd) != 0) {
    int err = errno;
    ::unlinkat(fd_, temp.c_str(), 0);
    return errno_status(fmt::format("close({}/{})", path_, temp), err);
  }
  // renameat replaces `name` itself, even a link planted there: nothing outside is touched.
  if (::renameat(fd_, temp.c_str(), fd_, name.c_str()) != 0) {
    int err = errno;
    ::unlinkat(fd_, temp.c_str(), 0);
    return errno_status(fmt::format("rename({}/{} to {})", path_, temp, name), err);
  }
  return ok_status();
}

Status ConfinedDir::set_owner(FileOwner owner) const {
  if (::fchown(fd_, owner.uid, owner.gid) != 0) return errno_status(fmt::format("chown({})", path_), errno);
  return ok_status();
}

Status ConfinedDir::set_mode(mode_t mode) const {
  if (::fchmod(fd_, mode) != 0) return errno_status(fmt::format("chmod({})", path_), errno);
  return ok_status();
}

}  // namespace cohort::agent
