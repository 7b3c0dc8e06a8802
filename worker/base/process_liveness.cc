#include "worker/base/process_liveness.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace cohort {

bool read_proc_stat(int pid, char* state, uint64_t* start_time) {
  if (pid <= 0) {
    errno = ESRCH;
    return false;
  }
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return false;  // errno from fopen: ENOENT when there is no such process
  char text[1024];
  size_t length = std::fread(text, 1, sizeof(text) - 1, file);
  const bool read_failed = std::ferror(file) != 0;
  const int read_errno = errno;
  std::fclose(file);
  if (length == 0) {
    // An exit between open and read leaves an empty read (ESRCH); anything else is the read's own.
    errno = read_failed ? read_errno : ESRCH;
    return false;
  }
  text[length] = '\0';
  errno = EIO;  // for the malformed cases below
  // The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
  const char* paren = std::strrchr(text, ')');
  if (paren == nullptr || paren[1] != ' ') return false;
  const char* field = paren + 2;
  // Field 3 is the state; field 22 the start time (fields counted from 1, the pid).
  for (int i = 3; i <= 22; ++i) {
    while (*field == ' ') ++field;
    if (*field == '\0') return false;
    if (i == 3) *state = *field;
    if (i == 22) {
      *start_time = std::strtoull(field, nullptr, 10);
      return true;
    }
    while (*field != ' ' && *field != '\0') ++field;
  }
  return false;
}

ProcessIdentity this_process() {
  ProcessIdentity self;
  self.pid = static_cast<int>(getpid());
  std::ifstream("/proc/sys/kernel/random/boot_id") >> self.boot_id;
  struct stat ns {};
  if (stat("/proc/self/ns/pid", &ns) == 0) self.pid_namespace = static_cast<uint64_t>(ns.st_ino);
  // /proc/self names this process only if /proc belongs to its pid namespace.
  FILE* file = std::fopen("/proc/self/stat", "re");
  int listed = -1;
  if (file != nullptr) {
    if (std::fscanf(file, "%d", &listed) != 1) listed = -1;
    std::fclose(file);
  }
  char state = '?';
  if (listed == self.pid) read_proc_stat(self.pid, &state, &self.start_time);
  return self;
}

bool process_visible(const ProcessIdentity& process) {
  char state = '?';
  uint64_t start = 0;
  return process.start_time != 0 && read_proc_stat(process.pid, &state, &start) && start == process.start_time &&
         state != 'Z' && state != 'X';
}

bool process_gone(const ProcessIdentity& process) {
  char state = '?';
  uint64_t start = 0;
  if (!read_proc_stat(process.pid, &state, &start)) return errno == ENOENT || errno == ESRCH;
  return start != process.start_time || state == 'Z' || state == 'X';
}

}  // namespace cohort
