#pragma once

// Pieces shared by every Store's blocking calls: the deadline of a wait and the one error text a
// wait that runs out produces, so a timeout reads the same from every store:
//   tcp store 127.0.0.1:4567: timed out after 200 ms waiting for key "rank/3/addr" (1 of 2 keys
//   missing); the ranks that set them may not have started, may have failed, or may use another
//   store ...

#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"

namespace cohort::comm {

// The longest wait a store honours. Longer timeouts (Duration::max() included) are clamped to it
// so deadline arithmetic cannot overflow; a year is "forever" for a bootstrap.
inline constexpr Duration kMaxStoreTimeout = std::chrono::hours(24 * 365);

// The deadline for a store wait of `timeout` (negative counts as 0, huge as kMaxStoreTimeout).
Duration clamp_store_timeout(Duration timeout);
inline Deadline store_deadline(Duration timeout) { return Deadline::after(clamp_store_timeout(timeout)); }

// `["a", "b", ...]`: keys quoted, the list cut after a few so a 1000-rank wait stays readable.
std::string format_keys(const std::vector<std::string>& keys);

// DEADLINE_EXCEEDED for a wait on `store` (e.g. "file store /tmp/x") that gave up after `waited`
// with `missing` (a subset of `all_keys`) still unset.
Status keys_timeout_error(std::string_view store, const std::vector<std::string>& missing, size_t all_keys,
                          Duration waited);

}  // namespace cohort::comm
