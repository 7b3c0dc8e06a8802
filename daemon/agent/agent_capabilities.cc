#include "daemon/agent/agent_capabilities.h"

#include <errno.h>
#include <linux/capability.h>
#include <sys/syscall.h>
#include <unistd.h>

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

Status check_root_agent_capabilities() {
  if (::geteuid() != 0) return ok_status();
  COHORT_ASSIGN_OR_RETURN(bool ptrace, has_effective_capability(CAP_SYS_PTRACE));
  if (ptrace) return ok_status();
  return failed_precondition_error(
      "cohortd runs as root without CAP_SYS_PTRACE in its effective capabilities: it could not read its "
      "jobs' /proc/<pid>/stat and /proc/<pid>/environ (they run as other users; under ProtectProc=invisible "
      "their /proc entries are hidden), so stopped-rank detection and the cleanup of processes an earlier "
      "run left behind would silently do nothing; add CAP_SYS_PTRACE to CapabilityBoundingSet in the "
      "systemd unit (deploy/cohortd.service has it), or --cap-add SYS_PTRACE for a container");
}

}  // namespace cohort::agent
