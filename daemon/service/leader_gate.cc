#include "daemon/service/leader_gate.h"

#include <fmt/format.h>

#include "worker/base/leader_channel.h"

namespace cohort::daemon {

void LeaderGate::lead(cohort::v1::Coordinator::Service* coordinator, cohort::v1::Rendezvous::Service* rendezvous) {
  coordinator_.store(coordinator, std::memory_order_release);
  rendezvous_.store(rendezvous, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader_.clear();
  }
  leading_.store(true, std::memory_order_release);
}

void LeaderGate::follow(const std::string& leader) {
  // Closed first: from here on no new call reaches the installed services.
  leading_.store(false, std::memory_order_release);
  std::lock_guard<std::mutex> lock(mu_);
  leader_ = leader == self_ ? "" : leader;
}

void LeaderGate::set_self(const std::string& self) {
  std::lock_guard<std::mutex> lock(mu_);
  self_ = self;
}

std::string LeaderGate::leader() const {
  std::lock_guard<std::mutex> lock(mu_);
  return leading() ? self_ : leader_;
}

std::string LeaderGate::refusal() const {
  if (leading()) return "";
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format(
      "cohortd at {} is a standby coordinator; the leader is {}", self_,
      leader_.empty() ? "not known yet (an election is under way; try again in a few seconds)" : leader_);
}

grpc::Status LeaderGate::refuse(grpc::ServerContext* context) const {
  std::string leader;
  std::string text;
  {
    std::lock_guard<std::mutex> lock(mu_);
    leader = leader_;
    text = fmt::format(
        "cohortd at {} is a standby coordinator; the leader is {}", self_,
        leader_.empty() ? "not known yet (an election is under way; try again in a few seconds)" : leader_);
  }
  context->AddTrailingMetadata(tls::kLeaderMetadata, leader);
  return grpc::Status(grpc::StatusCode::UNAVAILABLE, text);
}

cohort::v1::Coordinator::Service* LeaderGate::coordinator(grpc::ServerContext* context, grpc::Status* refusal) const {
  if (leading()) return coordinator_.load(std::memory_order_acquire);
  *refusal = refuse(context);
  return nullptr;
}

cohort::v1::Rendezvous::Service* LeaderGate::rendezvous(grpc::ServerContext* context, grpc::Status* refusal) const {
  if (leading()) return rendezvous_.load(std::memory_order_acquire);
  *refusal = refuse(context);
  return nullptr;
}

}  // namespace cohort::daemon
