#include "daemon/agent/task_cgroups.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace cohort::agent {
namespace {

// How often a wait for a killed cgroup to empty looks again, and how often it kills again (the
// fallback's single pass may miss a process that was forking as the freeze began).
constexpr std::chrono::milliseconds kEmptyPollInterval = std::chrono::milliseconds(5);
constexpr std::chrono::milliseconds kKillRepeatInterval = std::chrono::milliseconds(100);
// How many times open() tries to make its directories: another agent's TaskCgroups destructor may
// remove an empty cohort-tasks between this one's two mkdirs.
constexpr int kMakeDirectoryTries = 3;
// The agent key's readable part in a directory name (cgroup names, like file names, are at most
// 255 bytes).
constexpr size_t kMaxReadableKeyLength = 100;

// Reads a whole file: open(O_CLOEXEC) and read rather than std::ifstream, whose descriptor would
// leak into a child that another thread forks meanwhile (the launcher forks on its own thread).
// `dir_fd` AT_FDCWD: `path` as given; otherwise relative to that directory. "" when unreadable.
std::string read_all_at(int dir_fd, const std::string& path) {
  const int fd = ::openat(dir_fd, path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  char buffer[4096];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

std::string read_all(const std::string& path) { return read_all_at(AT_FDCWD, path); }

// Writes `value` to a cgroup file (`name` relative to `dir_fd`); 0, or the errno.
int write_at(int dir_fd, const char* name, std::string_view value) {
  const int fd = ::openat(dir_fd, name, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const ssize_t n = ::write(fd, value.data(), value.size());
  const int write_errno = errno;
  ::close(fd);
  return n == static_cast<ssize_t>(value.size()) ? 0 : (write_errno != 0 ? write_errno : EIO);
}

// A "key value" line of a flat keyed file (cgroup.events); -1 when absent.
long keyed_value(const std::string& text, std::string_view key) {
  std::istringstream lines(text);
  std::string name;
  long value = 0;
  while (lines >> name >> value) {
    if (name == key) return value;
  }
  return -1;
}

std::vector<pid_t> read_pids_at(int dir_fd) {
  std::vector<pid_t> pids;
  std::istringstream lines(read_all_at(dir_fd, "cgroup.procs"));
  long pid = 0;
  while (lines >> pid) pids.push_back(static_cast<pid_t>(pid));
  return pids;
}

std::string join_pids(const std::vector<pid_t>& pids) {
  std::string text;
  for (pid_t pid : pids) text += fmt::format("{}{}", text.empty() ? "" : " ", pid);
  return text;
}

bool exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;
}

// mountinfo escapes blanks and backslashes in paths as \ooo.
std::string unescape_mount_path(const std::string& field) {
  std::string result;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      result.push_back(static_cast<char>(std::strtol(field.substr(i + 1, 3).c_str(), nullptr, 8)));
      i += 3;
    } else {
      result.push_back(field[i]);
    }
  }
  return result;
}

// mkdir that accepts an existing directory: 0, or the errno.
int make_directory(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return 0;
  return errno;
}

bool valid_cgroup_name(const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.size() > 255) return false;
  for (char c : name) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                         c == '.' || c == '_' || c == '-';
    if (!allowed) return false;
  }
  return true;
}

}  // namespace

