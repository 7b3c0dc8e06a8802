#include "worker/comm/init/init_methods.h"

#include <charconv>
#include <optional>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "worker/comm/init/agent_store_connector.h"
#include "worker/comm/init/file_rendezvous.h"
#include "worker/comm/init/launcher_environment.h"
#include "worker/comm/store/file_store.h"
#include "worker/comm/store/tcp_store.h"
#include "worker/comm/store/tcp_store_auth.h"

namespace cohort::comm {
namespace {

constexpr int kMaxPort = 65535;
constexpr const char* kSlurmTasksPerNode = "SLURM_TASKS_PER_NODE";

// One number env:// reads, from the first of `variables` that is set.
struct EnvField {
  const char* what;    // "rank", in messages
  const char* option;  // the InitOptions field that overrides it
  // In precedence order: torchrun, Open MPI, SLURM. mpirun run inside a Slurm allocation passes
  // the surrounding step's SLURM_PROCID on to its ranks; OMPI_COMM_WORLD_* describe the rank.
  std::vector<const char*> variables;
  int min;           // smallest valid value
  const char* hint;  // what to set
};

const EnvField kRankField{"rank",
                          "rank",
                          {"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"},
                          0,
                          "set RANK to this process's rank (0..WORLD_SIZE-1)"};
const EnvField kWorldSizeField{"world size",
                               "world_size",
                               {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"},
                               1,
                               "set WORLD_SIZE to the number of processes in the job"};
const EnvField kLocalRankField{"local rank",
                               "local_rank",
                               {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"},
                               0,
                               "set LOCAL_RANK to this process's rank on its node, or unset it"};
const EnvField kLocalWorldSizeField{
    "local world size",
    "local_world_size",
    {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", kSlurmTasksPerNode},
    1,
    "set LOCAL_WORLD_SIZE to the number of processes on this node, or unset it"};

bool parse_int(std::string_view text, int* value) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return !text.empty() && ec == std::errc() && ptr == end;
}

// SLURM_TASKS_PER_NODE: "4" or "4(x3)" mean 4 tasks on every node. Uneven layouts ("2(x3),1")
// have no single answer: nullopt, and the local size is derived through the store instead.
std::optional<int> uniform_slurm_tasks_per_node(std::string_view text) {
  const size_t paren = text.find('(');
  if (text.find(',') != std::string_view::npos) return std::nullopt;
  int tasks = 0;
  if (!parse_int(text.substr(0, paren), &tasks) || tasks < 1) return std::nullopt;
  return tasks;
}

// A value and where it came from ("RANK=3"), for range errors.
struct Sourced {
  int value = -1;
  std::string source;
};

// Reads `field` unless `given` (>= 0, from InitOptions or the URL) already settles it.
StatusOr<Sourced> read_field(const EnvLookup& env, const EnvField& field, int given) {
  if (given >= 0) return Sourced{given, fmt::format("{}={} (InitOptions or URL query)", field.option, given)};
  for (const char* name : field.variables) {
    const std::optional<std::string> text = env(name);
    if (!text) continue;
    if (std::string_view(name) == kSlurmTasksPerNode) {
      if (std::optional<int> tasks = uniform_slurm_tasks_per_node(*text))
        return Sourced{*tasks, fmt::format("{}={}", name, *text)};
      continue;  // best effort only
    }
    int value = -1;
    if (!parse_int(*text, &value) || value < field.min) {
      return invalid_argument_error("env:// init: {}={:?} is not an integer >= {}; {}", name, *text,
                                    field.min, field.hint);
    }
    return Sourced{value, fmt::format("{}={}", name, *text)};
  }
  return Sourced{};
}

Status missing_field_error(const EnvField& field) {
  return invalid_argument_error(
      "env:// init: the {} is not set: none of {} is in the environment; {} (torchrun, srun and mpirun set "
      "these), or set InitOptions::{}",
      field.what, fmt::join(field.variables, ", "), field.hint, field.option);
}

// MASTER_ADDR, else what the launcher implies (launcher_environment.h): srun's node list, or
// under mpirun an error that says which init URL to pass.
StatusOr<std::string> read_master_address(const EnvLookup& env) {
  const std::optional<std::string> address = env("MASTER_ADDR");
  if (!address && launched_by_mpirun(env)) return mpirun_without_master_address_error(env);
  if (!address && launched_by_srun(env)) return slurm_master_address(env);
  if (!address || address->empty()) {
    return invalid_argument_error(
        "env:// init: MASTER_ADDR is {}; set MASTER_ADDR to the host name or IP address of the node running "
        "rank 0",
        address ? "empty" : "not set");
  }
  return *address;
}

StatusOr<int> read_master_port(const EnvLookup& env) {
  const std::optional<std::string> text = env("MASTER_PORT");
  if (!text && launched_by_srun(env)) return slurm_master_port(env);
  if (!text) {
    return invalid_argument_error(
        "env:// init: MASTER_PORT is not set; set MASTER_PORT to a free TCP port on "
        "MASTER_ADDR (e.g. 29500)");
  }
  int port = 0;
  if (!parse_int(*text, &port) || port < 1 || port > kMaxPort) {
    return invalid_argument_error(
        "env:// init: MASTER_PORT={:?} is not a port number (1..{}); set MASTER_PORT to "
        "a free TCP port on MASTER_ADDR (e.g. 29500)",
        *text, kMaxPort);
  }
  return port;
}

// `context` ("tcp:// init \"tcp://...\"") starts the message.
Status check_rank(std::string_view context, const Sourced& rank, const Sourced& world_size) {
  if (rank.value < world_size.value) return ok_status();
  return invalid_argument_error("{}: rank {} is out of range for world size {} ({}, {}); ranks run 0..{}",
                                context, rank.value, world_size.value, rank.source, world_size.source,
                                world_size.value - 1);
}

// The query parameters resolve_init merged; built-in schemes take no others.
Status check_query(const InitUrl& url) {
  for (const auto& [name, value] : url.query) {
    if (name == "store" && url.scheme != "file") {
      if (value != "external" && value != "rank0") {
        return invalid_argument_error(
            "init URL {:?}: store={:?} is not a store mode; use store=rank0 (rank 0 serves the store, the "
            "default) or store=external (a standalone server, e.g. cohort-store, already listens there)",
            url.text, value);
      }
      continue;
    }
    if (name == "group_name" && url.scheme == "file") continue;
    if (name != "rank" && name != "world_size" && name != "local_rank" && name != "local_world_size") {
      return invalid_argument_error(
          "init URL {:?}: unknown query parameter {:?}; {}:// takes rank, world_size, local_rank, "
          "local_world_size{}",
          url.text, name, url.scheme, url.scheme == "file" ? ", group_name" : "");
    }
  }
  return ok_status();
}

// A tcp:// or file:// process's place in the job.
struct ExplicitRanks {
  Sourced rank;
  Sourced world_size;
  int local_rank = -1;        // -1: derived through the store
  int local_world_size = -1;  // -1: derived through the store
};

// tcp:// and file:// take the ranks from InitOptions or the URL query, else from the launcher's
// variables (RANK, OMPI_COMM_WORLD_*, SLURM_*: mpirun has no MASTER_ADDR for env://, so its
// ranks meet through a store named in the URL; see launcher_environment.h). MASTER_ADDR and
// MASTER_PORT are never read: the URL names the store. With `rank_optional` (file://) a missing
// rank stays -1: the store assigns it in arrival order.
StatusOr<ExplicitRanks> explicit_ranks(const InitUrl& url, const InitOptions& options,
                                       bool rank_optional = false) {
  const std::string context = fmt::format("{}:// init {:?}", url.scheme, url.text);
  const EnvLookup env = options.env ? options.env : process_environment();
  ExplicitRanks out;
  COHORT_ASSIGN_OR_RETURN(out.rank, read_field(env, kRankField, options.rank));
  if (out.rank.value < 0 && !rank_optional) {
    return invalid_argument_error(
        "{}: the rank is not set; add ?rank=R to the URL or set InitOptions::rank, or start it under a "
        "launcher that sets one of {}",
        context, fmt::join(kRankField.variables, ", "));
  }
  COHORT_ASSIGN_OR_RETURN(out.world_size, read_field(env, kWorldSizeField, options.world_size));
  if (out.world_size.value < 1) {
    return invalid_argument_error(
        "{}: the world size is not set; add &world_size=N to the URL or set InitOptions::world_size, or "
        "start it under a launcher that sets one of {}{}",
        context, fmt::join(kWorldSizeField.variables, ", "),
        out.rank.value < 0 ? " (file:// assigns missing ranks in arrival order, but needs the world size)"
                           : "");
  }
  if (out.rank.value >= 0) COHORT_RETURN_IF_ERROR(check_rank(context, out.rank, out.world_size));
  COHORT_ASSIGN_OR_RETURN(Sourced local_rank, read_field(env, kLocalRankField, options.local_rank));
  COHORT_ASSIGN_OR_RETURN(Sourced local_world_size,
                          read_field(env, kLocalWorldSizeField, options.local_world_size));
  out.local_rank = local_rank.value;
  out.local_world_size = local_world_size.value;
  return out;
}

// file://'s group: InitOptions::group_name or ?group_name= (torch.distributed's group_name), one
// of them, or the same in both.
StatusOr<std::string> file_group_name(const InitUrl& url, const InitOptions& options) {
  std::string name = options.group_name;
  auto it = url.query.find("group_name");
  if (it != url.query.end()) {
    if (!name.empty() && name != it->second) {
      return invalid_argument_error(
          "init URL {:?}: group_name is {:?} in InitOptions but {:?} in the URL; give it once", url.text,
          name, it->second);
    }
    name = it->second;
  }
  return name;
}

// group_name namespaces a file:// store; the other built-in schemes have no use for it, and
// silently ignoring it would let two groups meet.
Status check_no_group_name(const InitUrl& url, const InitOptions& options) {
  if (options.group_name.empty()) return ok_status();
  return invalid_argument_error(
      "init URL {:?}: InitOptions::group_name {:?} applies to file:// only; {}:// jobs are separated by "
      "their master address and port",
      url.text, options.group_name, url.scheme);
}

// True when a standalone server (cohort-store) serves the store: the URL's store=external, or
// COHORT_STORE=external in the environment for env://.
bool external_store(const InitUrl& url, const InitOptions& options) {
  auto it = url.query.find("store");
  if (it != url.query.end()) return it->second == "external";
  if (url.scheme != "env") return false;
  std::optional<std::string> mode = (options.env ? options.env : process_environment())("COHORT_STORE");
  return mode && *mode == "external";
}

// The job's secret for the tcp store (COHORT_JOB_SECRET), "" when the launcher set none. Only
// the environment carries it: a URL lands in logs and process listings.
std::string job_secret(const InitOptions& options) {
  std::optional<std::string> secret =
      (options.env ? options.env : process_environment())(kJobSecretEnvironmentVariable);
  return secret ? *secret : std::string();
}

// Rank 0 serves the store in-process (bound to `host`, the master address) unless a standalone
// server does; everyone (rank 0 too) connects as a client, proving the job secret when there is one.
StatusOr<std::shared_ptr<Store>> tcp_store_for(const std::string& host, int port, int rank, bool external,
                                               const InitOptions& options) {
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<TcpStore> store,
                          TcpStore::create(host, port, rank == 0 && !external, options.timeout, job_secret(options)));
  return std::shared_ptr<Store>(std::move(store));
}

}  // namespace

StatusOr<EnvRendezvous> read_env_rendezvous(const InitOptions& options) {
  const EnvLookup& env = options.env;
  COHORT_ASSIGN_OR_RETURN(Sourced rank, read_field(env, kRankField, options.rank));
  if (rank.value < 0) return missing_field_error(kRankField);
  COHORT_ASSIGN_OR_RETURN(Sourced world_size, read_field(env, kWorldSizeField, options.world_size));
  if (world_size.value < 0) return missing_field_error(kWorldSizeField);
  COHORT_RETURN_IF_ERROR(check_rank("env:// init", rank, world_size));
  COHORT_ASSIGN_OR_RETURN(Sourced local_rank, read_field(env, kLocalRankField, options.local_rank));
  COHORT_ASSIGN_OR_RETURN(Sourced local_world_size,
                          read_field(env, kLocalWorldSizeField, options.local_world_size));
  EnvRendezvous out;
  COHORT_ASSIGN_OR_RETURN(out.master_address, read_master_address(env));
  COHORT_ASSIGN_OR_RETURN(out.master_port, read_master_port(env));
  out.rank = rank.value;
  out.world_size = world_size.value;
  out.local_rank = local_rank.value;
  out.local_world_size = local_world_size.value;
  return out;
}

StatusOr<Bootstrap> env_init_method(const InitUrl& url, const InitOptions& options) {
  COHORT_RETURN_IF_ERROR(check_query(url));
  COHORT_RETURN_IF_ERROR(check_no_group_name(url, options));
  COHORT_ASSIGN_OR_RETURN(EnvRendezvous env, read_env_rendezvous(options));
  Bootstrap boot;
  if (agent_store_requested(options.env)) {
    // torchrun's agent already serves a c10d store on the master's port: join it (see
    // agent_store_connector.h) instead of serving cohort's own there.
    COHORT_ASSIGN_OR_RETURN(boot.store, connect_agent_store(env.master_address, env.master_port,
                                                            options.timeout, options.env));
  } else {
    COHORT_ASSIGN_OR_RETURN(boot.store,
                            tcp_store_for(env.master_address, env.master_port, env.rank,
                                          external_store(url, options), options));
  }
  boot.rank = env.rank;
  boot.world_size = env.world_size;
  boot.local_rank = env.local_rank;
  boot.local_world_size = env.local_world_size;
  boot.master_address = env.master_address;
  return boot;
}

StatusOr<Bootstrap> tcp_init_method(const InitUrl& url, const InitOptions& options) {
  COHORT_RETURN_IF_ERROR(check_query(url));
  COHORT_RETURN_IF_ERROR(check_no_group_name(url, options));
  if (!url.path.empty() && url.path != "/") {
    return invalid_argument_error("tcp:// init {:?}: unexpected path {:?}; write tcp://host:port", url.text,
                                  url.path);
  }
  COHORT_ASSIGN_OR_RETURN(HostPort master, parse_host_port(url.authority, url.text));
  COHORT_ASSIGN_OR_RETURN(auto ranks, explicit_ranks(url, options));
  Bootstrap boot;
  COHORT_ASSIGN_OR_RETURN(boot.store,
                          tcp_store_for(master.host, master.port, ranks.rank.value,
                                        external_store(url, options), options));
  boot.rank = ranks.rank.value;
  boot.world_size = ranks.world_size.value;
  boot.local_rank = ranks.local_rank;
  boot.local_world_size = ranks.local_world_size;
  boot.master_address = master.host;
  return boot;
}

StatusOr<Bootstrap> file_init_method(const InitUrl& url, const InitOptions& options) {
  COHORT_RETURN_IF_ERROR(check_query(url));
  if (!url.authority.empty() || url.path.empty()) {
    return invalid_argument_error(
        "file:// init {:?}: no absolute path; write file:///absolute/path (three slashes), e.g. "
        "file:///shared/job42/store",
        url.text);
  }
  COHORT_ASSIGN_OR_RETURN(auto ranks, explicit_ranks(url, options, /*rank_optional=*/true));
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<FileStore> file, FileStore::open(url.path));
  // The job's keys live in a fresh generation of the file (file_rendezvous.h), so a file left by
  // an earlier job never hands its keys to this one; a missing rank is assigned on arrival.
  FileRendezvousOptions join;
  join.path = url.path;
  COHORT_ASSIGN_OR_RETURN(join.group_name, file_group_name(url, options));
  join.rank = ranks.rank.value;
  join.world_size = ranks.world_size.value;
  join.join_window = options.timeout;
  COHORT_ASSIGN_OR_RETURN(FileRendezvous joined,
                          join_file_rendezvous(std::shared_ptr<Store>(std::move(file)), join));
  Bootstrap boot;
  boot.store = std::move(joined.store);
  boot.rank = joined.rank;
  boot.world_size = ranks.world_size.value;
  // An assigned rank has nothing to do with the launcher's LOCAL_RANK: derive local ranks through
  // the store unless InitOptions or the URL gave them.
  const bool assigned = ranks.rank.value < 0;
  boot.local_rank = assigned ? options.local_rank : ranks.local_rank;
  boot.local_world_size = assigned ? options.local_world_size : ranks.local_world_size;
  return boot;
}

}  // namespace cohort::comm
