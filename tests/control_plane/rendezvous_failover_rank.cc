// A command job's rank for ha_failover_test's rendezvous case (issue 16): two ranks that are in the
// middle of their rendezvous when the leading coordinator is SIGKILLed, and that must finish it
// under the standby without noticing more than a slower call.
//
//   rank 0: add("arrived", 1); set("from0", "hello"); touches $FAILOVER_DIR/rank0-ready; waits for
//           the test to create $FAILOVER_DIR/go (after the failover); set("go"); get("from1").
//   rank 1: add("arrived", 1); touches $FAILOVER_DIR/rank1-waiting; get("go"), which blocks across
//           the failover; then checks what the new leader carried over: "from0" is "hello",
//           "arrived" is 2 (no add counted twice), and joining again gets the same rank at once
//           (the completed join was carried over); set("from1", "ok").
// Either exits 1 with the reason on stderr when something is not as expected, so the job fails and
// the test reports it.
//
// Usage (as a command job, with COHORT_INIT from the agent): rendezvous_failover_rank

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "worker/comm/init/cohort/cohort_init_method.h"
#include "worker/comm/init/init_options.h"

namespace {

using namespace std::chrono_literals;
using cohort::Status;
using cohort::StatusOr;

// Longer than the test's own bounds, so the test, not a rank, reports a hang.
constexpr auto kWait = std::chrono::seconds(120);

int fail(const std::string& what) {
  std::fprintf(stderr, "rendezvous_failover_rank: %s\n", what.c_str());
  return 1;
}

void touch(const std::string& path) { std::ofstream(path) << getpid() << "\n"; }

bool wait_for_file(const std::string& path) {
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (std::chrono::steady_clock::now() < until) {
    if (std::filesystem::exists(path)) return true;
    std::this_thread::sleep_for(50ms);
  }
  return false;
}

StatusOr<cohort::comm::Bootstrap> join() {
  const char* url = std::getenv("COHORT_INIT");
  if (url == nullptr)
    return cohort::invalid_argument_error("COHORT_INIT is not set; run me as a command job");
  cohort::comm::InitOptions options = cohort::comm::InitOptions::from_url(url);
  options.timeout = kWait;
  return cohort::comm::resolve_init(options);
}

int run() {
  const char* dir_env = std::getenv("FAILOVER_DIR");
  if (dir_env == nullptr) return fail("FAILOVER_DIR is not set");
  const std::string dir = dir_env;
  if (Status registered = cohort::comm::register_cohort_init_method(); !registered.ok())
    return fail(registered.to_string());
  StatusOr<cohort::comm::Bootstrap> boot = join();
  if (!boot.ok()) return fail("join: " + boot.status().to_string());
  cohort::comm::Store& store = *boot->store;
  if (StatusOr<int64_t> added = store.add("arrived", 1); !added.ok())
    return fail("add: " + added.status().to_string());

  if (boot->rank == 0) {
    if (Status set = store.set("from0", "hello"); !set.ok()) return fail("set from0: " + set.to_string());
    touch(dir + "/rank0-ready");
    if (!wait_for_file(dir + "/go")) return fail("the test never created " + dir + "/go");
    if (Status set = store.set("go", "1"); !set.ok())
      return fail("set go after the failover: " + set.to_string());
    StatusOr<std::string> from1 = store.get("from1", kWait);
    if (!from1.ok()) return fail("get from1: " + from1.status().to_string());
    if (*from1 != "ok") return fail("from1 is '" + *from1 + "', not 'ok'");
    std::printf("rank 0: done\n");
    return 0;
  }

  touch(dir + "/rank1-waiting");
  StatusOr<std::string> go = store.get("go", kWait);  // across the failover
  if (!go.ok()) return fail("get go across the failover: " + go.status().to_string());
  StatusOr<std::string> from0 = store.get("from0", 5s);
  if (!from0.ok()) return fail("get from0 after the failover: " + from0.status().to_string());
  if (*from0 != "hello") return fail("from0 is '" + *from0 + "' after the failover, not 'hello'");
  StatusOr<int64_t> arrived = store.add("arrived", 0);
  if (!arrived.ok()) return fail("add arrived 0: " + arrived.status().to_string());
  if (*arrived != 2) return fail("arrived is " + std::to_string(*arrived) + " after the failover, not 2");
  // Joining again must not wait for rank 0 (which will not join again): the completed join was
  // carried over, with the same answer.
  const auto rejoin_started = std::chrono::steady_clock::now();
  StatusOr<cohort::comm::Bootstrap> again = join();
  if (!again.ok()) return fail("joining again after the failover: " + again.status().to_string());
  if (again->rank != boot->rank || again->world_size != boot->world_size ||
      again->master_address != boot->master_address) {
    return fail("joining again after the failover answered rank " + std::to_string(again->rank) + " of " +
                std::to_string(again->world_size) + ", master " + again->master_address + "; first: rank " +
                std::to_string(boot->rank) + " of " + std::to_string(boot->world_size) + ", master " +
                boot->master_address);
  }
  const double rejoin_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - rejoin_started).count();
  if (Status set = store.set("from1", "ok"); !set.ok()) return fail("set from1: " + set.to_string());
  std::printf("rank 1: done (go=%s, arrived=%lld, re-join %.2f s)\n", go->c_str(),
              static_cast<long long>(*arrived), rejoin_s);
  return 0;
}

}  // namespace

int main() { return run(); }
