// Fuzzes cohortd's config file parser (daemon/server/daemon_config.h: DaemonConfig::apply_yaml).
// Invariants: never crashes; a failed apply says what is wrong; options() then either succeeds or
// names what is missing.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "daemon/server/daemon_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  cohort::daemon::DaemonConfig config;
  const cohort::Status status = config.apply_yaml(text, "fuzz.yaml");
  const auto options = config.options();
  if ((!status.ok() && status.message().empty()) || (!options.ok() && options.status().message().empty())) {
    std::fprintf(stderr, "daemon_config_fuzzer: an error without a message\n");
    std::abort();
  }
  return 0;
}
