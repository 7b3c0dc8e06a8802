#include "daemon/agent/process_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <grp.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace cohort::agent {

#ifdef COHORT_PROCESS_LAUNCHER_TEST_HOOKS
namespace testing_hooks {
std::atomic<bool> child_hangs_before_exec{false};
}  // namespace testing_hooks
#endif

namespace {

// The reader thread wakes at least this often to notice that its handle is being destroyed
// while a straggling grandchild still holds the pipes open.
constexpr int kReaderPollIntervalMillis = 100;
constexpr size_t kReadChunkBytes = 64 * 1024;

// What the child reports through the exec-error pipe when it cannot become the program.
enum class ChildStage : int {
  kChdir = 1,
  kExec = 2,
  kSetpgid = 3,
  kSetgroups = 4,
  kSetgid = 5,
  kSetuid = 6,
  kNoNewPrivs = 7,
  kDeathSignal = 8,
  kRlimit = 9,
  kCgroup = 10,
};
struct ChildError {
  ChildStage stage;
  int err;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Owns pipe ends until the handle takes them, so every error path closes them.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  ~Pipe() {
    close_fd(read_end);
    close_fd(write_end);
  }
  Status open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return errno_status("pipe2", errno);
    read_end = fds[0];
    write_end = fds[1];
    return ok_status();
  }
};

std::vector<char*> to_c_strings(const std::vector<std::string>& strings) {
  std::vector<char*> result;
  result.reserve(strings.size() + 1);
  for (const std::string& s : strings) result.push_back(const_cast<char*>(s.c_str()));
  result.push_back(nullptr);
  return result;
}

// Reports why the child could not become the program, then exits. Async-signal-safe.
[[noreturn]] void fail_child(int error_fd, ChildStage stage) {
  ChildError error{stage, errno};
  ssize_t ignored = ::write(error_fd, &error, sizeof(error));
  (void)ignored;
  ::_exit(127);
}

// A resource limit the child sets, computed in the parent.
struct ChildLimit {
  int resource;
  rlimit value;
};

// The limits every child gets (see the k* constants in the header), each capped at the launcher's
// own hard limit: an unprivileged launcher cannot raise it, and a lower operator setting wins.
std::vector<ChildLimit> child_limits() {
  const std::pair<int, rlim_t> wanted[] = {
      {RLIMIT_CORE, kChildCoreFileBytes},
      {RLIMIT_NOFILE, kChildMaxOpenFiles},
      {RLIMIT_NPROC, kChildMaxProcesses},
  };
  std::vector<ChildLimit> limits;
  for (const auto& [resource, value] : wanted) {
    rlimit current{};
    if (::getrlimit(resource, &current) != 0) continue;
    rlim_t capped = current.rlim_max == RLIM_INFINITY ? value : std::min(value, current.rlim_max);
    limits.push_back({resource, rlimit{capped, capped}});
  }
  return limits;
}

// Everything the child needs, prepared before fork: between fork and exec the child of a
// multi-threaded process may only make async-signal-safe calls (no allocation, no NSS lookups).
struct ChildPlan {
  char* const* argv;
  char* const* envp;
  const char* working_dir;  // nullptr: keep the launcher's
  const UnixUser* run_as;   // nullptr: keep the launcher's user
  const std::vector<ChildLimit>* limits;
  pid_t parent;  // the launcher's pid, to notice that it died before the death signal was armed
  int cgroup_procs_fd;  // the task cgroup's cgroup.procs, open for writing; -1: no cgroup
  int stdin_fd;
  int stdout_fd;
  int stderr_fd;
  int error_fd;
};

