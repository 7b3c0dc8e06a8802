#include "worker/comm/init/init_options.h"

#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "worker/comm/init/init_methods.h"

namespace cohort::comm {
namespace {

// Keys of the node-id exchange that derives local ranks: "cohort/init/node/<rank>".
constexpr std::string_view kNodeKeyPrefix = "cohort/init/node/";
// Longest host name gethostname may return (POSIX HOST_NAME_MAX is 255 on Linux).
constexpr size_t kMaxHostNameBytes = 256;

// The scheme → init method table. Built-ins are registered on first use; the control plane
// adds cohort:// through register_init_method without touching this file.
struct Registry {
  std::mutex mutex;
  std::map<std::string, InitMethod> methods{
      {"env", env_init_method},
      {"file", file_init_method},
      {"tcp", tcp_init_method},
  };
};

Registry& registry() {
  static Registry* instance = new Registry();  // never destroyed: usable during static teardown
  return *instance;
}

StatusOr<InitMethod> find_method(const InitUrl& url) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  auto it = table.methods.find(url.scheme);
  if (it != table.methods.end()) return it->second;
  std::vector<std::string> supported;
  for (const auto& [scheme, method] : table.methods) supported.push_back(scheme + "://");
  return invalid_argument_error("init URL {:?}: unknown scheme {:?}; supported: {}", url.text, url.scheme,
                                fmt::join(supported, ", "));
}

// Moves ?rank=, ?world_size=, ?local_rank=, ?local_world_size= into `options`; a value given both
// there and in InitOptions must agree.
Status merge_query_field(const InitUrl& url, const char* name, int min, int* field) {
  auto it = url.query.find(name);
  if (it == url.query.end()) return ok_status();
  int value = -1;
  const std::string& text = it->second;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size() || value < min) {
    return invalid_argument_error("init URL {:?}: {}={:?} is not an integer >= {}", url.text, name, text,
                                  min);
  }
  if (*field >= 0 && *field != value) {
    return invalid_argument_error("init URL {:?}: {} is {} in InitOptions but {} in the URL; give it once",
                                  url.text, name, *field, value);
  }
  *field = value;
  return ok_status();
}

Status merge_query(const InitUrl& url, InitOptions* options) {
  COHORT_RETURN_IF_ERROR(merge_query_field(url, "rank", 0, &options->rank));
  COHORT_RETURN_IF_ERROR(merge_query_field(url, "world_size", 1, &options->world_size));
  COHORT_RETURN_IF_ERROR(merge_query_field(url, "local_rank", 0, &options->local_rank));
  return merge_query_field(url, "local_world_size", 1, &options->local_world_size);
}

StatusOr<std::string> resolve_node_id(const InitOptions& options) {
  if (!options.node_id.empty()) return options.node_id;
  if (std::optional<std::string> id = options.env("COHORT_NODE_ID"); id && !id->empty()) return *id;
  char name[kMaxHostNameBytes + 1] = {};
  if (::gethostname(name, kMaxHostNameBytes) != 0) {
    return errno_status("gethostname", errno).with_context("init: cannot name this node; set COHORT_NODE_ID");
  }
  return std::string(name);
}

// Every rank publishes its node id; a rank's local rank is its position among the ranks that
// share its node id, in rank order. Fills only the fields still unknown (-1).
Status derive_local_ranks(const InitOptions& options, Bootstrap* boot) {
  Store& store = *boot->store;
  COHORT_RETURN_IF_ERROR(store.set(fmt::format("{}{}", kNodeKeyPrefix, boot->rank), boot->node_id));
  std::vector<std::string> keys;
  for (int r = 0; r < boot->world_size; ++r) keys.push_back(fmt::format("{}{}", kNodeKeyPrefix, r));
  const std::string context =
      "init: grouping ranks into nodes by node id (set LOCAL_RANK and LOCAL_WORLD_SIZE, or "
      "?local_rank=&local_world_size=, to skip this step)";
  COHORT_RETURN_IF_ERROR(store.wait(keys, options.timeout).with_context(context));
  int local_rank = 0, local_world_size = 0;
  for (int r = 0; r < boot->world_size; ++r) {
    StatusOr<std::string> node = store.get(keys[static_cast<size_t>(r)], options.timeout);
    if (!node.ok()) return node.status().with_context(context);
    if (*node != boot->node_id) continue;
    if (r < boot->rank) ++local_rank;
    ++local_world_size;
  }
  if (boot->local_rank < 0) boot->local_rank = local_rank;
  if (boot->local_world_size < 0) boot->local_world_size = local_world_size;
  return ok_status();
}

// The method's numbers must describe a real place in a real job.
Status check_bootstrap(const InitUrl& url, const Bootstrap& boot) {
  if (boot.store == nullptr)
    return internal_error("init URL {:?}: the {}:// method returned no store", url.text, url.scheme);
  if (boot.world_size < 1 || boot.rank < 0 || boot.rank >= boot.world_size) {
    return invalid_argument_error("init URL {:?}: rank {} is out of range for world size {}", url.text,
                                  boot.rank, boot.world_size);
  }
  return ok_status();
}

Status check_local_ranks(const InitUrl& url, const Bootstrap& boot) {
  if (boot.local_world_size < 1 || boot.local_world_size > boot.world_size || boot.local_rank < 0 ||
      boot.local_rank >= boot.local_world_size) {
    return invalid_argument_error(
        "init URL {:?}: local rank {} / local world size {} do not fit a job of {} ranks; check LOCAL_RANK "
        "and "
        "LOCAL_WORLD_SIZE (or their SLURM / Open MPI equivalents)",
        url.text, boot.local_rank, boot.local_world_size, boot.world_size);
  }
  return ok_status();
}

}  // namespace

InitOptions InitOptions::from_url(std::string_view url) {
  InitOptions options;
  options.url = std::string(url);
  return options;
}

StatusOr<Bootstrap> resolve_init(const InitOptions& options) {
  COHORT_ASSIGN_OR_RETURN(InitUrl url, parse_init_url(options.url));
  InitOptions effective = options;
  if (!effective.env) effective.env = process_environment();
  COHORT_RETURN_IF_ERROR(merge_query(url, &effective));
  COHORT_ASSIGN_OR_RETURN(effective.node_id, resolve_node_id(effective));
  COHORT_ASSIGN_OR_RETURN(InitMethod method, find_method(url));
  COHORT_ASSIGN_OR_RETURN(Bootstrap boot, method(url, effective));
  boot.node_id = effective.node_id;
  COHORT_RETURN_IF_ERROR(check_bootstrap(url, boot));
  if (boot.local_rank < 0 || boot.local_world_size < 0)
    COHORT_RETURN_IF_ERROR(derive_local_ranks(effective, &boot));
  COHORT_RETURN_IF_ERROR(check_local_ranks(url, boot));
  return boot;
}

Status register_init_method(std::string scheme, InitMethod method) {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  if (table.methods.count(scheme) > 0) {
    return already_exists_error("init method for {}:// is already registered", scheme);
  }
  table.methods.emplace(std::move(scheme), std::move(method));
  return ok_status();
}

std::vector<std::string> init_method_schemes() {
  Registry& table = registry();
  std::lock_guard<std::mutex> lock(table.mutex);
  std::vector<std::string> schemes;
  for (const auto& [scheme, method] : table.methods) schemes.push_back(scheme);
  return schemes;
}

}  // namespace cohort::comm
