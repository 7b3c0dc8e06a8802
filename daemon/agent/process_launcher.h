#pragma once

// ProcessLauncher: the agent's seam over fork/exec (STYLE rule 7). The TaskSupervisor launches,
// signals and reaps worker processes only through this interface, so its failure paths can be
// driven by a fake launcher; PosixProcessLauncher is the real one.
//
// Every launched process leads its own process group (pgid == pid), so that signalling the group
// reaches whatever the worker itself forked (a data loader, a shell's background job) and a stop
// leaves no process behind.
//
// Example:
//   PosixProcessLauncher launcher;
//   LaunchOptions options;
//   options.argv = {"/bin/echo", "hello"};
//   options.on_stdout = [](std::string_view bytes) { ... };
//   COHORT_ASSIGN_OR_RETURN(std::unique_ptr<ProcessHandle> process, launcher.launch(options));
//   ... process->poll_exit() until it returns a value ...

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"

namespace cohort::agent {

// How a process ended.
struct ExitStatus {
  int exit_code = 0;  // the value passed to exit(); meaningful when signal == 0
  int signal = 0;     // the signal that terminated it, or 0 if it exited

  bool success() const { return signal == 0 && exit_code == 0; }
  // "exit code 3" or "killed by signal 9 (Killed)".
  std::string to_string() const;
  // From a waitpid() status word.
  static ExitStatus from_wait_status(int wait_status);

  friend bool operator==(const ExitStatus& a, const ExitStatus& b) {
    return a.exit_code == b.exit_code && a.signal == b.signal;
  }
};

// Receives a chunk of a process's output. Called from the launcher's reader thread, never
// concurrently for one process; the bytes are valid only during the call.
using OutputCallback = std::function<void(std::string_view bytes)>;

struct LaunchOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path (no PATH search)
  std::vector<std::string> env;   // the complete environment, "NAME=value" each
  std::string working_dir;        // empty: the launcher's own working directory
  OutputCallback on_stdout;       // empty: stdout is discarded
  OutputCallback on_stderr;       // empty: stderr is discarded
};

// One launched process and its process group. Thread-safe.
class ProcessHandle {
 public:
  virtual ~ProcessHandle() = default;

  virtual pid_t pid() const = 0;
  // The process group the process leads; equal to pid().
  virtual pid_t pgid() const = 0;

  // Sends `sig` to every process of the group. A group that no longer exists is not an error
  // (the processes are gone, which is what a stop wants). Non-blocking.
  virtual Status signal_group(int sig) = 0;

  // Reaps the process if it has exited; its exit status then and on every later call, nullopt
  // while it runs. Non-blocking.
  virtual std::optional<ExitStatus> poll_exit() = 0;

  // Blocks until the process's stdout and stderr are closed (every writer, children included, has
  // exited or closed them) and every byte was delivered to the callbacks, or `timeout` passes.
  // Returns whether the output was drained.
  virtual bool wait_output_closed(std::chrono::milliseconds timeout) = 0;
};

class ProcessLauncher {
 public:
  virtual ~ProcessLauncher() = default;

  // Starts a process in its own process group. An error (a missing or non-executable binary, a
  // missing working directory) is returned here, naming the path; the launch never turns into a
  // child that silently exits. Blocking only until the child has exec'd. Thread-safe.
  virtual StatusOr<std::unique_ptr<ProcessHandle>> launch(const LaunchOptions& options) = 0;
};

// fork + setpgid + execve, stdout and stderr through pipes drained by one reader thread per
// process, stdin from /dev/null. The handle's destructor kills the group if the process is still
// running and reaps it, so no process outlives its handle.
class PosixProcessLauncher final : public ProcessLauncher {
 public:
  StatusOr<std::unique_ptr<ProcessHandle>> launch(const LaunchOptions& options) override;
};

}  // namespace cohort::agent