// Marks every descriptor from 3 up close-on-exec: the agent's threads open files without
// O_CLOEXEC here and there (std::ifstream; gRPC's certificate watcher re-reading the node's key),
// and one that was open at the fork would otherwise reach the job's program (its user could read
// the node's private key through it). The descriptors the child still needs (the exec handshake,
// the cgroup's procs file) close at the exec as before. Async-signal-safe.
void close_inherited_descriptors_on_exec() {
  if (::syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return;
  // Kernels before 5.11: each descriptor up to the soft limit (bounded: the loop is per launch).
  rlimit limit{};
  const rlim_t last = ::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                          ? std::min<rlim_t>(limit.rlim_cur, 1 << 20)
                          : 1 << 16;
  for (rlim_t fd = 3; fd < last; ++fd) {
    const int flags = ::fcntl(static_cast<int>(fd), F_GETFD);
    if (flags >= 0 && (flags & FD_CLOEXEC) == 0) ::fcntl(static_cast<int>(fd), F_SETFD, flags | FD_CLOEXEC);
  }
}

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const ChildPlan& plan) {
  if (::setpgid(0, 0) != 0) fail_child(plan.error_fd, ChildStage::kSetpgid);
  // Into the task's cgroup first, while still the launcher's user (moving needs write access to
  // cgroup.procs, which the job's user must not have) and before anything that could fork: all
  // the task ever starts is born inside it. "0" is the writing process itself.
  if (plan.cgroup_procs_fd >= 0 && ::write(plan.cgroup_procs_fd, "0", 1) != 1) {
    fail_child(plan.error_fd, ChildStage::kCgroup);
  }
  // The supervisor may block signals in its threads; workers start with a clean slate.
  sigset_t empty;
  sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::dup2(plan.stdin_fd, STDIN_FILENO);
  ::dup2(plan.stdout_fd, STDOUT_FILENO);
  ::dup2(plan.stderr_fd, STDERR_FILENO);
  close_inherited_descriptors_on_exec();
  // Limits first, while still privileged (a root launcher may set any value).
  for (const ChildLimit& limit : *plan.limits) {
    if (::setrlimit(limit.resource, &limit.value) != 0) fail_child(plan.error_fd, ChildStage::kRlimit);
  }
  if (plan.run_as != nullptr) {
    // Groups before the uid: once the uid is dropped the process may no longer change them.
    const UnixUser& user = *plan.run_as;
    if (::setgroups(user.groups.size(), user.groups.data()) != 0) fail_child(plan.error_fd, ChildStage::kSetgroups);
    if (::setgid(user.gid) != 0) fail_child(plan.error_fd, ChildStage::kSetgid);
    if (::setuid(user.uid) != 0) fail_child(plan.error_fd, ChildStage::kSetuid);
  }
  // After the switch: a change of the effective or filesystem uid or gid clears the death signal.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail_child(plan.error_fd, ChildStage::kDeathSignal);
  // The launcher may have died between fork and prctl, before the signal was armed: then this
  // process was already re-parented and nothing would ever kill it.
  if (::getppid() != plan.parent) ::_exit(127);
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail_child(plan.error_fd, ChildStage::kNoNewPrivs);
#ifdef COHORT_PROCESS_LAUNCHER_TEST_HOOKS
  if (plan.working_dir != nullptr) {
    while (testing_hooks::child_hangs_before_exec.load()) ::pause();
  }
#endif
  // As the job's user: a directory that user cannot reach fails here, with a clear error.
  if (plan.working_dir != nullptr && ::chdir(plan.working_dir) != 0) {
    fail_child(plan.error_fd, ChildStage::kChdir);
  }
  ::execve(plan.argv[0], plan.argv, plan.envp);
  fail_child(plan.error_fd, ChildStage::kExec);
}

