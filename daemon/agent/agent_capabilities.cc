#include "daemon/agent/agent_capabilities.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace cohort::agent {

StatusOr<bool> has_effective_capability(int capability) {
  if (capability < 0 || capability >= 64) {
    return invalid_argument_error("capability {} is not a Linux capability number (0..63)", capability);
  }
  // No libcap dependency for one call: the raw system call with the 64-bit (version 3) layout.
  __user_cap_header_struct header{};
  header.version = _LINUX_CAPABILITY_VERSION_3;
  header.pid = 0;  // the calling thread
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return errno_status("capget", errno);
  return (data[capability / 32].effective & (1u << (capability % 32))) != 0;
}

namespace {

std::vector<std::string_view> split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  while (true) {
    const size_t end = text.find(separator);
    parts.push_back(text.substr(0, end));
    if (end == std::string_view::npos) return parts;
    text.remove_prefix(end + 1);
  }
}

}  // namespace

std::string proc_hidepid_option(std::string_view mountinfo) {
  std::string found;
  for (std::string_view line : split(mountinfo, '\n')) {
    // "<id> <parent> <major:minor> <root> <mount point> <options> [optional...] - <type> <source> <super options>"
    std::vector<std::string_view> fields;
    for (std::string_view field : split(line, ' ')) {
      if (!field.empty()) fields.push_back(field);
    }
    size_t dash = 6;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash + 3 >= fields.size() || fields[4] != "/proc" || fields[dash + 1] != "proc") continue;
    found.clear();
    for (std::string_view option : split(fields[dash + 3], ',')) {
      if (option.rfind("hidepid=", 0) == 0 && option != "hidepid=0" && option != "hidepid=off")
        found = std::string(option);
    }
  }
  return found;
}

Status decide_root_agent_capabilities(bool root, bool sys_ptrace, std::string_view hidepid,
                                      std::string* warning) {
  warning->clear();
  if (!root || sys_ptrace) return ok_status();
  if (!hidepid.empty()) {
    return failed_precondition_error(
        "cohortd runs as root without CAP_SYS_PTRACE in its effective capabilities and /proc is mounted with "
        "{} (/proc/self/mountinfo): its jobs' /proc/<pid> entries (they run as other users) are hidden from it, "
        "so stopped-rank detection and the cleanup of processes an earlier run left behind would silently do "
        "nothing; add CAP_SYS_PTRACE to CapabilityBoundingSet in the systemd unit (deploy/cohortd.service has "
        "it), or --cap-add SYS_PTRACE for a container",
        hidepid);
  }
  *warning =
      "cohortd runs as root without CAP_SYS_PTRACE in its effective capabilities: it cannot read the "
      "/proc/<pid>/environ of its jobs' processes (they run as other users), so processes left behind by a "
      "crashed or killed agent are not found and not killed at start (stopped-rank detection works: /proc "
      "has no hidepid); add CAP_SYS_PTRACE to CapabilityBoundingSet in the systemd unit "
      "(deploy/cohortd.service has it), or --cap-add SYS_PTRACE for a container";
  return ok_status();
}

Status check_root_agent_capabilities(std::string* warning) {
  warning->clear();
  if (::geteuid() != 0) return ok_status();
  COHORT_ASSIGN_OR_RETURN(bool ptrace, has_effective_capability(CAP_SYS_PTRACE));
  if (ptrace) return ok_status();
  std::ifstream file("/proc/self/mountinfo");
  if (!file) return errno_status("reading /proc/self/mountinfo (is /proc mounted?)", errno);
  std::stringstream text;
  text << file.rdbuf();
  return decide_root_agent_capabilities(true, false, proc_hidepid_option(text.str()), warning);
}

}  // namespace cohort::agent