StatusOr<std::string> own_cgroup_directory(const std::string& mountinfo_path,
                                           const std::string& self_cgroup_path) {
  // "0::<path>": the process's cgroup in the v2 hierarchy (the v1 lines have a controller list).
  std::string own;
  bool found_own = false;
  std::istringstream cgroup_lines(read_all(self_cgroup_path));
  for (std::string line; std::getline(cgroup_lines, line);) {
    if (line.rfind("0::", 0) == 0) {
      own = line.substr(3);
      found_own = true;
      break;
    }
  }
  if (!found_own || own.empty() || own[0] != '/') {
    return failed_precondition_error(
        "no cgroup v2 line (\"0::/...\") in {}: this kernel has no cgroup v2 hierarchy", self_cgroup_path);
  }
  // Inside a cgroup namespace the path is relative to the namespace's root, and a process that was
  // moved out of that root shows as "/../<elsewhere>": not below any mount this process sees, and
  // joined with a mount point it would name a directory outside the hierarchy.
  for (size_t start = 0; start < own.size();) {
    const size_t end = std::min(own.find('/', start), own.size());
    if (own.compare(start, end - start, "..") == 0) {
      return failed_precondition_error(
          "the agent's cgroup {} (from {}) lies outside the root of the cgroup namespace it runs in (a \"..\" "
          "component): it cannot be reached below the cgroup2 mount. Start the agent inside its cgroup "
          "namespace's root (or in no cgroup namespace of its own)",
          own, self_cgroup_path);
    }
    start = end + 1;
  }
  // "<id> <parent> <major:minor> <root> <mount point> <options> [optional fields] - <type> <source> <super
  // options>"
  std::istringstream mount_lines(read_all(mountinfo_path));
  bool any_cgroup2 = false;
  for (std::string line; std::getline(mount_lines, line);) {
    const size_t separator = line.find(" - ");
    if (separator == std::string::npos) continue;
    std::istringstream after(line.substr(separator + 3));
    std::string type;
    after >> type;
    if (type != "cgroup2") continue;
    any_cgroup2 = true;
    std::istringstream before(line.substr(0, separator));
    std::string id, parent, device, root, mount_point;
    if (!(before >> id >> parent >> device >> root >> mount_point)) continue;
    root = unescape_mount_path(root);
    mount_point = unescape_mount_path(mount_point);
    // The mount shows the hierarchy from `root` down: the agent's cgroup must be inside it.
    std::string relative;
    if (root == "/") {
      relative = own;
    } else if (own == root) {
      relative = "/";
    } else if (own.rfind(root + "/", 0) == 0) {
      relative = own.substr(root.size());
    } else {
      continue;
    }
    if (relative == "/") return mount_point;
    return (mount_point == "/" ? std::string() : mount_point) + relative;
  }
  if (!any_cgroup2) {
    return failed_precondition_error(
        "no cgroup2 file system in {} (looked for /sys/fs/cgroup on a cgroup v2 host, /sys/fs/cgroup/unified "
        "on a "
        "hybrid one); boot with systemd.unified_cgroup_hierarchy=1, or mount one: mount -t cgroup2 none "
        "/sys/fs/cgroup/unified",
        mountinfo_path);
  }
  return failed_precondition_error(
      "the agent's cgroup {} (from {}) is not inside any cgroup2 mount in {} (a mount of a subtree that does "
      "not "
      "hold it)",
      own, self_cgroup_path, mountinfo_path);
}

std::string cgroup_name_for(const std::string& key) {
  // FNV-1a, 64 bits: stable across runs and builds (std::hash is not), so a restarted agent finds
  // its directory again.
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : key) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  std::string readable;
  for (char c : key) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                         c == '.' || c == '_' || c == '-';
    readable.push_back(allowed ? c : '-');
  }
  const size_t first = readable.find_first_not_of("-.");
  readable = first == std::string::npos ? std::string() : readable.substr(first);
  if (readable.size() > kMaxReadableKeyLength)
    readable = readable.substr(readable.size() - kMaxReadableKeyLength);
  return fmt::format("{}{}{:016x}", readable, readable.empty() ? "" : "-", hash);
}

TaskCgroup::TaskCgroup(std::string path, int dir_fd, int procs_fd, bool owned, bool use_cgroup_kill,
                       std::chrono::milliseconds empty_timeout)
    : path_(std::move(path)),
      dir_fd_(dir_fd),
      procs_fd_(procs_fd),
      owned_(owned),
      use_cgroup_kill_(use_cgroup_kill),
      empty_timeout_(empty_timeout) {
  if (dir_fd_ < 0) removed_.store(true);
}

