#include "worker/comm/tsc_clock.h"

#include <fstream>
#include <string>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace cohort::comm {

namespace {

bool counter_usable_uncached() {
#if defined(__x86_64__)
  unsigned int eax = 0, ebx = 0, ecx = 0, edx = 0;
  // CPUID 0x80000007, EDX bit 8: the invariant counter (constant rate, runs in every C-state).
  if (__get_cpuid(0x80000007, &eax, &ebx, &ecx, &edx) == 0 || (edx & (1u << 8)) == 0) return false;
  std::ifstream source("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string name;
  return static_cast<bool>(source >> name) && name == "tsc";
#else
  return false;
#endif
}

}  // namespace

bool tsc_counter_usable() {
  static const bool usable = counter_usable_uncached();
  return usable;
}

}  // namespace cohort::comm
