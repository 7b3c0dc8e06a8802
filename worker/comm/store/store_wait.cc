#include "worker/comm/store/store_wait.h"

#include <algorithm>

#include <fmt/format.h>

namespace cohort::comm {
namespace {

// More keys than this are summarised as "... and N more".
constexpr size_t kMaxKeysInMessage = 8;

}  // namespace

Duration clamp_store_timeout(Duration timeout) { return std::clamp(timeout, Duration(0), kMaxStoreTimeout); }

std::string format_keys(const std::vector<std::string>& keys) {
  std::string out = "[";
  for (size_t i = 0; i < keys.size() && i < kMaxKeysInMessage; ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("{:?}", keys[i]);
  }
  if (keys.size() > kMaxKeysInMessage)
    out += fmt::format(", ... and {} more", keys.size() - kMaxKeysInMessage);
  return out + "]";
}

Status keys_timeout_error(std::string_view store, const std::vector<std::string>& missing, size_t all_keys,
                          Duration waited) {
  const std::string what = missing.size() == 1 ? fmt::format("key {:?}", missing[0])
                                               : fmt::format("keys {}", format_keys(missing));
  return deadline_exceeded_error(
      "{}: timed out after {} waiting for {} ({} of {} keys missing); the ranks that set them may "
      "not have started, may have failed, or may use a different store — check their logs, or "
      "raise the timeout",
      store, format_duration(clamp_store_timeout(waited)), what, missing.size(), all_keys);
}

}  // namespace cohort::comm
