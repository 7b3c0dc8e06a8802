#pragma once

// EtcdClient: cohort's client of etcd's v3 gRPC API (KV, Lease, Election), over the C++ stubs
// generated from the .proto files Debian ships (//third_party:etcd_api). The highly available
// coordinator keeps its job store and its leader election in etcd through this class.
//
//   EtcdOptions options;
//   COHORT_ASSIGN_OR_RETURN(options.endpoints, parse_etcd_url("etcd://10.0.0.1:2379,10.0.0.2:2379"));
//   options.ca_pem = ...; options.certificate_pem = ...; options.key_pem = ...;   // TLS (optional)
//   COHORT_ASSIGN_OR_RETURN(auto etcd, EtcdClient::create(options));
//   COHORT_RETURN_IF_ERROR(etcd->put("/cohort/x", "1").status());
//
// Failover: the client holds one channel per member. A call goes to the member that answered last;
// when that member is unreachable (UNAVAILABLE) or does not answer within the attempt timeout, the
// call moves on to the next member, until the call's deadline. etcd's own errors (a failed lease,
// a bad request) are returned as they are, not retried.
//
// Error model: every method returns Status / StatusOr, "etcd <Rpc> to <member>: <etcd's message>".
// Thread-safe: any number of threads may call any method at once. Every call has a deadline
// (EtcdOptions::call_timeout unless the method takes one); nothing blocks forever.
//
// Every RPC sent (failover attempts included) is counted per kind (request_counts()), so tests and
// benchmarks can say how many etcd requests an operation costs.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "etcd/etcdserver/api/v3election/v3electionpb/v3election.grpc.pb.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "worker/base/status.h"

namespace cohort::etcd {

// A call's whole budget, failover included, when the caller gives none.
inline constexpr std::chrono::milliseconds kDefaultCallTimeout{5000};
// One member's budget within a call: a member that does not answer in this time (stopped,
// partitioned) is skipped for the next one. etcd answers a healthy request in milliseconds; a
// write waits for one raft round trip and an fsync.
inline constexpr std::chrono::milliseconds kDefaultAttemptTimeout{2000};

// Operations cohort puts in one transaction at most when it splits a large write (etcd's default
// --max-txn-ops is 128).
inline constexpr int kMaxOpsPerTxn = 100;

// Parses "etcd://host:port,host:port,..." (also accepts the list without the scheme) into
// HOST:PORT endpoints. INVALID_ARGUMENT naming the bad part.
StatusOr<std::vector<std::string>> parse_etcd_url(const std::string& url);

struct EtcdOptions {
  std::vector<std::string> endpoints;  // HOST:PORT of every member (at least one)
  // TLS: with ca_pem set, every channel is TLS, verifying each member's certificate against ca_pem
  // and the member's host name (or IP address). certificate_pem/key_pem: the client certificate
  // for a cluster started with --client-cert-auth. With ca_pem empty, plaintext (a loopback
  // development cluster only).
  std::string ca_pem;
  std::string certificate_pem;
  std::string key_pem;
  std::chrono::milliseconds call_timeout = kDefaultCallTimeout;        // a call's whole budget
  std::chrono::milliseconds attempt_timeout = kDefaultAttemptTimeout;  // one member's budget
};

// One key-value pair as etcd stores it (mvccpb.KeyValue).
struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;  // the revision that created the key (fencing compares this)
  int64_t mod_revision = 0;     // the revision of the last write
  int64_t version = 0;          // writes since creation
  int64_t lease = 0;            // the lease the key is attached to (0: none)
};

struct RangeResult {
  std::vector<KeyValue> kvs;
  int64_t revision = 0;  // the store's revision when read
  bool more = false;     // more keys matched than `limit`
  int64_t count = 0;     // how many keys matched
};

struct TxnResult {
  bool succeeded = false;  // the comparisons held (the success ops ran) or not (the failure ops ran)
  int64_t revision = 0;
  etcdserverpb::TxnResponse response;  // each op's response, for callers that need them
};

// A won election (v3electionpb.LeaderKey): the key this candidate holds while leading. Deleting
// the key (resign, lease expiry) ends the leadership. `rev` is the key's create revision: a
// transaction comparing it is a fencing token (see EtcdClient::leader_compare).
struct LeaderKey {
  std::string name;
  std::string key;
  int64_t rev = 0;
  int64_t lease = 0;
};

