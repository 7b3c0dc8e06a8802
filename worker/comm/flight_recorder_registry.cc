#include "worker/comm/flight_recorder_registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <set>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

namespace cohort::comm {
namespace {

struct Registered {
  std::weak_ptr<FlightRecorder> recorder;
  int world_rank = -1;
  uint64_t context_id = 0;
  std::string name;
};

struct Registry {
  std::mutex mutex;
  std::vector<Registered> recorders;
  std::atomic<uint64_t> dumps{0};
  // The signal path: a pipe the handler writes to, read by one dump thread.
  std::mutex signal_mutex;
  std::set<int> signals;
  // The process whose dump thread reads the pipe: a forked child inherits the handler but not the
  // thread, and starts its own on its next install.
  pid_t dump_thread_pid = 0;
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: a signal may arrive at exit
  return *instance;
}

// Written by the handler (plain ints: async-signal-safe to read there).
volatile sig_atomic_t g_pipe_write_fd = -1;
volatile sig_atomic_t g_handler_pid = 0;

extern "C" void on_dump_signal(int) {
  // A forked child inherits the handler and the pipe; only the process that owns the dump thread
  // may wake it. getpid and write are async-signal-safe; errno is restored for the interrupted code.
  const int saved = errno;
  if (g_pipe_write_fd >= 0 && ::getpid() == g_handler_pid) {
    const char byte = 1;
    ssize_t ignored = ::write(g_pipe_write_fd, &byte, 1);  // full pipe: a dump is pending anyway
    (void)ignored;
  }
  errno = saved;
}

void dump_thread(int read_fd) {
  char byte = 0;
  while (true) {
    ssize_t n = ::read(read_fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    StatusOr<std::string> path = dump_flight_recorders();
    if (!path.ok()) spdlog::error("flight recorder dump on signal failed: {}", path.status().to_string());
  }
}

std::string dump_directory() {
  for (const char* variable : {kFlightRecorderDirEnv, "TMPDIR"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') return value;
  }
  return "/tmp";
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

void register_flight_recorder(const std::shared_ptr<FlightRecorder>& recorder, int world_rank,
                              uint64_t context_id, const std::string& name) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  // Communicators come and go (split, new_group): forget the dead ones here.
  auto& list = table.recorders;
  list.erase(
      std::remove_if(list.begin(), list.end(), [](const Registered& r) { return r.recorder.expired(); }),
      list.end());
  list.push_back(Registered{recorder, world_rank, context_id, name});
}

std::string flight_recorder_trace_json() {
  std::vector<std::pair<Registered, std::shared_ptr<FlightRecorder>>> live;
  {
    Registry& table = registry();
    std::lock_guard<std::mutex> lock(table.mutex);
    for (const Registered& r : table.recorders) {
      if (auto recorder = r.recorder.lock()) live.emplace_back(r, std::move(recorder));
    }
  }
  std::string out = "{\"traceEvents\":[\n";
  std::set<int> processes;
  for (const auto& [info, recorder] : live) {
    // Two trace threads per communicator: collectives, point to point.
    const int64_t tid = static_cast<int64_t>(info.context_id) * 2;
    recorder->append_chrome_trace_events(info.world_rank, tid, &out);
    out += fmt::format(
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}},\n"
        "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{},\"tid\":{},\"args\":{{\"name\":{}}}}},\n",
        info.world_rank, tid, json_string(info.name + " collectives"), info.world_rank, tid + 1,
        json_string(info.name + " point-to-point"));
    processes.insert(info.world_rank);
  }
  for (int rank : processes) {
    out += fmt::format(
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"name\":\"rank "
        "{}\"}}}},\n",
        rank, rank);
  }
  // The last element carries no trailing comma; it also records who wrote the file.
  out += fmt::format(
      "{{\"name\":\"cohort_flight_recorder\",\"ph\":\"M\",\"pid\":{},\"tid\":0,\"args\":{{\"os_pid\":{},"
      "\"communicators\":{}}}}}\n],\"displayTimeUnit\":\"ms\"}}\n",
      processes.empty() ? 0 : *processes.begin(), ::getpid(), live.size());
  return out;
}

StatusOr<std::string> dump_flight_recorders(const std::string& path) {
  Registry& table = registry();
  std::string target = path;
  if (target.empty()) {
    int rank = -1;
    {
      std::lock_guard<std::mutex> lock(table.mutex);
      // The lowest world rank among the live communicators (ranks as threads share a process).
      for (const Registered& r : table.recorders) {
        if (!r.recorder.expired() && (rank < 0 || r.world_rank < rank)) rank = r.world_rank;
      }
    }
    target = fmt::format("{}/cohort-flight-recorder-rank{}-pid{}-{}.json", dump_directory(),
                         rank < 0 ? std::string("unknown") : std::to_string(rank), ::getpid(),
                         table.dumps.fetch_add(1));
  }
  const std::string json = flight_recorder_trace_json();
  const std::string temporary = target + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    file << json;
    file.flush();
    if (!file) {
      return unavailable_error("flight recorder dump: cannot write {}: {}; set {} to a writable directory",
                               temporary, std::strerror(errno), kFlightRecorderDirEnv);
    }
  }
  if (std::rename(temporary.c_str(), target.c_str()) != 0) {
    Status status =
        errno_status("rename", errno).with_context(fmt::format("flight recorder dump to {}", target));
    std::remove(temporary.c_str());
    return status;
  }
  spdlog::warn("flight recorder: wrote {} ({} bytes; open in chrome://tracing or https://ui.perfetto.dev)",
               target, json.size());
  return target;
}

void dump_flight_recorders_on_timeout() {
  const char* dir = std::getenv(kFlightRecorderDirEnv);
  if (dir == nullptr || *dir == '\0') return;
  StatusOr<std::string> path = dump_flight_recorders();
  if (!path.ok()) spdlog::error("flight recorder dump on timeout failed: {}", path.status().to_string());
}

Status install_flight_recorder_signal_handler(int signal) {
  if (signal <= 0 || signal >= NSIG || signal == SIGKILL || signal == SIGSTOP) {
    return invalid_argument_error("flight recorder: signal {} cannot be caught; use SIGUSR1 or SIGUSR2",
                                  signal);
  }
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.signal_mutex);
  if (table.dump_thread_pid != ::getpid()) table.signals.clear();
  if (table.signals.count(signal) > 0) return ok_status();
  if (table.dump_thread_pid != ::getpid()) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      return errno_status("pipe2", errno).with_context("flight recorder signal");
    // The handler must never block: a full pipe already has a dump pending.
    ::fcntl(fds[1], F_SETFL, ::fcntl(fds[1], F_GETFL) | O_NONBLOCK);
    g_pipe_write_fd = fds[1];
    g_handler_pid = ::getpid();
    std::thread(dump_thread, fds[0]).detach();
    table.dump_thread_pid = ::getpid();
  }
  struct sigaction action {};
  action.sa_handler = on_dump_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (::sigaction(signal, &action, nullptr) != 0) {
    return errno_status("sigaction", errno).with_context(fmt::format("flight recorder signal {}", signal));
  }
  table.signals.insert(signal);
  return ok_status();
}

