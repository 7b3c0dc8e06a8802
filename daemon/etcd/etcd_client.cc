#include "daemon/etcd/etcd_client.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "worker/base/grpc_status.h"
#include "worker/base/tls.h"

namespace cohort::etcd {
namespace {

using Clock = std::chrono::steady_clock;

// The host part of HOST:PORT ("[::1]:2379" → "::1"): the name a member's certificate must carry.
std::string host_of(const std::string& endpoint) {
  if (!endpoint.empty() && endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    return close == std::string::npos ? endpoint : endpoint.substr(1, close - 1);
  }
  const size_t colon = endpoint.rfind(':');
  return colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
}

KeyValue from_proto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.version = kv.version();
  out.lease = kv.lease();
  return out;
}

LeaderKey from_proto(const v3electionpb::LeaderKey& key) {
  return LeaderKey{key.name(), key.key(), key.rev(), key.lease()};
}

v3electionpb::LeaderKey to_proto(const LeaderKey& key) {
  v3electionpb::LeaderKey out;
  out.set_name(key.name);
  out.set_key(key.key);
  out.set_rev(key.rev);
  out.set_lease(key.lease);
  return out;
}

constexpr std::chrono::milliseconds kReconnectBackoffMin{100};
constexpr std::chrono::milliseconds kReconnectBackoffMax{1000};

bool is_failover_code(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED;
}

}  // namespace

struct EtcdClient::Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<v3electionpb::Election::Stub> election;
};

// ---- CallCanceller

void CallCanceller::cancel() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = true;
  if (context_ != nullptr) context_->TryCancel();
}

void CallCanceller::reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  cancelled_ = false;
}

bool CallCanceller::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancelled_;
}

bool CallCanceller::attach(grpc::ClientContext* context) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancelled_) return false;
  context_ = context;
  return true;
}

void CallCanceller::detach() {
  std::lock_guard<std::mutex> lock(mutex_);
  context_ = nullptr;
}

// ---- parsing

StatusOr<std::vector<std::string>> parse_etcd_url(const std::string& url) {
  static constexpr std::string_view kScheme = "etcd://";
  std::string rest = url;
  if (rest.rfind(kScheme, 0) == 0) rest = rest.substr(kScheme.size());
  std::vector<std::string> endpoints;
  size_t start = 0;
  while (start <= rest.size()) {
    const size_t comma = std::min(rest.find(',', start), rest.size());
    std::string endpoint = rest.substr(start, comma - start);
    const size_t colon = endpoint.rfind(':');
    const std::string port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
    if (endpoint.empty() || colon == 0 || port.empty() || port.size() > 5 ||
        !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
        std::stol(port) < 1 || std::stol(port) > 65535) {
      return invalid_argument_error(
          "etcd endpoint '{}' in '{}' is not HOST:PORT; write the job store as "
          "etcd://host:port,host:port,...",
          endpoint, url);
    }
    endpoints.push_back(std::move(endpoint));
    start = comma + 1;
  }
  return endpoints;
}

// ---- EtcdClient

EtcdClient::EtcdClient(EtcdOptions options) : options_(std::move(options)) {}

EtcdClient::~EtcdClient() = default;

StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::create(EtcdOptions options) {
  if (options.endpoints.empty()) {
    return invalid_argument_error("etcd: no endpoints; give at least one member as HOST:PORT");
  }
  if (options.certificate_pem.empty() != options.key_pem.empty()) {
    return invalid_argument_error("etcd: a client certificate needs its private key and the other way round");
  }
  if (!options.certificate_pem.empty() && options.ca_pem.empty()) {
    return invalid_argument_error(
        "etcd: a client certificate needs the CA certificate that signed the members' certificates");
  }
  if (options.call_timeout.count() <= 0 || options.attempt_timeout.count() <= 0) {
    return invalid_argument_error("etcd: call_timeout and attempt_timeout must be positive");
  }
  std::unique_ptr<EtcdClient> client(new EtcdClient(std::move(options)));
  for (const std::string& endpoint : client->options_.endpoints) {
    tls::ChannelSecurity security;
    security.insecure = client->options_.ca_pem.empty();
    security.ca_pem = client->options_.ca_pem;
    security.certificate_pem = client->options_.certificate_pem;
    security.key_pem = client->options_.key_pem;
    security.target_name = host_of(endpoint);
    auto member = std::make_unique<Member>();
    member->endpoint = endpoint;
    // A member that restarts (or starts late) is reconnected to within a second, not after gRPC's
    // default backoff of up to two minutes.
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectBackoffMin.count()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectBackoffMin.count()));
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kReconnectBackoffMax.count()));
    member->channel = tls::make_channel(endpoint, security, args);
    member->kv = etcdserverpb::KV::NewStub(member->channel);
    member->lease = etcdserverpb::Lease::NewStub(member->channel);
    member->election = v3electionpb::Election::NewStub(member->channel);
    client->members_.push_back(std::move(member));
  }
  return client;
}

