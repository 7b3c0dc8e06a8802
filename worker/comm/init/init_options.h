#pragma once

// Init methods, as torch.distributed's init_process_group(init_method=...): an InitOptions (a URL
// plus optional overrides) resolves to a Bootstrap — a connected Store and this process's place
// in the job (rank, world size, rank on its node).
//
//   InitOptions options = InitOptions::from_url("env://");   // torchrun / srun / mpirun variables
//   COHORT_ASSIGN_OR_RETURN(Bootstrap boot, resolve_init(options));
//   COHORT_RETURN_IF_ERROR(boot.store->set(fmt::format("addr/{}", boot.rank), my_address));
//
// Schemes: env:// and tcp://host:port (rank 0 serves a TcpStore, the others connect), file:///path
// (a FileStore), and whatever register_init_method adds (the control plane adds cohort://).
//
// Precedence for rank, world_size, local_rank, local_world_size: InitOptions fields, then the
// URL query (?rank=1&world_size=4; both given and different is an error), then, for env:// only,
// the environment. A local rank or size still unknown is derived through the store: every rank
// publishes its node id, and ranks sharing one count as a node.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/init/environment.h"
#include "worker/comm/init/init_url.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

struct InitOptions {
  std::string url = "env://";  // env://, tcp://host:port[?rank=R&world_size=N], file:///path[?...]
                               // (file:// assigns ranks in arrival order when none is given)
  int rank = -1;               // this process's rank; -1: from the URL query or the environment
  int world_size = -1;         // number of ranks; -1: from the URL query or the environment
  int local_rank = -1;         // rank among this node's ranks; -1: URL, environment, else derived
  int local_world_size = -1;   // ranks on this node; -1: URL, environment, else derived
  std::string node_id;         // groups ranks into nodes; "": COHORT_NODE_ID, else the host name
  std::string group_name;      // file:// only: a namespace in the file (also ?group_name=); "": default
  Duration timeout = kDefaultStoreTimeout;  // limit for reaching the store and for the init exchange
  EnvLookup env;  // environment variables; empty: the process's (tests inject a map)

  // Options with `url` and every other field at its default. Never fails: a bad URL is reported
  // by resolve_init.
  static InitOptions from_url(std::string_view url);
};

// What a process needs to join the job: the store and its coordinates in the job.
struct Bootstrap {
  std::shared_ptr<Store> store;  // shared by everything built on this init
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;         // among the ranks with the same node_id, in rank order
  int local_world_size = -1;   // ranks with the same node_id
  std::string node_id;         // this process's node (COHORT_NODE_ID or host name)
  std::string master_address;  // rank 0's host (env:// MASTER_ADDR, tcp:// host); "" for file://
};

// Resolves `options`: parses the URL, runs its scheme's init method (blocking until the store is
// reachable, up to options.timeout), fills in the node id and local ranks, and checks that the
// numbers agree (0 <= rank < world_size, ...). INVALID_ARGUMENT names the URL, variable or field
// at fault and what to set; DEADLINE_EXCEEDED / UNAVAILABLE come from the store. Thread-safe.
StatusOr<Bootstrap> resolve_init(const InitOptions& options);

// An init method: given the parsed URL and the options (with the URL query already merged into
// rank/world_size/local_*; env filled in), returns a Bootstrap with at least store, rank and
// world_size set. local_rank/local_world_size may stay -1 (resolve_init derives them); node_id
// is already in options.node_id.
using InitMethod = std::function<StatusOr<Bootstrap>(const InitUrl& url, const InitOptions& options)>;

// Makes resolve_init handle URLs of `scheme` ("cohort" for cohort://...) with `method`.
// ALREADY_EXISTS if the scheme has a method (env, tcp and file are built in). Thread-safe.
Status register_init_method(std::string scheme, InitMethod method);

// The schemes resolve_init handles, sorted ("env", "file", "tcp", ...).
std::vector<std::string> init_method_schemes();

}  // namespace cohort::comm