StatusOr<int> parse_flight_recorder_signal(const char* value) {
  if (value == nullptr || *value == '\0') return kDefaultFlightRecorderSignal;
  std::string name = upper(value);
  if (name == "OFF" || name == "NONE" || name == "0") return 0;
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  if (name == "USR1") return SIGUSR1;
  if (name == "USR2") return SIGUSR2;
  char* end = nullptr;
  long number = std::strtol(name.c_str(), &end, 10);
  if (end != name.c_str() && *end == '\0' && number > 0 && number < NSIG && number != SIGKILL &&
      number != SIGSTOP) {
    return static_cast<int>(number);
  }
  return invalid_argument_error("{}={:?} is not a signal; use USR1, USR2, a signal number, or off",
                                kFlightRecorderSignalEnv, value);
}

void install_flight_recorder_signal_from_environment() {
  // Once per process (a forked child installs its own).
  static std::atomic<pid_t> installed_in{0};
  const pid_t me = ::getpid();
  if (installed_in.exchange(me) == me) return;
  [] {
    const char* value = std::getenv(kFlightRecorderSignalEnv);
    StatusOr<int> signal = parse_flight_recorder_signal(value);
    if (!signal.ok()) {
      spdlog::warn("flight recorder: {}; no dump signal installed", signal.status().message());
      return;
    }
    if (*signal == 0) return;
    const bool asked = value != nullptr && *value != '\0';
    if (!asked) {
      // By default only a signal nobody handles: the program's own handler wins.
      struct sigaction current {};
      if (::sigaction(*signal, nullptr, &current) != 0) return;
      if (current.sa_handler != SIG_DFL && current.sa_handler != on_dump_signal) return;
    }
    Status status = install_flight_recorder_signal_handler(*signal);
    if (!status.ok()) spdlog::warn("flight recorder: no dump signal: {}", status.to_string());
  }();
}

}  // namespace cohort::comm