void EtcdClient::count(const char* rpc) {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  ++counts_[rpc];
}

std::map<std::string, int64_t> EtcdClient::request_counts() const {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  return counts_;
}

int64_t EtcdClient::total_requests() const {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  int64_t total = 0;
  for (const auto& [rpc, n] : counts_) total += n;
  return total;
}

void EtcdClient::reset_request_counts() {
  std::lock_guard<std::mutex> lock(counts_mutex_);
  counts_.clear();
}

Status EtcdClient::call(const char* rpc,
                        const std::function<grpc::Status(Member&, grpc::ClientContext&)>& attempt,
                        std::optional<std::chrono::milliseconds> budget, CallCanceller* canceller) {
  const std::chrono::milliseconds call_budget = budget.value_or(options_.call_timeout);
  const Clock::time_point deadline = Clock::now() + call_budget;
  const size_t n = members_.size();
  const std::chrono::milliseconds per_member =
      budget ? std::min<std::chrono::milliseconds>(options_.attempt_timeout,
                                                   std::max<std::chrono::milliseconds>(*budget / n, std::chrono::milliseconds(1)))
             : options_.attempt_timeout;
  const size_t first = preferred_.load();
  Status last;
  // Round-robin from the member that answered last, as long as the call's budget lasts: a member
  // may come back (or a new raft leader be elected) while the call goes round.
  for (size_t i = 0;; ++i) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline && i > 0) break;
    Member& member = *members_[(first + i) % n];
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::min<Clock::duration>(deadline - now, per_member));
    if (canceller != nullptr && !canceller->attach(&context)) return cancelled_error("etcd {}: cancelled", rpc);
    count(rpc);
    const grpc::Status status = attempt(member, context);
    if (canceller != nullptr) {
      canceller->detach();
      if (canceller->cancelled()) return cancelled_error("etcd {}: cancelled", rpc);
    }
    if (status.ok() || !is_failover_code(status.error_code())) {
      preferred_.store((first + i) % n);
      return from_grpc_status(status, std::string("etcd ") + rpc, member.endpoint);
    }
    last = from_grpc_status(status, std::string("etcd ") + rpc, member.endpoint);
    // A whole round failed fast (every member refused): wait a little before the next round.
    if ((i + 1) % n == 0) {
      std::this_thread::sleep_for(std::min<Clock::duration>(
          std::chrono::milliseconds(100), std::max<Clock::duration>(deadline - Clock::now(), {})));
    }
  }
  return last.with_suffix(
      fmt::format(" (no etcd member of {} answered within {} ms)", n, call_budget.count()));
}

std::string EtcdClient::prefix_end(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

StatusOr<RangeResult> EtcdClient::range(const std::string& key, const std::string& range_end, int64_t limit,
                                        int64_t revision) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  request.set_limit(limit);
  request.set_revision(revision);
  etcdserverpb::RangeResponse response;
  COHORT_RETURN_IF_ERROR(call("Range", [&](Member& m, grpc::ClientContext& context) {
    return m.kv->Range(&context, request, &response);
  }));
  RangeResult result;
  result.revision = response.header().revision();
  result.more = response.more();
  result.count = response.count();
  result.kvs.reserve(response.kvs_size());
  for (const auto& kv : response.kvs()) result.kvs.push_back(from_proto(kv));
  return result;
}

StatusOr<RangeResult> EtcdClient::range_prefix(const std::string& prefix, int64_t limit) {
  return range(prefix, prefix_end(prefix), limit);
}

StatusOr<std::vector<KeyValue>> EtcdClient::range_all(const std::string& prefix, int64_t page_size) {
  std::vector<KeyValue> out;
  std::string from = prefix;
  const std::string end = prefix_end(prefix);
  while (true) {
    COHORT_ASSIGN_OR_RETURN(RangeResult page, range(from, end, page_size));
    for (KeyValue& kv : page.kvs) out.push_back(std::move(kv));
    if (!page.more || out.empty()) break;
    from = out.back().key + std::string(1, '\0');
  }
  return out;
}

StatusOr<int64_t> EtcdClient::put(const std::string& key, const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  COHORT_RETURN_IF_ERROR(call("Put", [&](Member& m, grpc::ClientContext& context) {
    return m.kv->Put(&context, request, &response);
  }));
  return response.header().revision();
}

