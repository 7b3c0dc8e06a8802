#include "daemon/agent/leftover_tasks.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string_view>

namespace cohort::agent {
namespace {

// A /proc file's bytes ("" when it cannot be read).
std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Finds `name` in a NUL-separated environment block and sets `value`; false when it is absent.
bool find_variable(const std::string& block, std::string_view name, std::string* value) {
  size_t start = 0;
  while (start < block.size()) {
    size_t end = block.find('\0', start);
    if (end == std::string::npos) end = block.size();
    std::string_view entry(block.data() + start, end - start);
    if (entry.size() > name.size() && entry.substr(0, name.size()) == name && entry[name.size()] == '=') {
      *value = std::string(entry.substr(name.size() + 1));
      return true;
    }
    start = end + 1;
  }
  return false;
}

}  // namespace

std::vector<LeftoverTask> find_leftover_tasks(const std::string& job_dir_root, const std::string& proc_root) {
  std::vector<LeftoverTask> found;
  if (job_dir_root.empty()) return found;
  std::string prefix = job_dir_root;
  while (prefix.size() > 1 && prefix.back() == '/') prefix.pop_back();
  prefix += '/';
  DIR* dir = ::opendir(proc_root.c_str());
  if (dir == nullptr) return found;
  const pid_t self = ::getpid();
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || pid <= 0 || pid == self) continue;
    const std::string base = proc_root + "/" + entry->d_name;
    std::string job_dir;
    if (!find_variable(read_all(base + "/environ"), kJobDirVariable, &job_dir)) continue;
    if (job_dir.size() <= prefix.size() || job_dir.compare(0, prefix.size(), prefix) != 0) continue;
    std::string command = read_all(base + "/cmdline");
    while (!command.empty() && command.back() == '\0') command.pop_back();
    for (char& c : command) c = c == '\0' ? ' ' : c;
    found.push_back(LeftoverTask{static_cast<pid_t>(pid), job_dir, command});
  }
  ::closedir(dir);
  return found;
}

std::vector<LeftoverTask> kill_leftover_tasks(const std::string& job_dir_root) {
  std::vector<LeftoverTask> tasks = find_leftover_tasks(job_dir_root);
  // A pid read a moment ago names the same process now: a reused pid would have to be a new
  // process started with a COHORT_JOB_DIR under this agent's root, which only this agent starts.
  for (const LeftoverTask& task : tasks) ::kill(task.pid, SIGKILL);
  return tasks;
}

}  // namespace cohort::agent
