#include "worker/base/cpu_binding.h"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace cohort {

StatusOr<CpuBind> parse_cpu_bind(const std::string& text) {
  if (text == "none") return CpuBind::kNone;
  if (text == "core") return CpuBind::kCore;
  if (text == "auto") return CpuBind::kAuto;
  return invalid_argument_error("CPU binding '{}' is not one of: none, core, auto", text);
}

StatusOr<std::vector<int>> cpu_share(const std::vector<int>& allowed, int local_rank, int local_size) {
  if (local_size <= 0 || local_rank < 0 || local_rank >= local_size) {
    return invalid_argument_error("local rank {} of {} is not a rank of that many", local_rank, local_size);
  }
  const int cpus = static_cast<int>(allowed.size());
  if (cpus < local_size) {
    return failed_precondition_error(
        "cannot bind {} local ranks to cores: this process may run on {} CPU(s) ({}); run with "
        "--cpu-bind none (COHORT_CPU_BIND=none) or fewer ranks",
        local_size, cpus, format_cpu_list(allowed));
  }
  const int base = cpus / local_size, extra = cpus % local_size;
  const int first = local_rank * base + std::min(local_rank, extra);
  const int count = base + (local_rank < extra ? 1 : 0);
  return std::vector<int>(allowed.begin() + first, allowed.begin() + first + count);
}

StatusOr<std::vector<int>> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) {
    return internal_error("sched_getaffinity: {}", std::strerror(errno));
  }
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int cpu_threads_for_rank(int local_size, std::string* ignored) {
  if (const char* text = std::getenv("OMP_NUM_THREADS"); text != nullptr && *text != '\0') {
    // As libgomp reads it: spaces around the number, and of a nested list ("4,2") the first level.
    char* end = nullptr;
    errno = 0;
    const long value = std::strtol(text, &end, 10);
    while (*end == ' ' || *end == '\t') ++end;
    const bool whole = *end == '\0' || *end == ',';
    if (end != text && whole && errno == 0 && value > 0 && value <= kMaxCpuThreads) return static_cast<int>(value);
    if (ignored != nullptr) *ignored = text;
  }
  StatusOr<std::vector<int>> allowed = allowed_cpus();
  const int cpus = allowed.ok() && !allowed->empty() ? static_cast<int>(allowed->size()) : 1;
  return std::max(1, cpus / std::max(1, local_size));
}

StatusOr<std::vector<std::vector<int>>> plan_local_ranks(CpuBind bind, int local_size) {
  if (local_size <= 0) return invalid_argument_error("{} local ranks: need at least 1", local_size);
  std::vector<std::vector<int>> plan(static_cast<size_t>(local_size));
  if (bind == CpuBind::kNone) return plan;
  COHORT_ASSIGN_OR_RETURN(std::vector<int> allowed, allowed_cpus());
  if (bind == CpuBind::kAuto && static_cast<int>(allowed.size()) < local_size) return plan;
  for (int rank = 0; rank < local_size; ++rank) {
    COHORT_ASSIGN_OR_RETURN(plan[static_cast<size_t>(rank)], cpu_share(allowed, rank, local_size));
  }
  return plan;
}

Status bind_to_cpus(const std::vector<int>& cpus) {
  if (cpus.empty()) return ok_status();
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : cpus) CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) {
    return internal_error("binding to CPUs {}: sched_setaffinity: {}", format_cpu_list(cpus), std::strerror(errno));
  }
  return ok_status();
}

StatusOr<std::vector<int>> bind_local_rank(CpuBind bind, int local_rank, int local_size) {
  COHORT_ASSIGN_OR_RETURN(auto plan, plan_local_ranks(bind, local_size));
  if (local_rank < 0 || local_rank >= local_size) {
    return invalid_argument_error("local rank {} of {} is not a rank of that many", local_rank, local_size);
  }
  std::vector<int>& mine = plan[static_cast<size_t>(local_rank)];
  COHORT_RETURN_IF_ERROR(bind_to_cpus(mine));
  return std::move(mine);
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace cohort