TaskCgroup::~TaskCgroup() {
  // Only a cgroup create() made is this object's to remove; the ones opened for a look or a kill
  // of an existing directory (create's check of a name, remove_leftovers) are not. Usually removed
  // already when its task ended (TaskSupervisor); a launch that failed, a handle dropped without a
  // reap, or a task that never reached the supervisor end here.
  if (owned_ && !removed_.load()) kill_and_remove().ignore_error();
  if (procs_fd_ >= 0) ::close(procs_fd_);
  if (dir_fd_ >= 0) ::close(dir_fd_);
}

Status TaskCgroup::kill() const {
  return kill_until(std::chrono::steady_clock::now() + empty_timeout_);
}

Status TaskCgroup::kill_until(std::chrono::steady_clock::time_point deadline) const {
  // A removed cgroup has nothing left to kill; its descriptor reaches no file (ENOENT) either, so
  // a kill racing with the removal cannot reach a newer cgroup of the same name.
  if (removed_.load()) return ok_status();
  // One that refuses the write (no cgroup.kill before 5.14) gets the fallback.
  if (use_cgroup_kill_) {
    const int err = write_at(dir_fd_, "cgroup.kill", "1");
    if (err == 0 || err == ENOENT || err == ENODEV) return ok_status();
  }
  // The fallback for kernels before 5.14: freeze first, so no process forks a new one between the
  // read of cgroup.procs and the kills (cgroup.freeze, 5.2+; without it the kill repeats in
  // kill_and_remove until the cgroup is empty). A frozen process still dies of SIGKILL.
  const bool frozen = write_at(dir_fd_, "cgroup.freeze", "1") == 0;
  if (frozen) {
    while (std::chrono::steady_clock::now() < deadline) {
      const std::string events = read_all_at(dir_fd_, "cgroup.events");
      if (events.empty() || keyed_value(events, "frozen") == 1 || keyed_value(events, "populated") == 0)
        break;
      std::this_thread::sleep_for(kEmptyPollInterval);
    }
  }
  for (pid_t pid : read_pids_at(dir_fd_)) ::kill(pid, SIGKILL);
  if (frozen) write_at(dir_fd_, "cgroup.freeze", "0");
  return ok_status();
}

bool TaskCgroup::populated() const {
  // A removed cgroup (no cgroup.events) holds nothing.
  if (removed_.load()) return false;
  return keyed_value(read_all_at(dir_fd_, "cgroup.events"), "populated") == 1;
}

Status TaskCgroup::kill_and_remove(std::chrono::steady_clock::time_point deadline) const {
  if (removed_.load()) return ok_status();
  const auto start = std::chrono::steady_clock::now();
  // One bound for the kills (the fallback's freeze waits) and the wait together.
  const auto end = std::min(deadline, start + empty_timeout_);
  COHORT_RETURN_IF_ERROR(kill_until(end));
  auto last_kill = std::chrono::steady_clock::now();
  while (populated()) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= end) {
      const std::string pids = join_pids(read_pids_at(dir_fd_));
      return deadline_exceeded_error(
          "cgroup {} still holds pids {} {} ms after SIGKILL; they are probably stuck in the kernel "
          "(uninterruptible sleep on a hung mount or driver): check `ps -o pid,stat,wchan -p {}`. The agent "
          "removes the cgroup at its next start",
          path_, pids, std::chrono::duration_cast<std::chrono::milliseconds>(now - start).count(), pids);
    }
    if (now - last_kill >= kKillRepeatInterval) {
      kill_until(end).ignore_error();
      last_kill = now;
    }
    std::this_thread::sleep_for(kEmptyPollInterval);
  }
  // rmdir takes a path: only while the path still names this cgroup (the same inode as the
  // descriptor). Gone, or another cgroup of that name now: this one was removed already. (A name
  // made again between this look and the rmdir would have to be created within that instant, and
  // the rmdir of a cgroup its task has entered fails.)
  struct stat mine {};
  struct stat named {};
  if (::fstat(dir_fd_, &mine) != 0 || ::lstat(path_.c_str(), &named) != 0 || mine.st_ino != named.st_ino ||
      mine.st_dev != named.st_dev) {
    removed_.store(true);
    return ok_status();
  }
  if (::rmdir(path_.c_str()) != 0 && errno != ENOENT)
    return errno_status(fmt::format("rmdir({})", path_), errno);
  removed_.store(true);
  return ok_status();
}

