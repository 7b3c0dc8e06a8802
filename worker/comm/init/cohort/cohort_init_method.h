#pragma once

// The `cohort://host:port/<job>` init method: a worker started by a cohortd agent joins its job
// attempt's rendezvous on the coordinator and bootstraps through the coordinator-kept store.
//
//   cohort://10.0.0.1:7070/mnist-3?attempt=2&local_rank=1
//
//   host:port   the coordinator's gRPC address
//   <job>       the job id
//   attempt     the attempt number (default 1); a restarted attempt never sees an older one's keys
//   local_rank  this worker's slot on its node (or InitOptions::local_rank); required
//   rank        optional: when given, must equal the rank the coordinator assigns
// The node is InitOptions::node_id (COHORT_NODE_ID, else the host name), as the node registered.
//
// Join blocks until every rank of the attempt has joined (up to InitOptions::timeout) and answers
// rank, world size, local rank and size, and the master address; the Bootstrap's store is a
// RendezvousStore following the same leader (several coordinators: the one that leads now).
//
// worker/comm's init library knows nothing of gRPC: a worker calls register_cohort_init_method()
// once at startup, after which resolve_init understands cohort:// URLs.
//
//   COHORT_RETURN_IF_ERROR(register_cohort_init_method());
//   COHORT_ASSIGN_OR_RETURN(Bootstrap boot, resolve_init(InitOptions::from_url(url)));

#include "worker/base/status.h"
#include "worker/comm/init/init_options.h"
#include "worker/comm/init/init_url.h"

namespace cohort::comm {

// Registers cohort:// with resolve_init. Idempotent (OK when already registered); thread-safe.
Status register_cohort_init_method();

// The method itself (what register_cohort_init_method registers): parses `url`, joins the
// rendezvous, returns the Bootstrap. INVALID_ARGUMENT names the URL part at fault; the
// coordinator's errors (DEADLINE_EXCEEDED naming missing ranks, FAILED_PRECONDITION for an
// attempt that is over, UNAVAILABLE when unreachable) come back with the RPC and address in front.
// Blocking, up to options.timeout.
StatusOr<Bootstrap> cohort_init(const InitUrl& url, const InitOptions& options);

}  // namespace cohort::comm
