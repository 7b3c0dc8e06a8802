#pragma once

// RendezvousStore: the Store of one job attempt, kept by the coordinator and reached over the
// cohort.v1.Rendezvous service's key-value RPCs — the store behind `cohort://host:port/<job>`.
// Each Store call is one RPC; the coordinator holds the data, so any number of ranks (threads or
// processes) share it through their own RendezvousStore.
//
//   auto leader = std::make_shared<tls::LeaderChannel>(addresses, tls::worker_security_from_environment());
//   RendezvousStore store(leader, "mnist-3", /*attempt=*/1);
//   COHORT_RETURN_IF_ERROR(store.set("addr/0", my_address));
//
// Calls follow the leader of highly available coordinators (worker/base/leader_channel.h): a call
// refused by a standby, or broken by the leader's death, is sent again to the new leader within the
// call's deadline, which continues the attempt's rendezvous from etcd (issue 16). Every call is
// safe to send again: set and compare_set are idempotent in effect, get / wait / check / num_keys
// read, and add and delete carry a request id (a random client id and a counter) that the
// coordinator answers only once.
//
// Blocking calls (get, wait) pass their timeout to the server, which answers DEADLINE_EXCEEDED
// naming the missing keys; the RPC's own deadline is that timeout plus kRpcDeadlineSlack, so the
// server's explanation arrives before the client gives up. Other calls have kStoreRpcTimeout.
// When the attempt ends (a rank failed, the job was cancelled) every call fails with its reason.
//
// Thread-safe (gRPC stubs are).

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "cohort/v1/rendezvous.grpc.pb.h"
#include "worker/base/leader_channel.h"
#include "worker/comm/deadline.h"
#include "worker/comm/store/store.h"

namespace cohort::comm {

// Limit for a store RPC that does not wait for keys (set, add, ...): a reachable coordinator
// answers in milliseconds, an unreachable one should become an error a person sees soon.
inline constexpr Duration kStoreRpcTimeout = std::chrono::seconds(30);
// Added to a waiting call's timeout for the RPC deadline, so the server's DEADLINE_EXCEEDED (with
// the missing keys) wins over the transport's.
inline constexpr Duration kRpcDeadlineSlack = std::chrono::seconds(5);

class RendezvousStore final : public Store {
 public:
  // The store of `attempt` of `job_id` on the coordinators `leader` leads to (shared).
  // Non-blocking: nothing is sent until the first call.
  RendezvousStore(std::shared_ptr<tls::LeaderChannel> leader, std::string job_id, int attempt);

  Status set(std::string_view key, std::string_view value) override;
  StatusOr<std::string> get(std::string_view key, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<int64_t> add(std::string_view key, int64_t delta) override;
  StatusOr<std::string> compare_set(std::string_view key, std::string_view expected,
                                    std::string_view desired) override;
  Status wait(const std::vector<std::string>& keys, Duration timeout = kDefaultStoreTimeout) override;
  StatusOr<bool> check(const std::vector<std::string>& keys) override;
  StatusOr<bool> delete_key(std::string_view key) override;
  StatusOr<int64_t> num_keys() override;

  const std::string& job_id() const { return job_id_; }
  int attempt() const { return attempt_; }

 private:
  // Runs one unary RPC `method` with a deadline `rpc_timeout` from now, following the leader; the
  // error names `rpc` and the coordinator last tried.
  template <typename Request, typename Response, typename Method>
  Status call(std::string_view rpc, Method method, Request& request, Response* response,
              Duration rpc_timeout);
  // A request id no other call of any client uses: "<client id>-<counter>".
  std::string next_request_id();

  const std::shared_ptr<tls::LeaderChannel> leader_;
  const std::string job_id_;
  const int attempt_;
  const std::string client_id_;  // random, 128 bits in hex
  std::atomic<uint64_t> next_request_{1};
};

}  // namespace cohort::comm
