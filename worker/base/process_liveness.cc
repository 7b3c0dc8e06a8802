#include "worker/base/process_liveness.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cohort {

bool read_proc_stat(int pid, char* state, uint64_t* start_time) {
  if (pid <= 0) return false;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* file = std::fopen(path, "re");
  if (file == nullptr) return false;
  char text[1024];
  size_t length = std::fread(text, 1, sizeof(text) - 1, file);
  std::fclose(file);
  text[length] = '\0';
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
  char state = '?';
  read_proc_stat(self.pid, &state, &self.start_time);
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
  if (!read_proc_stat(process.pid, &state, &start)) return true;
  return start != process.start_time || state == 'Z' || state == 'X';
}

}  // namespace cohort