Status EtcdClient::compact(int64_t revision) {
  etcdserverpb::CompactionRequest request;
  request.set_revision(revision);
  etcdserverpb::CompactionResponse response;
  // Safe to send again on another member: a compaction that landed makes the repeat OUT_OF_RANGE.
  return call("Compact", [&](Member& m, grpc::ClientContext& context) {
    return m.kv->Compact(&context, request, &response);
  });
}

bool EtcdClient::is_compacted_error(const Status& status) {
  return status.code() == StatusCode::kOutOfRange &&
         status.message().find("required revision has been compacted") != std::string::npos;
}

StatusOr<int64_t> EtcdClient::delete_range(const std::string& key, const std::string& range_end) {
  etcdserverpb::DeleteRangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  etcdserverpb::DeleteRangeResponse response;
  COHORT_RETURN_IF_ERROR(call("DeleteRange", [&](Member& m, grpc::ClientContext& context) {
    return m.kv->DeleteRange(&context, request, &response);
  }));
  return response.deleted();
}

StatusOr<int64_t> EtcdClient::delete_prefix(const std::string& prefix) {
  return delete_range(prefix, prefix_end(prefix));
}

StatusOr<TxnResult> EtcdClient::txn(const etcdserverpb::TxnRequest& request) {
  TxnResult result;
  COHORT_RETURN_IF_ERROR(call("Txn", [&](Member& m, grpc::ClientContext& context) {
    return m.kv->Txn(&context, request, &result.response);
  }));
  result.succeeded = result.response.succeeded();
  result.revision = result.response.header().revision();
  return result;
}

StatusOr<bool> EtcdClient::compare_and_swap(const std::string& key, int64_t expected_mod_revision,
                                            const std::string& value) {
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* compare = request.add_compare();
  compare->set_key(key);
  compare->set_result(etcdserverpb::Compare::EQUAL);
  compare->set_target(etcdserverpb::Compare::MOD);
  compare->set_mod_revision(expected_mod_revision);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  COHORT_ASSIGN_OR_RETURN(TxnResult result, txn(request));
  return result.succeeded;
}

etcdserverpb::Compare EtcdClient::leader_compare(const LeaderKey& leader) {
  etcdserverpb::Compare compare;
  compare.set_key(leader.key);
  compare.set_result(etcdserverpb::Compare::EQUAL);
  compare.set_target(etcdserverpb::Compare::CREATE);
  compare.set_create_revision(leader.rev);
  return compare;
}

StatusOr<TxnResult> EtcdClient::fenced_txn(etcdserverpb::TxnRequest request, const std::optional<LeaderKey>& fence) {
  if (fence) *request.add_compare() = leader_compare(*fence);
  return txn(request);
}

void EtcdClient::require_key(etcdserverpb::TxnRequest& request, const std::string& key) {
  etcdserverpb::Compare* exists = request.add_compare();
  exists->set_key(key);
  exists->set_result(etcdserverpb::Compare::GREATER);
  exists->set_target(etcdserverpb::Compare::CREATE);
  exists->set_create_revision(0);
  request.add_failure()->mutable_request_range()->set_key(key);
}

Status EtcdClient::lost_leadership_error(const std::string& what, const std::optional<LeaderKey>& fence) {
  return failed_precondition_error(
      "{} refused: this coordinator no longer leads (its election key {} with revision {} is gone or replaced); "
      "another coordinator has taken over",
      what, fence ? fence->key : "", fence ? fence->rev : 0);
}

StatusOr<int64_t> EtcdClient::lease_grant(std::chrono::seconds ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(std::max<int64_t>(1, ttl.count()));
  etcdserverpb::LeaseGrantResponse response;
  COHORT_RETURN_IF_ERROR(call("LeaseGrant", [&](Member& m, grpc::ClientContext& context) {
    return m.lease->LeaseGrant(&context, request, &response);
  }));
  if (!response.error().empty()) return unavailable_error("etcd LeaseGrant: {}", response.error());
  return response.id();
}

StatusOr<std::chrono::seconds> EtcdClient::lease_keep_alive_once(int64_t lease, CallCanceller* canceller) {
  etcdserverpb::LeaseKeepAliveResponse response;
  bool answered = false;
  COHORT_RETURN_IF_ERROR(call(
      "LeaseKeepAlive",
      [&](Member& m, grpc::ClientContext& context) {
    // LeaseKeepAlive is a bidirectional stream; one request and its answer renew the lease once.
    auto stream = m.lease->LeaseKeepAlive(&context);
    etcdserverpb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    answered = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    if (answered) context.TryCancel();  // the server keeps the stream open; we are done with it
    grpc::Status status = stream->Finish();
    if (answered) return grpc::Status::OK;
    return status.ok()
               ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream closed without an answer")
               : status;
      },
      std::nullopt, canceller));
  if (response.ttl() <= 0) {
    return not_found_error("etcd lease {:x} has expired or was revoked", lease);
  }
  return std::chrono::seconds(response.ttl());
}

