#include "daemon/etcd/etcd_rendezvous_journal.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "daemon/etcd/job_records.pb.h"

namespace cohort::etcd {
namespace {

constexpr const char* kProgressKey = "progress";
constexpr const char* kStorePrefix = "kv/";
constexpr const char* kRequestPrefix = "req/";

}  // namespace

EtcdRendezvousJournal::EtcdRendezvousJournal(EtcdClient* client, std::string attempt_prefix,
                                             std::optional<LeaderKey> fence, std::string what)
    : client_(client), prefix_(std::move(attempt_prefix)), fence_(std::move(fence)), what_(std::move(what)) {}

std::string EtcdRendezvousJournal::progress_key(const std::string& attempt_prefix) {
  return attempt_prefix + kProgressKey;
}

etcdserverpb::RequestOp EtcdRendezvousJournal::open_op(const std::string& attempt_prefix) {
  etcdserverpb::RequestOp op;
  etcdserverpb::PutRequest* put = op.mutable_request_put();
  put->set_key(progress_key(attempt_prefix));
  // An empty StoredRendezvousProgress (no field set) serializes to no bytes: progress zero.
  put->set_value("");
  return op;
}

Status EtcdRendezvousJournal::write(etcdserverpb::TxnRequest request, const std::string& what) {
  // The attempt is open while its progress record exists (open_op made it; the save that ended the
  // attempt deleted it): a missing one is an ended attempt, not a lost leadership.
  EtcdClient::require_key(request, progress_key(prefix_));
  COHORT_ASSIGN_OR_RETURN(TxnResult result, client_->fenced_txn(std::move(request), fence_));
  if (result.succeeded) return ok_status();
  if (EtcdClient::key_was_missing(result)) {
    return failed_precondition_error(
        "{} of {} refused: the attempt has ended (its rendezvous journal {} is gone, deleted by the write "
        "that ended it) or was never placed; nothing is journaled for it",
        what, what_, prefix_);
  }
  return EtcdClient::lost_leadership_error(fmt::format("{} of {}", what, what_), fence_);
}

Status EtcdRendezvousJournal::write_progress(const coordinator::RendezvousProgress& progress) {
  etcdstore::StoredRendezvousProgress stored;
  for (int rank : progress.joined) stored.add_joined(rank);
  stored.set_barrier_generation(progress.barrier_generation);
  for (int rank : progress.left) stored.add_left(rank);
  etcdserverpb::TxnRequest request;
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(prefix_ + kProgressKey);
  if (!stored.SerializeToString(put->mutable_value()))
    return internal_error("the rendezvous progress of {}: cannot serialize it", what_);
  return write(std::move(request), "journaling the rendezvous progress");
}

Status EtcdRendezvousJournal::write_key(const std::string& key, const std::optional<std::string>& value,
                                        const coordinator::AnsweredRequest& answered,
                                        const std::vector<std::string>& forget) {
  etcdserverpb::TxnRequest request;
  if (value.has_value()) {
    etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(prefix_ + kStorePrefix + key);
    put->set_value(*value);
  } else {
    request.add_success()->mutable_request_delete_range()->set_key(prefix_ + kStorePrefix + key);
  }
  if (!answered.id.empty()) {
    etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
    put->set_key(prefix_ + kRequestPrefix + answered.id);
    put->set_value(answered.answer);
  }
  for (const std::string& id : forget)
    request.add_success()->mutable_request_delete_range()->set_key(prefix_ + kRequestPrefix + id);
  return write(std::move(request), "journaling store key '" + key + "'");
}

StatusOr<coordinator::RendezvousState> EtcdRendezvousJournal::decode(const std::string& attempt_prefix,
                                                                     const std::vector<KeyValue>& kvs) {
  coordinator::RendezvousState state;
  std::vector<std::pair<int64_t, coordinator::AnsweredRequest>> answered;  // by revision
  for (const KeyValue& kv : kvs) {
    if (!EtcdClient::has_prefix(kv.key, attempt_prefix)) continue;
    const std::string name = kv.key.substr(attempt_prefix.size());
    if (name == kProgressKey) {
      etcdstore::StoredRendezvousProgress stored;
      if (!stored.ParseFromString(kv.value))
        return data_loss_error("etcd key {}: not a StoredRendezvousProgress record", kv.key);
      state.progress.joined.insert(stored.joined().begin(), stored.joined().end());
      state.progress.barrier_generation = stored.barrier_generation();
      state.progress.left.insert(stored.left().begin(), stored.left().end());
    } else if (EtcdClient::has_prefix(name, kStorePrefix)) {
      state.data.emplace(name.substr(std::string(kStorePrefix).size()), kv.value);
    } else if (EtcdClient::has_prefix(name, kRequestPrefix)) {
      answered.emplace_back(kv.mod_revision, coordinator::AnsweredRequest{
                                                 name.substr(std::string(kRequestPrefix).size()), kv.value});
    } else {
      return data_loss_error("etcd key {}: not a rendezvous record (expected {}, {}<key> or {}<request id>)",
                             kv.key, kProgressKey, kStorePrefix, kRequestPrefix);
    }
  }
  std::stable_sort(answered.begin(), answered.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& item : answered) state.answered.push_back(std::move(item.second));
  return state;
}

}  // namespace cohort::etcd
