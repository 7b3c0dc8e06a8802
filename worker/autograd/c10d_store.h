#pragma once

// C10dStore: cohort's Store (worker/comm/store/store.h) over libtorch's own c10d::TCPStore
// client, to join a store that PyTorch's tooling already serves — torchrun's agent store (see
// worker/comm/init/agent_store_connector.h). It speaks c10d's wire protocol through libtorch
// rather than re-implementing it, and never serves a store itself.
//
//   C10dStoreOptions options;
//   options.port = 29500;  // MASTER_PORT
//   COHORT_ASSIGN_OR_RETURN(std::unique_ptr<C10dStore> store, C10dStore::connect(options));
//   COHORT_RETURN_IF_ERROR(store->set("addr/0", my_address));
//
// Every program that links //worker/autograd registers C10dStore as env://'s agent store
// connector at static initialisation (register_c10d_agent_store_connector below, kept by
// alwayslink), so `--init env://` works under torchrun's static rendezvous without code changes.
//
// Mapping onto c10d (torch 1.13): set → set, get → wait + get, add → add (after checking the
// stored value is an integer: c10d's server would drop the connection instead of answering),
// compare_set → compareSet (c10d answers `expected` for a missing key; this answers "" as the
// contract says), wait → wait (a zero timeout is a non-blocking check: 0 means "forever" to
// c10d), check → check, delete_key → deleteKey, num_keys → getNumKeys (every key on the server,
// torchrun's included).
//
// Thread-safe: operations are serialised on one connection, as c10d does. A wait that timed out
// leaves c10d's connection expecting a late reply, so the next operation opens a new one.

#include <memory>
#include <mutex>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"

namespace c10d {
class TCPStore;
}  // namespace c10d

namespace cohort::autograd {

struct C10dStoreOptions {
  std::string host = "127.0.0.1";                       // the c10d TCPStore server's host
  int port = 0;                                         // its port (1..65535)
  comm::Duration timeout = comm::kDefaultStoreTimeout;  // connecting, and each reply
};

class C10dStore : public comm::Store {
 public:
  // Connects to the server at options.host:options.port, retrying until options.timeout.
  // INVALID_ARGUMENT for a bad port; UNAVAILABLE naming the address and c10d's error otherwise.
  static StatusOr<std::unique_ptr<C10dStore>> connect(const C10dStoreOptions& options);

  ~C10dStore() override;
  C10dStore(const C10dStore&) = delete;
  C10dStore& operator=(const C10dStore&) = delete;

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key,
                            comm::Duration timeout = comm::kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys,
              comm::Duration timeout = comm::kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  StatusOr<int64_t> num_keys() override;

 private:
  explicit C10dStore(C10dStoreOptions options);

  // The connection, opened again when the previous one was dropped. Requires mutex_.
  StatusOr<c10d::TCPStore*> client_locked();
  // Waits under mutex_; a timeout drops the connection (see the header comment).
  Status wait_locked(const std::vector<std::string>& keys, comm::Duration timeout);
  // "c10d store 127.0.0.1:29500", for messages.
  std::string where() const;

  const C10dStoreOptions options_;
  std::mutex mutex_;                        // serialises operations on client_
  std::unique_ptr<c10d::TCPStore> client_;  // null: reconnect on next use
};

// Registers C10dStore as env://'s agent store connector (torchrun's TORCHELASTIC_USE_AGENT_STORE).
// Done at static initialisation in every program linking //worker/autograd; calling it again is
// harmless. Thread-safe.
void register_c10d_agent_store_connector();

}  // namespace cohort::autograd
