#pragma once

#include <string>

namespace cohort::worker {

// "cohort-worker 0.1.0 (libtorch 1.13.1, UCX 1.13.1)": what this worker was built against.
std::string version_string();

}  // namespace cohort::worker
