#pragma once

// HealthState: what cohortd's grpc.health.v1 service answers, per service.
//
// Each service this daemon serves ("cohort.v1.Coordinator", "cohort.v1.Agent", ...) is SERVING
// when its owner says it may serve (set_serving; true unless told otherwise) and the daemon is up
// and not draining. The whole daemon (service "") is SERVING when every one of its services is.
// Who flips a service: the drain (SIGTERM) turns everything NOT_SERVING for good; a standby
// coordinator, or a coordinator whose job store is unreachable, sets "cohort.v1.Coordinator"
// NOT_SERVING until it can serve again, so load balancers and `grpc_health_probe -service`
// route around it.
//
//   HealthState health(server->GetHealthCheckService(), {"cohort.v1.Coordinator", "cohort.v1.Info"});
//   health.set_up();                                           // after start: SERVING
//   COHORT_RETURN_IF_ERROR(health.set_serving("cohort.v1.Coordinator", false));  // standby
//   health.set_draining();                                      // SIGTERM: NOT_SERVING for good
//
// Thread-safe; every method is non-blocking. The health service is not owned and must outlive
// this object (it is the grpc::Server's).

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/health_check_service_interface.h>

#include "worker/base/status.h"

namespace cohort::daemon {

class HealthState {
 public:
  // Publishes every service in `services` (full names) and "" as NOT_SERVING until set_up().
  // `health` may be null (no health service): then the state is kept but published nowhere.
  HealthState(grpc::HealthCheckServiceInterface* health, std::vector<std::string> services);

  // Whether `service` may serve, as its owner sees it. NOT_FOUND naming the served services for a
  // name this daemon does not serve (including "", which follows the others).
  Status set_serving(const std::string& service, bool serving);
  // The daemon is up: services whose owner allows it turn SERVING.
  void set_up();
  // The daemon drains or shuts down: every service NOT_SERVING, whatever set_serving says later.
  void set_draining();

  // What the health service answers for `service` ("" for the whole daemon) now; false for a
  // service this daemon does not serve.
  bool serving(const std::string& service) const;
  // The services published, as given.
  const std::vector<std::string>& services() const { return services_; }

 private:
  // Pushes the effective status of every service and "" to the health service. Requires mu_.
  void publish_locked();

  grpc::HealthCheckServiceInterface* const health_;
  const std::vector<std::string> services_;
  mutable std::mutex mu_;
  std::map<std::string, bool> wanted_;  // guarded by mu_; per service, its owner's say
  bool up_ = false;                     // guarded by mu_
  bool draining_ = false;               // guarded by mu_
};

}  // namespace cohort::daemon