// Cancels a blocking call (campaign, observe) from another thread. Reusable: reset() re-arms it.
// Thread-safe.
class CallCanceller {
 public:
  // Cancels the call in flight (if any) and every later one until reset().
  void cancel();
  void reset();
  bool cancelled() const;

 private:
  friend class EtcdClient;
  // Registers `context` as the call in flight; false if already cancelled.
  bool attach(grpc::ClientContext* context);
  void detach();

  mutable std::mutex mutex_;
  bool cancelled_ = false;
  grpc::ClientContext* context_ = nullptr;
};

class EtcdClient {
 public:
  // Creates channels to every endpoint (connecting lazily). INVALID_ARGUMENT for an empty
  // endpoint list or a certificate without its key.
  static StatusOr<std::unique_ptr<EtcdClient>> create(EtcdOptions options);
  ~EtcdClient();

  // ---- KV
  // Keys in [key, range_end); range_end empty: the one key. limit 0: no limit. revision 0: now,
  // else as of that store revision (OUT_OF_RANGE "required revision has been compacted" once
  // compact() dropped it). Blocks one call.
  StatusOr<RangeResult> range(const std::string& key, const std::string& range_end = "", int64_t limit = 0,
                              int64_t revision = 0);
  // Every key starting with `prefix`, in key order.
  StatusOr<RangeResult> range_prefix(const std::string& prefix, int64_t limit = 0);
  // Every key starting with `prefix`, in key order, read in Ranges of `page_size` keys (a page
  // stays below gRPC's message limit however many keys there are). One call per page.
  StatusOr<std::vector<KeyValue>> range_all(const std::string& prefix, int64_t page_size);
  // Writes key = value (attached to `lease` unless 0). Returns the store's revision after it.
  StatusOr<int64_t> put(const std::string& key, const std::string& value, int64_t lease = 0);
  // Deletes [key, range_end) (range_end empty: the key). Returns how many keys were deleted.
  StatusOr<int64_t> delete_range(const std::string& key, const std::string& range_end = "");
  StatusOr<int64_t> delete_prefix(const std::string& prefix);
  // Runs a transaction (compare → success ops | failure ops) atomically. A failed comparison is
  // not an error: TxnResult::succeeded is false.
  StatusOr<TxnResult> txn(const etcdserverpb::TxnRequest& request);
  // Compare-and-swap: writes key = value only if the key's mod revision is still
  // `expected_mod_revision` (0: only if the key does not exist). Returns whether it wrote.
  StatusOr<bool> compare_and_swap(const std::string& key, int64_t expected_mod_revision,
                                  const std::string& value);
  // Drops the history before `revision` (every key's superseded versions and deleted keys older
  // than it), so etcd's database does not grow until its space quota stops every write (etcd keeps
  // all history unless compacted). OUT_OF_RANGE when the history was compacted at or past
  // `revision` already (is_compacted_error).
  Status compact(int64_t revision);
  // Whether `status` is etcd's "required revision has been compacted" (a read or compaction of
  // history that is gone).
  static bool is_compacted_error(const Status& status);

  // ---- Lease
  // Grants a lease of `ttl` (rounded up to whole seconds; etcd's minimum applies). Returns its id.
  StatusOr<int64_t> lease_grant(std::chrono::seconds ttl);
  // Renews `lease` once (one LeaseKeepAlive round trip). Returns the TTL etcd granted again;
  // NOT_FOUND when the lease has expired or was revoked. `canceller` (optional) can end the call
  // early (CANCELLED).
  StatusOr<std::chrono::seconds> lease_keep_alive_once(int64_t lease, CallCanceller* canceller = nullptr);
  // Revokes `lease`, deleting every key attached to it. NOT_FOUND for an unknown lease. `budget`
  // replaces call_timeout when set (a shutdown gives up sooner than a running daemon would); each
  // member then gets its share of it, so one hung member cannot use it all.
  Status lease_revoke(int64_t lease, std::optional<std::chrono::milliseconds> budget = std::nullopt);

