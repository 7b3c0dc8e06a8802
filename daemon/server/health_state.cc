#include "daemon/server/health_state.h"

#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace cohort::daemon {

HealthState::HealthState(grpc::HealthCheckServiceInterface* health, std::vector<std::string> services)
    : health_(health), services_(std::move(services)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& service : services_) wanted_[service] = true;
  publish_locked();
}

Status HealthState::set_serving(const std::string& service, bool serving) {
  std::lock_guard<std::mutex> lock(mu_);
  auto entry = wanted_.find(service);
  if (entry == wanted_.end()) {
    return not_found_error("this daemon serves no service {:?} to report health for; it serves {}", service,
                           fmt::join(services_, ", "));
  }
  entry->second = serving;
  publish_locked();
  return ok_status();
}

void HealthState::set_up() {
  std::lock_guard<std::mutex> lock(mu_);
  up_ = true;
  publish_locked();
}

void HealthState::set_draining() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
  publish_locked();
}

bool HealthState::serving(const std::string& service) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!up_ || draining_) return false;
  if (service.empty()) {
    for (const auto& [name, wanted] : wanted_) {
      if (!wanted) return false;
    }
    return true;
  }
  auto entry = wanted_.find(service);
  return entry != wanted_.end() && entry->second;
}

void HealthState::publish_locked() {
  const bool live = up_ && !draining_;
  bool all = live;
  for (const auto& [service, wanted] : wanted_) {
    all = all && wanted;
    if (health_ != nullptr) health_->SetServingStatus(service, live && wanted);
  }
  if (health_ != nullptr) health_->SetServingStatus("", all);
}

}  // namespace cohort::daemon