// What a child's failure means, for the launch error.
std::string describe_child_failure(ChildStage stage, const LaunchOptions& options) {
  const std::string& path = options.argv[0];
  const std::string user = options.run_as.has_value() ? options.run_as->name : std::string("the agent's user");
  switch (stage) {
    case ChildStage::kChdir:
      return fmt::format("chdir({}) as {} for {}", options.working_dir, user, path);
    case ChildStage::kSetpgid:
      return fmt::format("setpgid for {}", path);
    case ChildStage::kSetgroups:
    case ChildStage::kSetgid:
    case ChildStage::kSetuid:
      return fmt::format("switching to user {} (uid {}) for {}", user,
                         options.run_as.has_value() ? options.run_as->uid : 0, path);
    case ChildStage::kNoNewPrivs:
      return fmt::format("prctl(PR_SET_NO_NEW_PRIVS) for {}", path);
    case ChildStage::kDeathSignal:
      return fmt::format("prctl(PR_SET_PDEATHSIG) for {}", path);
    case ChildStage::kRlimit:
      return fmt::format("setrlimit for {}", path);
    case ChildStage::kCgroup:
      return fmt::format("moving the child for {} into its cgroup (cgroup.procs)", path);
    case ChildStage::kExec:
      break;
  }
  return fmt::format("execve({}) as {}", path, user);
}

std::string child_failure_hint(ChildStage stage, const LaunchOptions& options) {
  switch (stage) {
    case ChildStage::kChdir:
      return "; check that the working directory exists and that every directory above it is searchable "
             "(o+x) by that user";
    case ChildStage::kSetgroups:
    case ChildStage::kSetgid:
    case ChildStage::kSetuid:
      return "; switching users needs an agent running as root (CAP_SETUID, CAP_SETGID)";
    case ChildStage::kCgroup:
      return "; the agent's cgroup subtree must stay writable by it (under systemd: Delegate=yes); the "
             "agent's start-up log says which cgroup it uses";
    case ChildStage::kExec:
      return options.run_as.has_value()
                 ? "; check that the path exists and that it and every directory above it are executable "
                   "by that user"
                 : "; check that the path exists and is executable";
    default:
      return "";
  }
}

// /proc/<pid>/stat's state field (after the command name, which may itself hold ')' and spaces):
// 'T' stopped by a signal, 't' stopped by a tracer. Not waitpid(WUNTRACED): that reports a stop
// once, and a poll that missed it could not ask again.
bool process_is_stopped(pid_t pid) {
  std::FILE* file = std::fopen(fmt::format("/proc/{}/stat", pid).c_str(), "re");
  if (file == nullptr) return false;
  char buffer[512];
  size_t n = std::fread(buffer, 1, sizeof(buffer) - 1, file);
  std::fclose(file);
  buffer[n] = '\0';
  const char* paren = std::strrchr(buffer, ')');
  if (paren == nullptr || paren[1] != ' ') return false;
  return paren[2] == 'T' || paren[2] == 't';
}

class PosixProcessHandle final : public ProcessHandle {
 public:
  PosixProcessHandle(pid_t pid, int stdout_fd, int stderr_fd, OutputCallback on_stdout,
                     OutputCallback on_stderr, std::unique_ptr<TaskCgroup> cgroup)
      : pid_(pid),
        stdout_fd_(stdout_fd),
        stderr_fd_(stderr_fd),
        on_stdout_(std::move(on_stdout)),
        on_stderr_(std::move(on_stderr)),
        cgroup_(std::move(cgroup)) {
    reader_ = std::thread([this] { read_output(); });
  }

  ~PosixProcessHandle() override {
    if (!poll_exit().has_value()) {
      kill_all().ignore_error();
      int wait_status = 0;
      while (::waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
      }
    }
    // A reaped leader's group is not signalled here: its id may since belong to another group.
    // Its cgroup is the task's own: what is left in it is killed and the cgroup removed (bounded),
    // which also ends the stragglers that hold the pipes. Nothing when remove_cgroup removed it
    // already: a cgroup of the same name may belong to a later task by now.
    cgroup_.reset();
    // A straggler that still holds the pipes only delays the reader until stop_reader_.
    stop_reader_.store(true);
    join_reader();
    close_fd(stdout_fd_);
    close_fd(stderr_fd_);
  }

  pid_t pid() const override { return pid_; }
  pid_t pgid() const override { return pid_; }

