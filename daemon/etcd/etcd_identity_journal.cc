#include "daemon/etcd/etcd_identity_journal.h"

#include <algorithm>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "daemon/etcd/job_records.pb.h"

namespace cohort::etcd {
namespace {

using coordinator::CertificateRecord;
using coordinator::IdentityRecords;
using coordinator::JoinTokenRecord;
using coordinator::UserRecord;

template <typename Message>
Status add_put(etcdserverpb::TxnRequest* request, const std::string& key, const Message& message) {
  etcdserverpb::PutRequest* put = request->add_success()->mutable_request_put();
  put->set_key(key);
  if (!message.SerializeToString(put->mutable_value()))
    return internal_error("etcd key {}: cannot serialize it", key);
  return ok_status();
}

etcdstore::StoredUser stored_user(const UserRecord& user) {
  etcdstore::StoredUser stored;
  stored.set_name(user.name);
  stored.set_token_sha256(user.token_sha256);
  stored.set_admin(user.admin);
  stored.set_revoked(user.revoked);
  stored.set_create_unix_ms(user.create_unix_ms);
  return stored;
}

etcdstore::StoredJoinToken stored_join_token(const JoinTokenRecord& token) {
  etcdstore::StoredJoinToken stored;
  stored.set_secret_sha256(token.secret_sha256);
  stored.set_expire_unix_ms(token.expire_unix_ms);
  return stored;
}

etcdstore::StoredNodeCertificate stored_certificate(const CertificateRecord& certificate) {
  etcdstore::StoredNodeCertificate stored;
  stored.set_serial(certificate.serial);
  stored.set_node_id(certificate.node_id);
  stored.set_revoked(certificate.revoked);
  stored.set_not_after_unix_ms(certificate.not_after_unix_ms);
  return stored;
}

}  // namespace

EtcdIdentityJournal::EtcdIdentityJournal(EtcdClient* client, std::string prefix,
                                         std::optional<LeaderKey> fence)
    : client_(client), prefix_(std::move(prefix)), fence_(std::move(fence)) {}

std::string EtcdIdentityJournal::description() const {
  std::string endpoints;
  for (const std::string& endpoint : client_->options().endpoints)
    endpoints += (endpoints.empty() ? "" : ",") + endpoint;
  return "etcd://" + endpoints + identity_prefix();
}

Status EtcdIdentityJournal::write(etcdserverpb::TxnRequest request, const std::string& what) {
  COHORT_ASSIGN_OR_RETURN(TxnResult result, client_->fenced_txn(std::move(request), fence_));
  if (result.succeeded) return ok_status();
  return EtcdClient::lost_leadership_error(fmt::format("{} in {}", what, description()), fence_);
}

StatusOr<std::optional<IdentityRecords>> EtcdIdentityJournal::load() {
  COHORT_ASSIGN_OR_RETURN(std::vector<KeyValue> kvs,
                          client_->range_all(identity_prefix(), kIdentityLoadPageSize));
  IdentityRecords records;
  bool seeded = false;
  for (const KeyValue& kv : kvs) {
    if (kv.key == seeded_key()) {
      seeded = true;
    } else if (EtcdClient::has_prefix(kv.key, identity_prefix() + "users/")) {
      etcdstore::StoredUser stored;
      if (!stored.ParseFromString(kv.value))
        return data_loss_error("etcd key {}: not a StoredUser record", kv.key);
      records.users.push_back(UserRecord{stored.name(), stored.token_sha256(), stored.admin(),
                                         stored.revoked(), stored.create_unix_ms()});
    } else if (EtcdClient::has_prefix(kv.key, identity_prefix() + "join_tokens/")) {
      etcdstore::StoredJoinToken stored;
      if (!stored.ParseFromString(kv.value))
        return data_loss_error("etcd key {}: not a StoredJoinToken record", kv.key);
      records.join_tokens.push_back(JoinTokenRecord{stored.secret_sha256(), stored.expire_unix_ms()});
    } else if (EtcdClient::has_prefix(kv.key, identity_prefix() + "certificates/")) {
      etcdstore::StoredNodeCertificate stored;
      if (!stored.ParseFromString(kv.value))
        return data_loss_error("etcd key {}: not a StoredNodeCertificate record", kv.key);
      records.certificates.push_back(
          CertificateRecord{stored.serial(), stored.node_id(), stored.revoked(), stored.not_after_unix_ms()});
    }
  }
  // Records without the marker are a seeding cut short (its leader died between transactions):
  // the next leader seeds again over them.
  if (!seeded) return std::optional<IdentityRecords>();
  return std::optional<IdentityRecords>(std::move(records));
}

Status EtcdIdentityJournal::seed(const IdentityRecords& records) {
  std::vector<etcdserverpb::TxnRequest> requests(1);
  auto next = [&]() -> etcdserverpb::TxnRequest* {
    if (requests.back().success_size() >= kMaxOpsPerTxn) requests.emplace_back();
    return &requests.back();
  };
  for (const UserRecord& user : records.users)
    COHORT_RETURN_IF_ERROR(add_put(next(), user_key(user.name), stored_user(user)));
  for (const JoinTokenRecord& token : records.join_tokens)
    COHORT_RETURN_IF_ERROR(add_put(next(), join_token_key(token.secret_sha256), stored_join_token(token)));
  for (const CertificateRecord& certificate : records.certificates)
    COHORT_RETURN_IF_ERROR(
        add_put(next(), certificate_key(certificate.serial), stored_certificate(certificate)));
  // The marker goes with the last records, and only if no other coordinator seeded first.
  etcdserverpb::TxnRequest* last = next();
  etcdserverpb::PutRequest* marker = last->add_success()->mutable_request_put();
  marker->set_key(seeded_key());
  marker->set_value("1");
  etcdserverpb::Compare* unseeded = last->add_compare();
  unseeded->set_key(seeded_key());
  unseeded->set_result(etcdserverpb::Compare::EQUAL);
  unseeded->set_target(etcdserverpb::Compare::CREATE);
  unseeded->set_create_revision(0);
  for (size_t i = 0; i < requests.size(); ++i) {
    COHORT_RETURN_IF_ERROR(
        write(std::move(requests[i]),
              fmt::format("seeding the identities ({} users, {} join tokens, {} certificates; "
                          "transaction {} of {}; refused also when another coordinator seeded "
                          "them first)",
                          records.users.size(), records.join_tokens.size(), records.certificates.size(),
                          i + 1, requests.size())));
  }
  return ok_status();
}

Status EtcdIdentityJournal::put_user(const UserRecord& user) {
  etcdserverpb::TxnRequest request;
  COHORT_RETURN_IF_ERROR(add_put(&request, user_key(user.name), stored_user(user)));
  return write(std::move(request),
               fmt::format("writing user {}{}", user.name, user.revoked ? " (revoked)" : ""));
}

Status EtcdIdentityJournal::put_join_token(const JoinTokenRecord& token) {
  etcdserverpb::TxnRequest request;
  COHORT_RETURN_IF_ERROR(add_put(&request, join_token_key(token.secret_sha256), stored_join_token(token)));
  return write(std::move(request), "writing a join token");
}

Status EtcdIdentityJournal::consume_join_token(const std::string& secret_sha256) {
  std::random_device random;
  return consume_join_token(secret_sha256, fmt::format("{:08x}{:08x}", random(), random()));
}

Status EtcdIdentityJournal::consume_join_token(const std::string& secret_sha256, const std::string& attempt_id) {
  const std::string key = join_token_key(secret_sha256);
  const std::string used = used_join_token_key(secret_sha256);
  etcdserverpb::TxnRequest request;
  // The token must still be there: a missing one was used already, not lost with the leadership.
  EtcdClient::require_key(request, key);
  // EtcdClient::call sends this same request to another member when one does not answer in time,
  // and that one may have applied it: the marker, read back when the token is missing, tells this
  // request's own earlier success (attempt_id) from another node's use. It lives on the leader's
  // lease (one small key per join while this coordinator leads).
  request.add_failure()->mutable_request_range()->set_key(used);
  request.add_success()->mutable_request_delete_range()->set_key(key);
  etcdserverpb::PutRequest* mark = request.add_success()->mutable_request_put();
  mark->set_key(used);
  mark->set_value(attempt_id);
  if (fence_ && fence_->lease != 0) mark->set_lease(fence_->lease);
  COHORT_ASSIGN_OR_RETURN(TxnResult result, client_->fenced_txn(std::move(request), fence_));
  if (result.succeeded) return ok_status();
  if (EtcdClient::key_was_missing(result)) {
    const etcdserverpb::RangeResponse& marker = result.response.responses(1).response_range();
    if (marker.kvs_size() == 1 && marker.kvs(0).value() == attempt_id) return ok_status();
    return permission_denied_error(
        "the join token is not valid any more: a node used it already (one token admits one node, whichever "
        "coordinator led); an admin makes a new one with `cohort node token`");
  }
  return EtcdClient::lost_leadership_error(fmt::format("using a join token in {}", description()), fence_);
}

Status EtcdIdentityJournal::delete_join_tokens(const std::vector<std::string>& secret_sha256s) {
  std::vector<etcdserverpb::RequestOp> ops(secret_sha256s.size());
  for (size_t i = 0; i < secret_sha256s.size(); ++i)
    ops[i].mutable_request_delete_range()->set_key(join_token_key(secret_sha256s[i]));
  return write_batches(std::move(ops),
                       fmt::format("deleting {} expired join token(s)", secret_sha256s.size()));
}

Status EtcdIdentityJournal::put_certificates(const std::vector<CertificateRecord>& certificates) {
  if (certificates.empty()) return ok_status();
  std::vector<etcdserverpb::RequestOp> ops(certificates.size());
  for (size_t i = 0; i < certificates.size(); ++i) {
    etcdserverpb::PutRequest* put = ops[i].mutable_request_put();
    put->set_key(certificate_key(certificates[i].serial));
    if (!stored_certificate(certificates[i]).SerializeToString(put->mutable_value()))
      return internal_error("etcd key {}: cannot serialize it", put->key());
  }
  return write_batches(std::move(ops), fmt::format("writing {} certificate record(s) of node {}",
                                                   certificates.size(), certificates.front().node_id));
}

Status EtcdIdentityJournal::write_batches(std::vector<etcdserverpb::RequestOp> ops, const std::string& what) {
  const size_t batches = (ops.size() + kMaxOpsPerTxn - 1) / kMaxOpsPerTxn;
  for (size_t batch = 0; batch < batches; ++batch) {
    const size_t begin = batch * kMaxOpsPerTxn;
    const size_t end = std::min(ops.size(), begin + kMaxOpsPerTxn);
    etcdserverpb::TxnRequest request;
    for (size_t i = begin; i < end; ++i) *request.add_success() = std::move(ops[i]);
    Status written =
        write(std::move(request), batches == 1 ? what
                                               : fmt::format("{} (transaction {} of {}, keys {}-{})", what,
                                                             batch + 1, batches, begin + 1, end));
    if (!written.ok() && batch > 0) {
      return written.with_suffix(
          fmt::format("; the first {} of the {} keys were written, the rest were not (run the change again, "
                      "at the leader: it writes them all again)",
                      begin, ops.size()));
    }
    COHORT_RETURN_IF_ERROR(written);
  }
  return ok_status();
}

}  // namespace cohort::etcd