TaskCgroups::TaskCgroups(std::string path, bool use_cgroup_kill, std::chrono::milliseconds empty_timeout)
    : path_(std::move(path)), use_cgroup_kill_(use_cgroup_kill), empty_timeout_(empty_timeout) {}

TaskCgroups::~TaskCgroups() {
  // Both fail (EBUSY) while a cgroup is left in them: a task's that would not empty, or another
  // agent's directory in cohort-tasks.
  ::rmdir(path_.c_str());
  const size_t slash = path_.rfind('/');
  if (slash != std::string::npos && slash > 0) ::rmdir(path_.substr(0, slash).c_str());
}

StatusOr<std::shared_ptr<TaskCgroups>> TaskCgroups::open(const TaskCgroupsOptions& options) {
  if (options.agent_key.empty()) {
    return invalid_argument_error("task cgroups: agent_key is empty; give the agent's data directory");
  }
  if (options.empty_timeout.count() <= 0) {
    return invalid_argument_error("task cgroups: empty_timeout is {} ms; it must be positive",
                                  options.empty_timeout.count());
  }
  COHORT_ASSIGN_OR_RETURN(std::string own,
                          own_cgroup_directory(options.mountinfo_path, options.self_cgroup_path));
  const std::string base = own + "/" + kTaskCgroupsDirectory;
  const std::string path = base + "/" + cgroup_name_for(options.agent_key);
  int made = 0;
  std::string failed_path;
  for (int attempt = 0; attempt < kMakeDirectoryTries; ++attempt) {
    failed_path = base;
    made = make_directory(base);
    if (made == 0) {
      failed_path = path;
      made = make_directory(path);
    }
    if (made != ENOENT) break;
  }
  if (made != 0) {
    return failed_precondition_error(
        "the agent's cgroup {} is not writable by it: mkdir({}): {}. Under systemd give the unit "
        "Delegate=yes and "
        "ProtectControlGroups=no (deploy/cohortd.service); a non-root agent needs a cgroup delegated to its "
        "user",
        own, failed_path, ::strerror(made));
  }
  // The agent must be able to put a child there, which needs write access to cgroup.procs of the
  // new cgroup and of the common ancestor of where the child is now (the agent's cgroup) and where
  // it goes: a probe child moves itself in and reports.
  auto cgroups =
      std::shared_ptr<TaskCgroups>(new TaskCgroups(path, options.use_cgroup_kill, options.empty_timeout));
  StatusOr<std::unique_ptr<TaskCgroup>> probe = cgroups->create(fmt::format("probe-{}", ::getpid()));
  if (!probe.ok()) return failed_precondition_error("{}", probe.status().message());
  // Kernels before 5.14 have no cgroup.kill: kills go through the freezer fallback. Set before
  // the object is shared.
  cgroups->use_cgroup_kill_ = options.use_cgroup_kill && exists((*probe)->path() + "/cgroup.kill");
  const int procs_fd = (*probe)->procs_fd();
  const pid_t child = ::fork();
  if (child < 0) return errno_status("fork (task cgroup probe)", errno);
  if (child == 0) {
    // Async-signal-safe only: the agent may have threads.
    const bool moved = ::write(procs_fd, "0", 1) == 1;
    ::_exit(moved ? 0 : (errno & 0x7f) + 1);
  }
  int wait_status = 0;
  while (::waitpid(child, &wait_status, 0) < 0 && errno == EINTR) {
  }
  const std::string probe_path = (*probe)->path();
  probe->reset();  // removes it
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    const int err = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) - 1 : 0;
    return failed_precondition_error(
        "a child of the agent cannot move itself into {} (write of cgroup.procs: {}); the agent needs write "
        "access "
        "to cgroup.procs there and in its own cgroup {} (under systemd: Delegate=yes)",
        probe_path, err != 0 ? ::strerror(err) : "the probe child died", own);
  }
  return cgroups;
}

