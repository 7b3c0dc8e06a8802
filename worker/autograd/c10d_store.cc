#include "worker/autograd/c10d_store.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <charconv>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "worker/comm/init/agent_store_connector.h"

namespace cohort::autograd {
namespace {

constexpr int kMaxPort = 65535;

std::vector<uint8_t> bytes(std::string_view text) { return std::vector<uint8_t>(text.begin(), text.end()); }

std::string text(const std::vector<uint8_t>& value) { return std::string(value.begin(), value.end()); }

bool is_integer(std::string_view value) {
  int64_t parsed = 0;
  auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), parsed);
  return !value.empty() && error == std::errc() && end == value.data() + value.size();
}

// c10d reports everything by exception; one conversion for every operation.
Status from_exception(const std::exception& e, std::string_view op, std::string_view where) {
  return unavailable_error("{} on {}: {}", op, where, e.what());
}

// Runs `body` (which calls c10d) and turns an exception into UNAVAILABLE naming the op.
template <typename Body>
auto guarded(std::string_view op, std::string_view where, Body&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::exception& e) {
    return from_exception(e, op, where);
  }
}

// Registers the connector before main; alwayslink keeps this object in every program that
// links //worker/autograd.
[[maybe_unused]] const bool kRegistered = [] {
  register_c10d_agent_store_connector();
  return true;
}();

}  // namespace

C10dStore::C10dStore(C10dStoreOptions options) : options_(std::move(options)) {}

C10dStore::~C10dStore() = default;

StatusOr<std::unique_ptr<C10dStore>> C10dStore::connect(const C10dStoreOptions& options) {
  if (options.port < 1 || options.port > kMaxPort) {
    return invalid_argument_error("c10d store {}:{}: port {} is not in 1..{}", options.host, options.port,
                                  options.port, kMaxPort);
  }
  std::unique_ptr<C10dStore> store(new C10dStore(options));
  std::lock_guard<std::mutex> lock(store->mutex_);
  COHORT_RETURN_IF_ERROR(store->client_locked().status());
  return store;
}

std::string C10dStore::where() const { return fmt::format("c10d store {}:{}", options_.host, options_.port); }

StatusOr<c10d::TCPStore*> C10dStore::client_locked() {
  if (client_ != nullptr) return client_.get();
  c10d::TCPStoreOptions options;
  options.port = static_cast<std::uint16_t>(options_.port);
  options.isServer = false;
  options.numWorkers = c10::nullopt;  // a client only: no "init/" worker count of its own
  options.waitWorkers = false;
  options.timeout = options_.timeout;
  try {
    client_ = std::make_unique<c10d::TCPStore>(options_.host, options);
  } catch (const std::exception& e) {
    return unavailable_error(
        "cannot connect to the {} within {} ms: {}; check MASTER_ADDR and MASTER_PORT (is torchrun's agent "
        "serving there?)",
        where(), options_.timeout.count(), e.what());
  }
  return client_.get();
}

Status C10dStore::set(std::string_view key, std::string_view value) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  return guarded("set", where(), [&]() -> Status {
    client->set(std::string(key), bytes(value));
    return ok_status();
  });
}

Status C10dStore::wait_locked(const std::vector<std::string>& keys, comm::Duration timeout) {
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  const std::string missing = fmt::format("{}", fmt::join(keys, ", "));
  try {
    // c10d reads a zero timeout as "forever": ours means "look once".
    if (timeout <= comm::Duration::zero()) {
      if (client->check(keys)) return ok_status();
      return deadline_exceeded_error("wait on {}: keys [{}] are not all set (timeout 0 ms)", where(),
                                     missing);
    }
    client->wait(keys, timeout);
    // c10d leaves the socket's receive timeout at the wait's; put the store's back (an empty wait
    // is answered at once) so a later add or compare_set is not cut short by a short wait's limit.
    if (timeout != options_.timeout) client->wait({}, options_.timeout);
    return ok_status();
  } catch (const std::exception& e) {
    client_.reset();  // the server may still answer the abandoned wait on this connection
    return deadline_exceeded_error("wait on {}: keys [{}] not all set within {} ms ({})", where(), missing,
                                   timeout.count(), e.what());
  }
}

StatusOr<std::string> C10dStore::get(std::string_view key, comm::Duration timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_RETURN_IF_ERROR(wait_locked({std::string(key)}, timeout).with_context(fmt::format("get {:?}", key)));
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  return guarded("get", where(),
                 [&]() -> StatusOr<std::string> { return text(client->get(std::string(key))); });
}

StatusOr<int64_t> C10dStore::add(std::string_view key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  const std::string name(key);
  return guarded("add", where(), [&]() -> StatusOr<int64_t> {
    // c10d's server answers a non-integer value by closing the connection; refuse it here instead.
    if (client->check({name})) {
      const std::string value = text(client->get(name));
      if (!is_integer(value)) {
        return invalid_argument_error("add {:?} on {}: the stored value {:?} is not an integer", key, where(),
                                      value);
      }
    }
    return client->add(name, delta);
  });
}

StatusOr<std::string> C10dStore::compare_set(std::string_view key, std::string_view expected,
                                             std::string_view desired) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  const std::string name(key);
  return guarded("compare_set", where(), [&]() -> StatusOr<std::string> {
    std::string stored = text(client->compareSet(name, bytes(expected), bytes(desired)));
    // For a missing key with a non-empty `expected`, c10d answers `expected` itself, which a
    // successful swap never does unless expected == desired: then only check() can tell.
    if (!expected.empty() && stored == expected && (expected != desired || !client->check({name}))) {
      return std::string();
    }
    return stored;
  });
}

Status C10dStore::wait(const std::vector<std::string>& keys, comm::Duration timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  return wait_locked(keys, timeout);
}

StatusOr<bool> C10dStore::check(const std::vector<std::string>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  return guarded("check", where(), [&]() -> StatusOr<bool> { return client->check(keys); });
}

StatusOr<bool> C10dStore::delete_key(std::string_view key) {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  return guarded("delete_key", where(),
                 [&]() -> StatusOr<bool> { return client->deleteKey(std::string(key)); });
}

StatusOr<int64_t> C10dStore::num_keys() {
  std::lock_guard<std::mutex> lock(mutex_);
  COHORT_ASSIGN_OR_RETURN(c10d::TCPStore * client, client_locked());
  return guarded("num_keys", where(), [&]() -> StatusOr<int64_t> { return client->getNumKeys(); });
}

void register_c10d_agent_store_connector() {
  comm::register_agent_store_connector(
      [](const comm::AgentStoreAddress& address) -> StatusOr<std::shared_ptr<comm::Store>> {
        C10dStoreOptions options;
        options.host = address.host;
        options.port = address.port;
        options.timeout = address.timeout;
        COHORT_ASSIGN_OR_RETURN(std::unique_ptr<C10dStore> store, C10dStore::connect(options));
        return std::shared_ptr<comm::Store>(std::move(store));
      });
}

}  // namespace cohort::autograd