  // ---- Election (etcd's v3election service; one key per candidate under `name`, the oldest leads)
  // Blocks until this candidate (`lease`, `value`) leads election `name`, `timeout` passes
  // (DEADLINE_EXCEEDED), or `canceller` cancels it (CANCELLED). The candidacy lives as long as
  // `lease`. Not retried on another member once sent (a campaign has no safe retry point); the
  // caller campaigns again.
  StatusOr<LeaderKey> campaign(const std::string& name, int64_t lease, const std::string& value,
                               std::chrono::milliseconds timeout, CallCanceller* canceller = nullptr);
  // Replaces the leader's value without an election. FAILED_PRECONDITION if `leader` no longer leads.
  Status proclaim(const LeaderKey& leader, const std::string& value);
  // The current leader's key-value (its value is the leader's proclamation); std::nullopt when no
  // candidate leads.
  StatusOr<std::optional<KeyValue>> leader(const std::string& name, CallCanceller* canceller = nullptr);
  // Streams leader changes of `name` to `on_leader` (called on the calling thread, first with the
  // current leader) until it returns false, `timeout` passes, or `canceller` cancels. Returns OK
  // when stopped by the callback, DEADLINE_EXCEEDED / CANCELLED / the stream's error otherwise.
  Status observe(const std::string& name, const std::function<bool(const KeyValue&)>& on_leader,
                 std::chrono::milliseconds timeout, CallCanceller* canceller = nullptr);
  // Gives up leadership (deletes the leader key; the next candidate leads). `budget` as for
  // lease_revoke.
  Status resign(const LeaderKey& leader, std::optional<std::chrono::milliseconds> budget = std::nullopt);

  // A comparison that holds while `leader` still leads: the leader key exists with its create
  // revision. Put it in a TxnRequest's compare list to fence a write to the current leader.
  static etcdserverpb::Compare leader_compare(const LeaderKey& leader);
  // Sends `request` with leader_compare(*fence) added to its comparisons when `fence` is set: a
  // leader's write that lands only while it still leads. Not succeeded: a comparison failed (the
  // fence's, or one of the request's own; the failure ops' responses tell which).
  StatusOr<TxnResult> fenced_txn(etcdserverpb::TxnRequest request, const std::optional<LeaderKey>& fence);
  // FAILED_PRECONDITION: `what` was refused because the writer no longer leads (`fence` gone or
  // replaced). The error every fenced writer returns for a failed fence.
  static Status lost_leadership_error(const std::string& what, const std::optional<LeaderKey>& fence);
  // Makes `request` also require that `key` exists (create revision > 0), and read it back when a
  // comparison fails, so that key_was_missing() can tell that refusal from a lost fence. Call it
  // before adding other failure ops: the read is the first of them.
  static void require_key(etcdserverpb::TxnRequest& request, const std::string& key);
  // For a fenced_txn that did not succeed and whose request went through require_key: whether the
  // required key was missing (else the fence, or another of the request's comparisons, failed).
  static bool key_was_missing(const TxnResult& result) {
    return result.response.responses_size() > 0 && result.response.responses(0).response_range().kvs_size() == 0;
  }
  // Whether `key` starts with `prefix`.
  static bool has_prefix(const std::string& key, const std::string& prefix) { return key.rfind(prefix, 0) == 0; }

  // ---- Accounting
  // RPCs sent, by kind ("Range", "Put", "DeleteRange", "Txn", "Compact", "LeaseGrant", "LeaseKeepAlive",
  // "LeaseRevoke", "Campaign", "Proclaim", "Leader", "Observe", "Resign"); every attempt counts.
  std::map<std::string, int64_t> request_counts() const;
  int64_t total_requests() const;
  void reset_request_counts();

  const EtcdOptions& options() const { return options_; }
  // The member calls go to first: the one that answered last (0..members-1). A long poll (Campaign,
  // Observe) waits on it alone.
  size_t preferred_member() const { return preferred_.load() % members_.size(); }

  // The end of the range of every key that starts with `prefix` (etcd's prefix convention).
  static std::string prefix_end(const std::string& prefix);

 private:
  struct Member;
  explicit EtcdClient(EtcdOptions options);

  // Runs `attempt(member, context)` on the preferred member, then the others, until one returns a
  // status other than UNAVAILABLE/DEADLINE_EXCEEDED or the call's deadline passes: `budget`, split
  // evenly over the members, when set; else call_timeout, attempt_timeout per member. `canceller`
  // (optional) ends it early with CANCELLED.
  Status call(const char* rpc, const std::function<grpc::Status(Member&, grpc::ClientContext&)>& attempt,
              std::optional<std::chrono::milliseconds> budget = std::nullopt, CallCanceller* canceller = nullptr);
  void count(const char* rpc);

  EtcdOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<size_t> preferred_{0};
  mutable std::mutex counts_mutex_;
  std::map<std::string, int64_t> counts_;
};

}  // namespace cohort::etcd
