#pragma once

// Slurm's compressed host lists (SLURM_JOB_NODELIST, SLURM_STEP_NODELIST), expanded the way
// `scontrol show hostnames` does, without running scontrol: a library must not fork a Slurm
// client (it may not be installed on the compute node, and the init path must stay fast).
//
//   expand_slurm_hostlist("node[01-03,07],gpu3")  →  node01 node02 node03 node07 gpu3
//
// Syntax: comma-separated entries; an entry is a host name in which each `[...]` holds a
// comma-separated list of numbers or `lo-hi` ranges. A range keeps the zero padding of its low
// end (`[08-10]` → 08 09 10), as Slurm prints it. Several bracket groups in one entry
// (`rack[1-2]-n[1-2]`) expand to every combination, first group slowest.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"

namespace cohort::comm {

// Upper bound on the hosts one list may expand to: far above any real cluster, low enough that
// a garbled `n[0-99999999999]` fails with a message instead of exhausting memory. Slurm itself
// caps a job's node count well below this.
constexpr size_t kMaxSlurmHostlistHosts = size_t{1} << 20;

// Every host in `hostlist`, in order (duplicates kept, as Slurm does). INVALID_ARGUMENT on
// malformed input (empty list or entry, unbalanced or nested brackets, a range that is not
// digits, lo > hi) or on more than `max_hosts` hosts; the message quotes the list and says where
// and what is wrong. Pure function, thread-safe.
StatusOr<std::vector<std::string>> expand_slurm_hostlist(std::string_view hostlist,
                                                         size_t max_hosts = kMaxSlurmHostlistHosts);

}  // namespace cohort::comm
