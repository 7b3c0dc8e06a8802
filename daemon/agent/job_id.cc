#include "daemon/agent/job_id.h"

#include <fmt/format.h>

namespace cohort::agent {

Status validate_job_id(const std::string& job_id, const std::string& context) {
  if (job_id.empty()) return invalid_argument_error("{}: job_id is empty", context);
  if (job_id.size() > kMaxJobIdLength) {
    return invalid_argument_error("{}: job_id {:?} is {} characters; at most {} (kMaxJobIdLength) are allowed",
                                  context, job_id.substr(0, 32) + "...", job_id.size(), kMaxJobIdLength);
  }
  if (job_id == "." || job_id == "..") {
    return invalid_argument_error("{}: job_id {:?} is not a valid id; use {}", context, job_id, kJobIdCharacters);
  }
  for (char c : job_id) {
    const bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                         c == '_' || c == '-';
    if (!allowed) {
      return invalid_argument_error("{}: job_id {:?} has {:?}; a job id has only {}", context, job_id,
                                    std::string(1, c), kJobIdCharacters);
    }
  }
  return ok_status();
}

}  // namespace cohort::agent
