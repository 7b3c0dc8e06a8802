#pragma once

// The job ids an agent accepts. An id becomes a path component under the agent's data directory
// (logs/<job_id>/, jobs/<job_id>/), so anything that could leave it ("..", "/") or hide in it is
// refused at the edge, before any file is touched.

#include <cstddef>
#include <string>

#include "worker/base/status.h"

namespace cohort::agent {

// Letters, digits, '.', '_' and '-': the coordinator's job names (daemon/coordinator
// job_spec_validation.cc) followed by "-<sequence>".
inline constexpr const char* kJobIdCharacters = "letters, digits, '.', '_' or '-'";
// A 64-character job name, '-' and a 64-bit sequence number, with room to spare.
inline constexpr size_t kMaxJobIdLength = 128;

// OK when `job_id` is 1..kMaxJobIdLength of kJobIdCharacters and not "." or "..";
// INVALID_ARGUMENT naming the id (escaped) otherwise. `context` starts the message
// (e.g. "LaunchTasks").
Status validate_job_id(const std::string& job_id, const std::string& context);

}  // namespace cohort::agent
