#include "daemon/agent/process_launcher.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace cohort::agent {
namespace {

// The reader thread wakes at least this often to notice that its handle is being destroyed
// while a straggling grandchild still holds the pipes open.
constexpr int kReaderPollIntervalMillis = 100;
constexpr size_t kReadChunkBytes = 64 * 1024;

// What the child reports through the exec-error pipe when it cannot become the program.
enum class ChildStage : int { kChdir = 1, kExec = 2, kSetpgid = 3 };
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

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(const LaunchOptions& options, char* const* argv, char* const* envp, int stdin_fd,
                             int stdout_fd, int stderr_fd, int error_fd) {
  if (::setpgid(0, 0) != 0) fail_child(error_fd, ChildStage::kSetpgid);
  // The supervisor may block signals in its threads; workers start with a clean slate.
  sigset_t empty;
  sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  ::signal(SIGPIPE, SIG_DFL);
  ::dup2(stdin_fd, STDIN_FILENO);
  ::dup2(stdout_fd, STDOUT_FILENO);
  ::dup2(stderr_fd, STDERR_FILENO);
  if (!options.working_dir.empty() && ::chdir(options.working_dir.c_str()) != 0) {
    fail_child(error_fd, ChildStage::kChdir);
  }
  ::execve(argv[0], argv, envp);
  fail_child(error_fd, ChildStage::kExec);
}

class PosixProcessHandle final : public ProcessHandle {
 public:
  PosixProcessHandle(pid_t pid, int stdout_fd, int stderr_fd, OutputCallback on_stdout,
                     OutputCallback on_stderr)
      : pid_(pid),
        stdout_fd_(stdout_fd),
        stderr_fd_(stderr_fd),
        on_stdout_(std::move(on_stdout)),
        on_stderr_(std::move(on_stderr)) {
    reader_ = std::thread([this] { read_output(); });
  }

  ~PosixProcessHandle() override {
    if (!poll_exit().has_value()) {
      signal_group(SIGKILL).ignore_error();
      int wait_status = 0;
      while (::waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
      }
    }
    // A reaped leader's group is not signalled here: its id may since belong to another group.
    // A straggler that still holds the pipes only delays the reader until stop_reader_.
    stop_reader_.store(true);
    join_reader();
    close_fd(stdout_fd_);
    close_fd(stderr_fd_);
  }

  pid_t pid() const override { return pid_; }
  pid_t pgid() const override { return pid_; }

  Status signal_group(int sig) override {
    if (::kill(-pid_, sig) != 0 && errno != ESRCH) {
      return errno_status(fmt::format("kill(-{}, {})", pid_, sig), errno);
    }
    return ok_status();
  }

  std::optional<ExitStatus> poll_exit() override {
    std::lock_guard<std::mutex> lock(mu_);
    if (exit_.has_value()) return exit_;
    int wait_status = 0;
    pid_t result = ::waitpid(pid_, &wait_status, WNOHANG);
    if (result == pid_) exit_ = ExitStatus::from_wait_status(wait_status);
    return exit_;
  }

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

StatusOr<std::unique_ptr<ProcessHandle>> PosixProcessLauncher::launch(const LaunchOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return invalid_argument_error("launch: empty argv; give the executable's path as argv[0]");
  }
  const std::string& path = options.argv[0];
  // Prepared before fork: the child may only make async-signal-safe calls.
  std::vector<char*> argv = to_c_strings(options.argv);
  std::vector<char*> envp = to_c_strings(options.env);

  Pipe out;
  Pipe err;
  Pipe exec_error;
  COHORT_RETURN_IF_ERROR(out.open());
  COHORT_RETURN_IF_ERROR(err.open());
  COHORT_RETURN_IF_ERROR(exec_error.open());
  int stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (stdin_fd < 0) return errno_status("open(/dev/null)", errno);

  pid_t pid = ::fork();
  if (pid < 0) {
    int fork_errno = errno;
    ::close(stdin_fd);
    return errno_status(fmt::format("fork for {}", path), fork_errno);
  }
  if (pid == 0) {
    exec_child(options, argv.data(), envp.data(), stdin_fd, out.write_end, err.write_end,
               exec_error.write_end);
  }
  // Also set in the parent, so the group exists before anyone signals it (no race with the
  // child's own setpgid). EACCES means the child already exec'd, which is fine.
  ::setpgid(pid, pid);
  ::close(stdin_fd);
  close_fd(out.write_end);
  close_fd(err.write_end);
  close_fd(exec_error.write_end);

  // The exec-error pipe is close-on-exec: end of file means execve succeeded.
  ChildError child_error{};
  ssize_t n;
  do {
    n = ::read(exec_error.read_end, &child_error, sizeof(child_error));
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof(child_error))) {
    int wait_status = 0;
    while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
    }
    switch (child_error.stage) {
      case ChildStage::kChdir:
        return errno_status(fmt::format("chdir({}) for {}", options.working_dir, path), child_error.err)
            .with_suffix("; check that the working directory exists");
      case ChildStage::kSetpgid:
        return errno_status(fmt::format("setpgid for {}", path), child_error.err);
      case ChildStage::kExec:
        break;
    }
    return errno_status(fmt::format("execve({})", path), child_error.err)
        .with_suffix("; check that the path exists and is executable");
  }

  auto handle = std::make_unique<PosixProcessHandle>(pid, out.read_end, err.read_end, options.on_stdout,
                                                     options.on_stderr);
  out.read_end = -1;
  err.read_end = -1;
  return std::unique_ptr<ProcessHandle>(std::move(handle));
}

}  // namespace cohort::agent