Status EtcdClient::lease_revoke(int64_t lease, std::optional<std::chrono::milliseconds> budget) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return call(
      "LeaseRevoke",
      [&](Member& m, grpc::ClientContext& context) { return m.lease->LeaseRevoke(&context, request, &response); },
      budget);
}

StatusOr<LeaderKey> EtcdClient::campaign(const std::string& name, int64_t lease, const std::string& value,
                                         std::chrono::milliseconds timeout, CallCanceller* canceller) {
  v3electionpb::CampaignRequest request;
  request.set_name(name);
  request.set_lease(lease);
  request.set_value(value);
  v3electionpb::CampaignResponse response;
  Member& member = *members_[preferred_.load() % members_.size()];
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (canceller != nullptr && !canceller->attach(&context)) {
    return cancelled_error("etcd Campaign for '{}': cancelled", name);
  }
  count("Campaign");
  const grpc::Status status = member.election->Campaign(&context, request, &response);
  if (canceller != nullptr) canceller->detach();
  if (!status.ok()) {
    // Another member may answer the next campaign.
    if (is_failover_code(status.error_code())) preferred_.store((preferred_.load() + 1) % members_.size());
    return from_grpc_status(status, "etcd Campaign", member.endpoint);
  }
  return from_proto(response.leader());
}

Status EtcdClient::proclaim(const LeaderKey& leader, const std::string& value) {
  v3electionpb::ProclaimRequest request;
  *request.mutable_leader() = to_proto(leader);
  request.set_value(value);
  v3electionpb::ProclaimResponse response;
  Status status = call("Proclaim", [&](Member& m, grpc::ClientContext& context) {
    return m.election->Proclaim(&context, request, &response);
  });
  // etcd answers a proclamation by a candidate that lost its key with "election: not leader".
  if (!status.ok() && status.message().find("not leader") != std::string::npos) {
    return failed_precondition_error("{}", status.message());
  }
  return status;
}

StatusOr<std::optional<KeyValue>> EtcdClient::leader(const std::string& name, CallCanceller* canceller) {
  v3electionpb::LeaderRequest request;
  request.set_name(name);
  v3electionpb::LeaderResponse response;
  Status status = call(
      "Leader", [&](Member& m, grpc::ClientContext& context) { return m.election->Leader(&context, request, &response); },
      std::nullopt, canceller);
  // etcd reports an election without candidates as an error ("election: no leader").
  if (!status.ok() && status.message().find("no leader") != std::string::npos)
    return std::optional<KeyValue>();
  COHORT_RETURN_IF_ERROR(status);
  if (!response.has_kv()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(from_proto(response.kv()));
}

Status EtcdClient::observe(const std::string& name, const std::function<bool(const KeyValue&)>& on_leader,
                           std::chrono::milliseconds timeout, CallCanceller* canceller) {
  v3electionpb::LeaderRequest request;
  request.set_name(name);
  Member& member = *members_[preferred_.load() % members_.size()];
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (canceller != nullptr && !canceller->attach(&context)) {
    return cancelled_error("etcd Observe of '{}': cancelled", name);
  }
  count("Observe");
  auto stream = member.election->Observe(&context, request);
  v3electionpb::LeaderResponse response;
  bool stopped_by_callback = false;
  while (stream->Read(&response)) {
    if (!on_leader(from_proto(response.kv()))) {
      stopped_by_callback = true;
      context.TryCancel();
      break;
    }
  }
  const grpc::Status status = stream->Finish();
  if (canceller != nullptr) canceller->detach();
  if (stopped_by_callback) return ok_status();
  if (status.ok())
    return unavailable_error("etcd Observe of '{}' on {}: the stream ended", name, member.endpoint);
  return from_grpc_status(status, "etcd Observe", member.endpoint);
}

Status EtcdClient::resign(const LeaderKey& leader, std::optional<std::chrono::milliseconds> budget) {
  v3electionpb::ResignRequest request;
  *request.mutable_leader() = to_proto(leader);
  v3electionpb::ResignResponse response;
  return call(
      "Resign",
      [&](Member& m, grpc::ClientContext& context) { return m.election->Resign(&context, request, &response); },
      budget);
}

}  // namespace cohort::etcd
