#pragma once

// The Status <-> grpc::Status mapping lives in the worker library (worker/base/grpc_status.h), which
// workers and the installed library use without the daemon; the daemon's code keeps its names.

#include "worker/base/grpc_status.h"

namespace cohort::daemon {

using cohort::from_grpc_status;
using cohort::to_grpc_status;

}  // namespace cohort::daemon