  Status signal_group(int sig) override {
    // Under mu_, so poll_exit cannot reap between the check and the kill: a reaped leader's id may
    // already name another process group, which root would otherwise signal.
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_.has_value()) return ok_status();
    if (::kill(-pid_, sig) != 0 && errno != ESRCH) {
      return errno_status(fmt::format("kill(-{}, {})", pid_, sig), errno);
    }
    return ok_status();
  }

  std::optional<ExitStatus> poll_exit() override {
    std::unique_lock<std::mutex> lock(mu_);
    if (exit_.has_value()) return exit_;
    // Look without reaping first: while the exited leader is a zombie its pid still names the
    // group, so what it left behind (a shell's background job, a forked helper) can be killed
    // without the risk of hitting a group that reuses the id later. A task's processes end with
    // it: a straggler would outlive the slot the coordinator then hands to another job, and
    // nothing would ever stop it.
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid_) {
      return exit_;
    }
    ::kill(-pid_, SIGKILL);  // ESRCH: the leader was alone
    int wait_status = 0;
    pid_t result = 0;
    while ((result = ::waitpid(pid_, &wait_status, 0)) < 0 && errno == EINTR) {
    }
    if (result == pid_) exit_ = ExitStatus::from_wait_status(wait_status);
    const std::optional<ExitStatus> exit = exit_;
    lock.unlock();
    // And whatever left the group (setsid, a double fork): the task's cgroup holds it still. After
    // the reap and outside mu_, as the freezer fallback may wait: the cgroup is the task's alone
    // (TaskCgroup acts through its directory's descriptor), so the reap changes nothing for it.
    if (exit.has_value() && cgroup_ != nullptr) cgroup_->kill().ignore_error();
    return exit;
  }

  bool is_stopped() override {
    std::lock_guard<std::mutex> lock(mu_);
    // A reaped pid may already name another process.
    if (exit_.has_value()) return false;
    return process_is_stopped(pid_);
  }

  Status kill_all() override {
    Status signalled = signal_group(SIGKILL);
    // Outside mu_ (the freezer fallback may wait): the cgroup cannot name another task's processes.
    if (cgroup_ != nullptr) COHORT_RETURN_IF_ERROR(cgroup_->kill());
    return signalled;
  }

  using ProcessHandle::remove_cgroup;
  Status remove_cgroup(std::chrono::steady_clock::time_point deadline) override {
    if (cgroup_ == nullptr) return ok_status();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!exit_.has_value()) {
        return failed_precondition_error("remove the cgroup {} of pid {}: the process still runs",
                                         cgroup_->path(), pid_);
      }
    }
    return cgroup_->kill_and_remove(deadline);
  }

  std::string cgroup_path() const override { return cgroup_ != nullptr ? cgroup_->path() : std::string(); }

  bool wait_output_closed(std::chrono::milliseconds timeout) override {
    bool closed = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      closed = output_cv_.wait_for(lock, timeout, [this] { return output_closed_; });
    }
    // The reader has nothing left to do: join it now rather than when the handle goes, so an
    // ended task that is kept for its logs holds no thread.
    if (closed) join_reader();
    return closed;
  }

 private:
  void join_reader() {
    std::lock_guard<std::mutex> lock(join_mu_);
    if (reader_.joinable()) reader_.join();
  }

  // Delivers both pipes' bytes to the callbacks until both reach end of file or the handle goes.
  void read_output() {
    std::vector<char> buffer(kReadChunkBytes);
    bool stdout_open = true;
    bool stderr_open = true;
    while ((stdout_open || stderr_open) && !stop_reader_.load()) {
      pollfd fds[2] = {{stdout_open ? stdout_fd_ : -1, POLLIN, 0},
                       {stderr_open ? stderr_fd_ : -1, POLLIN, 0}};
      int ready = ::poll(fds, 2, kReaderPollIntervalMillis);
      if (ready < 0 && errno != EINTR) break;
      if (ready <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        ssize_t n = ::read(fds[i].fd, buffer.data(), buffer.size());
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
          (i == 0 ? stdout_open : stderr_open) = false;
          continue;
        }
        const OutputCallback& callback = i == 0 ? on_stdout_ : on_stderr_;
        if (callback) callback(std::string_view(buffer.data(), static_cast<size_t>(n)));
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    output_closed_ = true;
    output_cv_.notify_all();
  }

  const pid_t pid_;
  int stdout_fd_;
  int stderr_fd_;
  const OutputCallback on_stdout_;
  const OutputCallback on_stderr_;

  std::mutex mu_;
  std::condition_variable output_cv_;
  std::optional<ExitStatus> exit_;  // guarded by mu_
  bool output_closed_ = false;      // guarded by mu_
  std::atomic<bool> stop_reader_{false};
  std::mutex join_mu_;  // serializes joining reader_ (wait_output_closed and the destructor)
  std::thread reader_;
  // The task's cgroup; nullptr without containment. Set at construction, reset only by the
  // destructor; TaskCgroup is thread-safe.
  std::unique_ptr<TaskCgroup> cgroup_;
};

}  // namespace

