// Binding the ranks a launcher starts on one node to cores, as mpirun does (it binds each rank to a
// core when it starts two or fewer). A rank bound to its own core keeps its caches and is never
// moved onto its peer's core, where the two would take turns. The cost: a bound rank cannot move
// away from a core that another busy process shares. On this 2-core machine with a compiler
// running, 2 unbound ranks took 4 us for an 8-byte allreduce in 3 of 4 runs and bound ones
// 0.3-0.7 us, while a bound 1 MiB allreduce took up to 1.3 ms against 0.14 ms unbound. That is why
// binding is asked for (`--cpu-bind core|auto`, COHORT_CPU_BIND) and not the default.
#pragma once

#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort {

// kCore: one share of the CPUs per local rank, an error with more ranks than CPUs; kAuto: the
// same when every rank can have a CPU, nothing otherwise (mpirun's default: bound to cores for 2
// ranks, left alone when oversubscribed).
enum class CpuBind { kNone, kCore, kAuto };

// "none", "core" or "auto" (also from COHORT_CPU_BIND); anything else is INVALID_ARGUMENT naming the value.
StatusOr<CpuBind> parse_cpu_bind(const std::string& text);
inline constexpr const char* kCpuBindEnv = "COHORT_CPU_BIND";

// The CPUs local rank `local_rank` of `local_size` gets out of `allowed` (ascending): the
// local_rank-th of local_size equal, contiguous shares (the first allowed % local_size shares
// take one more). With fewer CPUs than ranks, FAILED_PRECONDITION naming both counts: one core
// per rank cannot be given, and sharing is the scheduler's job.
StatusOr<std::vector<int>> cpu_share(const std::vector<int>& allowed, int local_rank, int local_size);

// The CPUs this process may run on (sched_getaffinity), ascending.
StatusOr<std::vector<int>> allowed_cpus();

// Every local rank's CPUs under `bind` (each empty when nothing is bound: kNone, or kAuto with
// fewer CPUs than ranks); kCore with fewer CPUs than ranks is cpu_share's error. A launcher plans
// in the parent, before it forks, so that the children only call bind_to_cpus.
StatusOr<std::vector<std::vector<int>>> plan_local_ranks(CpuBind bind, int local_size);

// Binds the calling thread (and the threads it starts later: call it in a launcher's child before
// exec) to `cpus`; nothing for an empty list. Allocates only to report an error.
Status bind_to_cpus(const std::vector<int>& cpus);

// plan_local_ranks and bind_to_cpus for one rank. Returns the CPUs bound to (empty: none).
StatusOr<std::vector<int>> bind_local_rank(CpuBind bind, int local_rank, int local_size);

// How many CPU threads (libtorch's intra-op pool, OpenBLAS's) one of `local_size` ranks on this
// node should run: OMP_NUM_THREADS when it holds a count in 1..kMaxCpuThreads (the job's choice, or
// the share cohortd's agent computed from its slots; of a nested list such as "4,2" the first
// level, as libgomp reads it), else this process's CPUs (its affinity, not every CPU of the
// machine) divided by local_size, at least 1. A value that is set but holds no such count is
// ignored, and `ignored` (if given) receives it.
inline constexpr long kMaxCpuThreads = 1L << 20;
int cpu_threads_for_rank(int local_size, std::string* ignored = nullptr);

// "0-3", "0,2,5-6": the form taskset and /proc/<pid>/status use.
std::string format_cpu_list(const std::vector<int>& cpus);

}  // namespace cohort
