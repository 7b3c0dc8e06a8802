#include "worker/train/host_allocator.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>
#include <initializer_list>

namespace cohort::train {
namespace {

bool set_in_environment(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0';
}

}  // namespace

bool tune_host_allocator() {
#if defined(__GLIBC__)
  for (const char* name :
       {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"}) {
    if (set_in_environment(name)) return false;
  }
  const char* choice = std::getenv("COHORT_HOST_ALLOCATOR");
  if (choice != nullptr && std::strcmp(choice, "default") == 0) return false;
  // Setting either threshold also turns glibc's dynamic adjustment of both off.
  bool mmap_set = mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHostMmapThresholdBytes)) == 1;
  bool trim_set = mallopt(M_TRIM_THRESHOLD, static_cast<int>(kHostTrimThresholdBytes)) == 1;
  return mmap_set && trim_set;
#else
  return false;
#endif
}

}  // namespace cohort::train