std::string ExitStatus::to_string() const {
  if (signal != 0) {
    const char* name = ::strsignal(signal);
    return fmt::format("killed by signal {} ({})", signal, name != nullptr ? name : "unknown");
  }
  return fmt::format("exit code {}", exit_code);
}

ExitStatus ExitStatus::from_wait_status(int wait_status) {
  ExitStatus status;
  if (WIFSIGNALED(wait_status)) {
    status.signal = WTERMSIG(wait_status);
  } else if (WIFEXITED(wait_status)) {
    status.exit_code = WEXITSTATUS(wait_status);
  }
  return status;
}

namespace {

// A child forked for a launch, not yet known to have exec'd: the fork thread hands it to the
// launching thread, which waits for the exec handshake. Owns the parent's pipe ends.
struct ForkedChild {
  pid_t pid = -1;
  int stdout_fd = -1;
  int stderr_fd = -1;
  int exec_error_fd = -1;  // read end of the close-on-exec exec-error pipe
  // The child's cgroup; nullptr without containment. Its destructor (a failed launch) kills what is
  // in it and removes it.
  std::unique_ptr<TaskCgroup> cgroup;
  ForkedChild() = default;
  ForkedChild(const ForkedChild&) = delete;
  ForkedChild& operator=(const ForkedChild&) = delete;
  ~ForkedChild() {
    close_fd(stdout_fd);
    close_fd(stderr_fd);
    close_fd(exec_error_fd);
  }
};

// Runs on the fork thread: everything up to and including fork, nothing that can block on the
// child (the handshake is await_exec's, on the launching thread).
StatusOr<std::unique_ptr<ForkedChild>> fork_child(const LaunchOptions& options, const TaskCgroups* cgroups,
                                                  const std::string& cgroup_name) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return invalid_argument_error("launch: empty argv; give the executable's path as argv[0]");
  }
  if (options.run_as.has_value() && ::geteuid() != 0) {
    return failed_precondition_error("launch {} as user {}: the launcher is not root and cannot switch users",
                                     options.argv[0], options.run_as->name);
  }
  if (options.exec_timeout.count() <= 0) {
    return invalid_argument_error("launch {}: exec_timeout is {} ms; it must be positive", options.argv[0],
                                  options.exec_timeout.count());
  }
  const std::string& path = options.argv[0];
  // Prepared before fork: the child may only make async-signal-safe calls.
  std::vector<char*> argv = to_c_strings(options.argv);
  std::vector<char*> envp = to_c_strings(options.env);
  const std::vector<ChildLimit> limits = child_limits();

  Pipe out;
  Pipe err;
  Pipe exec_error;
  COHORT_RETURN_IF_ERROR(out.open());
  COHORT_RETURN_IF_ERROR(err.open());
  COHORT_RETURN_IF_ERROR(exec_error.open());
  // Made before the fork, so the child only has to write to its cgroup.procs (close-on-exec: the
  // program never holds it).
  std::unique_ptr<TaskCgroup> cgroup;
  if (cgroups != nullptr) {
    StatusOr<std::unique_ptr<TaskCgroup>> created = cgroups->create(cgroup_name);
    if (!created.ok()) return created.status().with_context(fmt::format("launch {}", path));
    cgroup = std::move(created).value();
  }
  int stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd < 0) return errno_status("open(/dev/null)", errno);

  ChildPlan plan{argv.data(),
                 envp.data(),
                 options.working_dir.empty() ? nullptr : options.working_dir.c_str(),
                 options.run_as.has_value() ? &*options.run_as : nullptr,
                 &limits,
                 ::getpid(),
                 cgroup != nullptr ? cgroup->procs_fd() : -1,
                 stdin_fd,
                 out.write_end,
                 err.write_end,
                 exec_error.write_end};
  pid_t pid = ::fork();
  if (pid < 0) {
    int fork_errno = errno;
    ::close(stdin_fd);
    return errno_status(fmt::format("fork for {}", path), fork_errno);
  }
  if (pid == 0) exec_child(plan);
  // Also set in the parent, so the group exists before anyone signals it (no race with the
  // child's own setpgid). EACCES means the child already exec'd, which is fine.
  ::setpgid(pid, pid);
  ::close(stdin_fd);
  auto child = std::make_unique<ForkedChild>();
  child->pid = pid;
  std::swap(child->stdout_fd, out.read_end);
  std::swap(child->stderr_fd, err.read_end);
  std::swap(child->exec_error_fd, exec_error.read_end);
  child->cgroup = std::move(cgroup);
  return StatusOr<std::unique_ptr<ForkedChild>>(std::move(child));  // the write ends close with the Pipes: only the child holds them now
}

