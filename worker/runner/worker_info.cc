#include "worker/runner/worker_info.h"

#include <torch/version.h>
#include <ucp/api/ucp.h>

#include "worker/base/version.h"

namespace cohort::worker {

std::string version_string() {
  return std::string("cohort-worker ") + kVersion + " (libtorch " + TORCH_VERSION + ", UCX " +
         ucp_get_version_string() + ")";
}

}  // namespace cohort::worker
