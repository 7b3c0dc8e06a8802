#pragma once

// The capabilities a root agent must hold to watch its jobs' processes. Its ranks run as other
// users (job_user, user_map), and the agent reads their /proc/<pid>/stat (stopped-rank detection,
// process_launcher.h) and /proc/<pid>/environ (leftover_tasks.h). Reading another uid's environ
// needs PTRACE_MODE_READ access, and under hidepid=invisible (systemd's ProtectProc=invisible)
// /proc/<pid> of another uid is not even listed without it: for root, that access is
// CAP_SYS_PTRACE. Without it both checks silently find nothing, so a root agent refuses to start.
//
// Example (cohortd's agent start-up):
//   COHORT_RETURN_IF_ERROR(check_root_agent_capabilities());

#include "worker/base/status.h"

namespace cohort::agent {

// Whether the calling thread holds `capability` (CAP_*, linux/capability.h) in its effective set
// (capget). Non-blocking.
StatusOr<bool> has_effective_capability(int capability);

// OK when the agent does not run as root (its jobs run as itself: no capability is needed), or
// runs as root holding CAP_SYS_PTRACE in its effective set. FAILED_PRECONDITION naming
// CAP_SYS_PTRACE, what stops working without it, and the fix (deploy/cohortd.service's
// CapabilityBoundingSet; a container's --cap-add SYS_PTRACE) otherwise. Non-blocking.
Status check_root_agent_capabilities();

}  // namespace cohort::agent