// Runs on the launching thread: waits, up to options.exec_timeout, for the child to exec (end of
// file on the close-on-exec pipe) or to report why it could not. A child past the deadline is
// SIGKILLed; if the kernel does not let it go at once (it sleeps uninterruptibly on a dead mount)
// `abandon` takes its pid to reap later.
StatusOr<std::unique_ptr<ProcessHandle>> await_exec(std::unique_ptr<ForkedChild> child, const LaunchOptions& options,
                                                    const std::function<void(pid_t)>& abandon) {
  const auto deadline = std::chrono::steady_clock::now() + options.exec_timeout;
  ChildError child_error{};
  ssize_t n = -1;
  while (true) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd fd{child->exec_error_fd, POLLIN, 0};
    const int ready = left.count() > 0 ? ::poll(&fd, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) break;  // the deadline passed: n stays -1
    // POLLIN or POLLHUP (or an error, which read reports): at most one ChildError, written at once.
    do {
      n = ::read(child->exec_error_fd, &child_error, sizeof(child_error));
    } while (n < 0 && errno == EINTR);
    if (n < 0) n = 0;  // cannot tell: treated as exec'd, as the handle then reports its exit
    break;
  }
  const std::string user = options.run_as.has_value() ? options.run_as->name : std::string("the agent's user");
  if (n < 0) {
    ::kill(-child->pid, SIGKILL);
    ::kill(child->pid, SIGKILL);
    int wait_status = 0;
    if (::waitpid(child->pid, &wait_status, WNOHANG) != child->pid) abandon(child->pid);
    const std::string where = options.working_dir.empty()
                                  ? fmt::format("{}", options.argv[0])
                                  : fmt::format("{} or {}", options.working_dir, options.argv[0]);
    return deadline_exceeded_error(
        "launch {} as {}{}: the child (pid {}) did not reach execve within {} ms, so it was killed; is {} on a "
        "hung mount (an NFS server that does not answer)? Check it on this node (e.g. `stat`), as that user",
        options.argv[0], user,
        options.working_dir.empty() ? std::string() : fmt::format(" in {}", options.working_dir), child->pid,
        options.exec_timeout.count(), where);
  }
  if (n == static_cast<ssize_t>(sizeof(child_error))) {
    int wait_status = 0;
    while (::waitpid(child->pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    std::string what = describe_child_failure(child_error.stage, options);
    if (child_error.stage == ChildStage::kCgroup && child->cgroup != nullptr) {
      what += " " + child->cgroup->path();
    }
    return errno_status(what, child_error.err).with_suffix(child_failure_hint(child_error.stage, options));
  }
  auto handle =
      std::make_unique<PosixProcessHandle>(child->pid, child->stdout_fd, child->stderr_fd, options.on_stdout,
                                           options.on_stderr, std::move(child->cgroup));
  child->stdout_fd = -1;
  child->stderr_fd = -1;
  return std::unique_ptr<ProcessHandle>(std::move(handle));
}

// Numbers the cgroups of launches that give no cgroup_name: per process, since launchers may
// share one TaskCgroups.
std::atomic<uint64_t> unnamed_launches{0};

// How often the fork thread looks whether a child killed at its exec deadline can be reaped.
constexpr std::chrono::milliseconds kAbandonedReapInterval = std::chrono::seconds(1);

}  // namespace

