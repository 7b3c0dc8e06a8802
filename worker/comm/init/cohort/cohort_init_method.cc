#include "worker/comm/init/cohort/cohort_init_method.h"

#include <algorithm>
#include <charconv>
#include <memory>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include "cohort/v1/rendezvous.grpc.pb.h"
#include "worker/base/leader_channel.h"
#include "worker/base/tls.h"
#include "worker/base/grpc_status.h"
#include "worker/comm/init/cohort/rendezvous_store.h"

namespace cohort::comm {
namespace {

// The attempt of a URL without ?attempt=: a job's first.
constexpr int kDefaultAttempt = 1;

StatusOr<std::string> job_id_of(const InitUrl& url) {
  std::string job = url.path;
  if (!job.empty() && job.front() == '/') job.erase(0, 1);
  if (job.empty() || job.find('/') != std::string::npos) {
    return invalid_argument_error(
        "init URL {:?}: the path must be the job id, as in cohort://host:port/<job>", url.text);
  }
  return job;
}

StatusOr<int> attempt_of(const InitUrl& url) {
  auto it = url.query.find("attempt");
  if (it == url.query.end()) return kDefaultAttempt;
  int attempt = 0;
  const std::string& text = it->second;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), attempt);
  if (error != std::errc() || end != text.data() + text.size() || attempt < 1) {
    return invalid_argument_error("init URL {:?}: attempt={:?} is not an attempt number (1, 2, ...)",
                                  url.text, text);
  }
  return attempt;
}

}  // namespace

StatusOr<Bootstrap> cohort_init(const InitUrl& url, const InitOptions& options) {
  // Rejects a malformed authority before dialling it.
  // One coordinator, or the list of highly available ones (cohort://h1:p1,h2:p2/job, issue 16).
  StatusOr<std::vector<std::string>> listed = tls::parse_address_list(url.authority);
  if (!listed.ok()) return listed.status().with_context(fmt::format("init URL {:?}", url.text));
  const std::vector<std::string> coordinators = *listed;
  for (const std::string& coordinator : coordinators) COHORT_RETURN_IF_ERROR(parse_host_port(coordinator, url.text).status());
  COHORT_ASSIGN_OR_RETURN(std::string job_id, job_id_of(url));
  COHORT_ASSIGN_OR_RETURN(int attempt, attempt_of(url));
  if (options.local_rank < 0) {
    return invalid_argument_error(
        "init URL {:?}: cohort:// needs this worker's slot on its node; add ?local_rank=N", url.text);
  }
  if (options.node_id.empty()) {
    return invalid_argument_error("init URL {:?}: no node id; set COHORT_NODE_ID to the node's registered id",
                                  url.text);
  }

  // TLS with the cluster CA and the attempt's secret, both from the agent (COHORT_CA_CERTIFICATE,
  // COHORT_JOB_SECRET): the coordinator admits only this attempt's ranks to its rendezvous.
  auto leader = std::make_shared<tls::LeaderChannel>(coordinators, tls::worker_security_from_environment());
  cohort::v1::JoinRequest request;
  request.mutable_attempt()->set_job_id(job_id);
  request.mutable_attempt()->set_attempt(attempt);
  request.set_node_id(options.node_id);
  request.set_local_slot(options.local_rank);
  request.set_timeout_ms(std::max<int64_t>(options.timeout.count(), 1));
  cohort::v1::JoinResponse joined;
  grpc::Status joining = leader->unary<cohort::v1::Rendezvous>(
      std::chrono::system_clock::now() + options.timeout + kRpcDeadlineSlack,
      &cohort::v1::Rendezvous::Stub::Join, request, &joined, [](grpc::ClientContext& context) {
        // The coordinator may still be starting: wait for it rather than failing on the first refusal.
        context.set_wait_for_ready(true);
      });
  COHORT_RETURN_IF_ERROR(from_grpc_status(joining, "Rendezvous.Join", leader->leader_address())
                             .with_context(fmt::format("init URL {:?}", url.text)));

  if (options.rank >= 0 && options.rank != joined.rank()) {
    return invalid_argument_error(
        "init URL {:?}: rank={} was given but the coordinator placed this slot as rank {}", url.text,
        options.rank, joined.rank());
  }
  if (options.world_size >= 0 && options.world_size != joined.world_size()) {
    return invalid_argument_error("init URL {:?}: world_size={} was given but the job has {} ranks", url.text,
                                  options.world_size, joined.world_size());
  }
  Bootstrap boot;
  // The store follows the leader too, starting at the one that answered the join.
  boot.store = std::make_shared<RendezvousStore>(std::move(leader), job_id, attempt);
  boot.rank = joined.rank();
  boot.world_size = joined.world_size();
  boot.local_rank = joined.local_rank();
  boot.local_world_size = joined.local_world_size();
  boot.node_id = options.node_id;
  boot.master_address = joined.master_address();
  return boot;
}

Status register_cohort_init_method() {
  Status status = register_init_method("cohort", cohort_init);
  if (status.code() == StatusCode::kAlreadyExists) return ok_status();
  return status;
}

}  // namespace cohort::comm
