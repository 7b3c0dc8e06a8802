#pragma once

// The capabilities a root agent needs to watch its jobs' processes. Its ranks run as other
// users (job_user, user_map), and the agent reads their /proc/<pid>/stat (stopped-rank detection,
// process_launcher.h) and /proc/<pid>/environ (leftover_tasks.h). Reading another uid's environ
// needs PTRACE_MODE_READ access, which for root is CAP_SYS_PTRACE; /proc/<pid>/stat is
// world-readable unless /proc is mounted with hidepid= (systemd's ProtectProc=invisible), which
// hides another uid's /proc/<pid> altogether from a root without CAP_SYS_PTRACE. So:
//   - root, no CAP_SYS_PTRACE, /proc with hidepid: stopped-rank detection and the cleanup of
//     leftover processes would both find nothing, silently: the agent refuses to start;
//   - root, no CAP_SYS_PTRACE, plain /proc (a default Docker or Kubernetes container, whose
//     capability sets lack SYS_PTRACE): stopped ranks are seen, only the leftover processes of a
//     crashed agent are not found: it starts with one warning naming that and the fix.
//
// Example (cohortd's agent start-up):
//   std::string warning;
//   COHORT_RETURN_IF_ERROR(check_root_agent_capabilities(&warning));
//   if (!warning.empty()) spdlog::warn("{}", warning);

#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::agent {

// Whether the calling thread holds `capability` (CAP_*, linux/capability.h) in its effective set
// (capget). Non-blocking.
StatusOr<bool> has_effective_capability(int capability);

// The option of the proc mount at /proc in `mountinfo` (the text of /proc/self/mountinfo,
// proc(5)) that hides other users' /proc/<pid> from a root without CAP_SYS_PTRACE, e.g.
// "hidepid=invisible" (any hidepid= but 0 / off), or "" when there is none or no proc mount at
// /proc. The last such mount wins (it is the one on top). subset=pid does not count: it hides only
// /proc's entries that are not processes. Pure.
std::string proc_hidepid_option(std::string_view mountinfo);

// The decision, from what was found: OK with `warning` cleared when `root` is false (its jobs run
// as itself) or `sys_ptrace` holds; FAILED_PRECONDITION naming CAP_SYS_PTRACE, the `hidepid`
// option, what goes blind and the fix when root lacks it under hidepid; otherwise OK with
// `warning` saying what does not work (leftover processes of a crashed agent are not found) and
// the fix (deploy/cohortd.service's CapabilityBoundingSet; a container's --cap-add SYS_PTRACE).
Status decide_root_agent_capabilities(bool root, bool sys_ptrace, std::string_view hidepid,
                                      std::string* warning);

// decide_root_agent_capabilities for this process (geteuid, capget, /proc/self/mountinfo, read
// only when root lacks CAP_SYS_PTRACE). Non-blocking.
Status check_root_agent_capabilities(std::string* warning);

}  // namespace cohort::agent