// One launch handed to the fork thread.
struct PosixProcessLauncher::Request {
  const LaunchOptions* options = nullptr;
  std::shared_ptr<TaskCgroups> cgroups;  // nullptr: no containment
  std::string cgroup_name;
  std::optional<StatusOr<std::unique_ptr<ForkedChild>>> result;  // set by the fork thread
};

PosixProcessLauncher::PosixProcessLauncher() {
  fork_thread_ = std::thread([this] { fork_loop(); });
}

PosixProcessLauncher::~PosixProcessLauncher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
  }
  cv_.notify_all();
  fork_thread_.join();
}

void PosixProcessLauncher::reap_abandoned_locked() {
  std::vector<pid_t> left;
  for (pid_t pid : abandoned_) {
    int wait_status = 0;
    pid_t result = ::waitpid(pid, &wait_status, WNOHANG);
    if (result == 0 || (result < 0 && errno == EINTR)) left.push_back(pid);
  }
  abandoned_ = std::move(left);
}

void PosixProcessLauncher::fork_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    auto ready = [this] { return shutdown_ || !queue_.empty(); };
    if (abandoned_.empty()) {
      cv_.wait(lock, [&] { return ready() || !abandoned_.empty(); });
    } else {
      cv_.wait_for(lock, kAbandonedReapInterval, ready);
    }
    reap_abandoned_locked();
    if (queue_.empty()) {
      if (shutdown_) return;  // nothing left to answer
      continue;
    }
    Request* request = queue_.front();
    queue_.erase(queue_.begin());
    lock.unlock();
    StatusOr<std::unique_ptr<ForkedChild>> result =
        fork_child(*request->options, request->cgroups.get(), request->cgroup_name);
    lock.lock();
    request->result.emplace(std::move(result));
    cv_.notify_all();
  }
}

void PosixProcessLauncher::set_task_cgroups(std::shared_ptr<TaskCgroups> cgroups) {
  std::lock_guard<std::mutex> lock(mu_);
  cgroups_ = std::move(cgroups);
}

std::shared_ptr<TaskCgroups> PosixProcessLauncher::task_cgroups() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cgroups_;
}

StatusOr<std::unique_ptr<ProcessHandle>> PosixProcessLauncher::launch(const LaunchOptions& options) {
  Request request;
  request.options = &options;
  StatusOr<std::unique_ptr<ForkedChild>> forked = internal_error("launch: not forked");
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (shutdown_) {
      return unavailable_error("launch {}: the process launcher is shutting down",
                               options.argv.empty() ? std::string() : options.argv[0]);
    }
    request.cgroups = cgroups_;
    request.cgroup_name =
        options.cgroup_name.empty() ? fmt::format("task-{}", ++unnamed_launches) : options.cgroup_name;
    queue_.push_back(&request);
    cv_.notify_all();
    // The fork thread answers every queued request before it ends; each takes it only a fork.
    cv_.wait(lock, [&] { return request.result.has_value(); });
    forked = std::move(*request.result);
  }
  if (!forked.ok()) return forked.status();
  return await_exec(std::move(forked).value(), options, [this](pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_.push_back(pid);
    cv_.notify_all();
  });
}

}  // namespace cohort::agent
