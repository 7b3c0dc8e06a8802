#include "worker/comm/init/cohort/rendezvous_store.h"

#include <algorithm>
#include <random>
#include <utility>

#include <fmt/format.h>

#include "worker/base/grpc_status.h"

namespace cohort::comm {
namespace {

// The server reads timeout_ms 0 as "its default"; a caller's zero wait means "check once".
int64_t timeout_field(Duration timeout) { return std::max<int64_t>(timeout.count(), 1); }

// 128 random bits: two processes (or two stores in one) never draw the same client id.
std::string random_client_id() {
  std::random_device device;
  std::string id;
  for (int i = 0; i < 4; ++i) id += fmt::format("{:08x}", static_cast<uint32_t>(device()));
  return id;
}

}  // namespace

RendezvousStore::RendezvousStore(std::shared_ptr<tls::LeaderChannel> leader, std::string job_id, int attempt)
    : leader_(std::move(leader)),
      job_id_(std::move(job_id)),
      attempt_(attempt),
      client_id_(random_client_id()) {}

std::string RendezvousStore::next_request_id() {
  return fmt::format("{}-{}", client_id_, next_request_.fetch_add(1, std::memory_order_relaxed));
}

template <typename Request, typename Response, typename Method>
Status RendezvousStore::call(std::string_view rpc, Method method, Request& request, Response* response,
                             Duration rpc_timeout) {
  cohort::v1::AttemptRef* ref = request.mutable_attempt();
  ref->set_job_id(job_id_);
  ref->set_attempt(attempt_);
  const grpc::Status status = leader_->unary<cohort::v1::Rendezvous>(
      std::chrono::system_clock::now() + rpc_timeout, method, request, response);
  return from_grpc_status(status, rpc, leader_->leader_address());
}

Status RendezvousStore::set(std::string_view key, std::string_view value) {
  cohort::v1::SetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  cohort::v1::SetResponse response;
  return call("Rendezvous.Set", &cohort::v1::Rendezvous::Stub::Set, request, &response, kStoreRpcTimeout);
}

StatusOr<std::string> RendezvousStore::get(std::string_view key, Duration timeout) {
  cohort::v1::GetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_ms(timeout_field(timeout));
  cohort::v1::GetResponse response;
  COHORT_RETURN_IF_ERROR(call("Rendezvous.Get", &cohort::v1::Rendezvous::Stub::Get, request, &response,
                              timeout + kRpcDeadlineSlack));
  return std::move(*response.mutable_value());
}

StatusOr<int64_t> RendezvousStore::add(std::string_view key, int64_t delta) {
  cohort::v1::AddRequest request;
  request.set_key(std::string(key));
  request.set_delta(delta);
  request.set_request_id(next_request_id());
  cohort::v1::AddResponse response;
  COHORT_RETURN_IF_ERROR(
      call("Rendezvous.Add", &cohort::v1::Rendezvous::Stub::Add, request, &response, kStoreRpcTimeout));
  return static_cast<int64_t>(response.value());
}

StatusOr<std::string> RendezvousStore::compare_set(std::string_view key, std::string_view expected,
                                                   std::string_view desired) {
  cohort::v1::CompareSetRequest request;
  request.set_key(std::string(key));
  request.set_expected(std::string(expected));
  request.set_desired(std::string(desired));
  cohort::v1::CompareSetResponse response;
  COHORT_RETURN_IF_ERROR(call("Rendezvous.CompareSet", &cohort::v1::Rendezvous::Stub::CompareSet, request,
                              &response, kStoreRpcTimeout));
  return std::move(*response.mutable_value());
}

Status RendezvousStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  cohort::v1::WaitRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  request.set_timeout_ms(timeout_field(timeout));
  cohort::v1::WaitResponse response;
  return call("Rendezvous.Wait", &cohort::v1::Rendezvous::Stub::Wait, request, &response,
              timeout + kRpcDeadlineSlack);
}

StatusOr<bool> RendezvousStore::check(const std::vector<std::string>& keys) {
  cohort::v1::CheckRequest request;
  for (const std::string& key : keys) request.add_keys(key);
  cohort::v1::CheckResponse response;
  COHORT_RETURN_IF_ERROR(
      call("Rendezvous.Check", &cohort::v1::Rendezvous::Stub::Check, request, &response, kStoreRpcTimeout));
  return static_cast<bool>(response.all_set());
}

StatusOr<bool> RendezvousStore::delete_key(std::string_view key) {
  cohort::v1::DeleteRequest request;
  request.set_key(std::string(key));
  request.set_request_id(next_request_id());
  cohort::v1::DeleteResponse response;
  COHORT_RETURN_IF_ERROR(
      call("Rendezvous.Delete", &cohort::v1::Rendezvous::Stub::Delete, request, &response, kStoreRpcTimeout));
  return static_cast<bool>(response.existed());
}

StatusOr<int64_t> RendezvousStore::num_keys() {
  cohort::v1::NumKeysRequest request;
  cohort::v1::NumKeysResponse response;
  COHORT_RETURN_IF_ERROR(call("Rendezvous.NumKeys", &cohort::v1::Rendezvous::Stub::NumKeys, request,
                              &response, kStoreRpcTimeout));
  return static_cast<int64_t>(response.num_keys());
}

}  // namespace cohort::comm