std::unique_ptr<TaskCgroup> TaskCgroups::existing(const std::string& path) const {
  const int dir_fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return std::unique_ptr<TaskCgroup>(
      new TaskCgroup(path, dir_fd, -1, /*owned=*/false, use_cgroup_kill_, empty_timeout_));
}

StatusOr<std::unique_ptr<TaskCgroup>> TaskCgroups::create(const std::string& name) const {
  if (!valid_cgroup_name(name)) {
    return invalid_argument_error("task cgroup name {:?} must be one path component of [A-Za-z0-9._-]", name);
  }
  const std::string path = path_ + "/" + name;
  if (::mkdir(path.c_str(), 0755) != 0) {
    if (errno != EEXIST) return errno_status(fmt::format("mkdir({}) for a task's cgroup", path), errno);
    // Left by an earlier task of that name whose processes would not die in time. Never killed
    // here: a name given twice must not end another task's processes.
    std::unique_ptr<TaskCgroup> earlier = existing(path);
    if (earlier->populated()) {
      const std::string pids = join_pids(read_pids_at(earlier->dir_fd_));
      return already_exists_error(
          "task cgroup {} exists and still holds pids {}: a task of that name still runs, or an earlier "
          "one's processes survived SIGKILL (stuck in the kernel: check `ps -o pid,stat,wchan -p {}`)",
          path, pids, pids);
    }
    if (::rmdir(path.c_str()) != 0 && errno != ENOENT) {
      return errno_status(fmt::format("rmdir({}) (an earlier task's empty cgroup)", path), errno);
    }
    if (::mkdir(path.c_str(), 0755) != 0)
      return errno_status(fmt::format("mkdir({}) for a task's cgroup", path), errno);
  }
  // The directory's descriptor is what every later kill and look goes through (TaskCgroup).
  const int dir_fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) {
    Status opened = errno_status(fmt::format("open({})", path), errno);
    ::rmdir(path.c_str());
    return opened;
  }
  const int fd = ::openat(dir_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    Status opened = errno_status(fmt::format("open({}/cgroup.procs)", path), errno);
    ::close(dir_fd);
    ::rmdir(path.c_str());
    return opened;
  }
  return std::unique_ptr<TaskCgroup>(
      new TaskCgroup(path, dir_fd, fd, /*owned=*/true, use_cgroup_kill_, empty_timeout_));
}

std::vector<LeftoverCgroup> TaskCgroups::remove_leftovers() const {
  std::vector<LeftoverCgroup> leftovers;
  DIR* dir = ::opendir(path_.c_str());
  if (dir == nullptr) return leftovers;
  std::vector<std::string> names;
  while (const dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == ".." || entry->d_type != DT_DIR) continue;
    names.push_back(name);
  }
  ::closedir(dir);
  for (const std::string& name : names) {
    LeftoverCgroup leftover;
    leftover.path = path_ + "/" + name;
    std::unique_ptr<TaskCgroup> cgroup = existing(leftover.path);
    if (cgroup->removed()) continue;  // removed since the listing (a task's end)
    leftover.pids = read_pids_at(cgroup->dir_fd_);
    leftover.removed = cgroup->kill_and_remove();
    leftovers.push_back(std::move(leftover));
  }
  return leftovers;
}

std::string agent_key_for_data_dir(const std::string& data_dir) {
  std::error_code error;
  std::filesystem::path canonical = std::filesystem::absolute(data_dir, error);
  if (!error) canonical = std::filesystem::weakly_canonical(canonical, error);
  // Without a working directory or with an unreadable parent: the key as typed, normalized.
  if (error) canonical = std::filesystem::path(data_dir).lexically_normal();
  std::string key = canonical.string();
  // weakly_canonical keeps a trailing separator of the input ("/var/lib/cohort/" stays so).
  while (key.size() > 1 && key.back() == '/') key.pop_back();
  return key;
}

}  // namespace cohort::agent
