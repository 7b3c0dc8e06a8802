#pragma once

// The C++ client of a cohort cluster, over the gRPC stubs: the `cohort` CLI and schedulers use it.
//
//   Client client(default_coordinator_address());
//   COHORT_ASSIGN_OR_RETURN(std::string id, client.submit(spec));
//   COHORT_RETURN_IF_ERROR(client.watch(id, [](const cohort::v1::JobEvent& event) {
//     ... print progress ...
//     return true;  // keep watching
//   }));
//   COHORT_ASSIGN_OR_RETURN(cohort::v1::JobRecord job, client.get(id));
//   COHORT_RETURN_IF_ERROR(client.logs(id, /*rank=*/0, /*follow=*/false,
//                                      [](std::string_view bytes) { ...; return true; }));
//
// Every unary call carries a deadline (ClientOptions::rpc_timeout). An error names the RPC, the
// address it went to and, when the daemon cannot be reached, what to do about it.
//
// Thread-safe: calls may run concurrently from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/info.grpc.pb.h"
#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"
#include "worker/base/leader_channel.h"
#include "worker/base/tls.h"

namespace cohort::client {

// Deadline for a single unary RPC unless ClientOptions says otherwise.
inline constexpr std::chrono::seconds kDefaultRpcTimeout{10};
// HTTP/2 keepalive of the client's channels: a stream (watch, logs -f) has no deadline, so a peer
// that vanished without closing the connection (host down, network cut) must still be noticed.
// A ping every kKeepaliveTime, also while no call runs; no answer within kKeepaliveTimeout closes
// the connection and the stream ends UNAVAILABLE. The daemon's server accepts pings this often.
inline constexpr std::chrono::milliseconds kKeepaliveTime = tls::kKeepaliveTime;
inline constexpr std::chrono::milliseconds kKeepaliveTimeout = tls::kKeepaliveTimeout;
// The coordinator address when neither --coordinator nor $COHORT_COORDINATOR gives one.
inline constexpr const char* kDefaultCoordinatorAddress = "127.0.0.1:7070";

// The coordinator address: $COHORT_COORDINATOR, else 127.0.0.1:7070.
std::string default_coordinator_address();

struct ClientOptions {
  std::chrono::milliseconds rpc_timeout = kDefaultRpcTimeout;  // each unary call
  // TLS and the user's token, usually from a credentials file (security_from_credentials); the
  // default is plaintext, which only a daemon started with `insecure: true` accepts.
  tls::ChannelSecurity security = plaintext();

  static tls::ChannelSecurity plaintext() {
    tls::ChannelSecurity security;
    security.insecure = true;
    return security;
  }
};

// How long a stream (watch, logs) may run; nullopt: until it ends by itself (the job finishes,
// the task exits) or the callback stops it.
using StreamTimeout = std::optional<std::chrono::milliseconds>;

// Which part of a rank's output `Client::logs` reads (cohort logs --attempt / --tail / --since).
struct LogSelection {
  int attempt = 0;            // 0: the newest attempt on the rank's node
  int tail_lines = 0;         // only the last this many lines (then new ones when following); 0: all
  int64_t since_unix_ms = 0;  // only output from this time on (to about a second); 0: all
};

// Receives one event of a job; returns false to stop watching.
using JobEventCallback = std::function<bool(const cohort::v1::JobEvent& event)>;
// Receives a chunk of a rank's output; returns false to stop reading.
using LogCallback = std::function<bool(std::string_view bytes)>;
// Told when the agent no longer holds part of the output (its in-memory ring dropped it): how
// many bytes are missing before the next chunk, the log file that has them (may be empty) and
// the node it is on.
using LogGapCallback =
    std::function<void(int64_t skipped, const std::string& log_path, const std::string& node_id)>;

class Client {
 public:
  // Does not connect yet; the first RPC does.
  explicit Client(const std::string& address, ClientOptions options = {});

  // The coordinator's HOST:PORT, or the list of coordinators "h1:p1,h2:p2" as given.
  const std::string& address() const { return address_; }

  // The daemon's version and roles. Blocks up to the RPC timeout.
  StatusOr<cohort::v1::VersionInfo> server_version();

  // Submits a job; returns its id. INVALID_ARGUMENT naming the bad fields; RESOURCE_EXHAUSTED when
  // the cluster is too small for it, unless `wait_for_capacity` queues it until nodes join. Blocks
  // up to the RPC timeout.
  StatusOr<std::string> submit(const cohort::v1::JobSpec& spec, bool wait_for_capacity = false);

  // One job's record. NOT_FOUND for an unknown id. Blocks up to the RPC timeout.
  StatusOr<cohort::v1::JobRecord> get(const std::string& job_id);

  // The job's stored metrics reports with seq > after_seq, oldest first (attempt 0: every
  // attempt); kept across coordinator restarts. Blocks up to the RPC timeout.
  StatusOr<std::vector<cohort::v1::MetricsPoint>> metrics(const std::string& job_id, int64_t after_seq = 0,
                                                          int attempt = 0);

  // Job records in submission order, only those in `states` when it is non-empty. Follows every
  // page of ListJobs (one RPC per kMaxJobsPageSize jobs), so it may block for several RPC timeouts.
  // The caller's jobs; every user's with `all_users` (admins only).
  StatusOr<std::vector<cohort::v1::JobRecord>> list(const std::vector<cohort::v1::JobState>& states = {},
                                                    bool all_users = false);

  // Users and nodes (admins). add_user returns the new user's credentials file text; join_token a
  // token for `cohortd --join-token` (ttl 0: the coordinator's default). Each blocks up to the
  // RPC timeout.
  StatusOr<std::string> add_user(const std::string& name, bool admin);
  StatusOr<std::vector<cohort::v1::UserInfo>> list_users();
  Status revoke_user(const std::string& name);
  StatusOr<cohort::v1::CreateJoinTokenResponse> join_token(std::chrono::milliseconds ttl);
  Status revoke_node(const std::string& node_id);

  // Cancels a job (empty `reason`: the coordinator's default); returns its record after.
  // FAILED_PRECONDITION for a finished job.
  StatusOr<cohort::v1::JobRecord> cancel(const std::string& job_id, const std::string& reason = "");

  // Live nodes and their free capacity.
  StatusOr<std::vector<cohort::v1::NodeStatus>> nodes();

  // Calls `on_event` for each event of the job after `after_seq` (state changes and metrics),
  // oldest first, until the job reaches a final state (OK), `on_event` returns false (OK), the
  // timeout passes (DEADLINE_EXCEEDED) or the coordinator goes away (UNAVAILABLE). Blocks; the
  // callback runs on the calling thread.
  Status watch(const std::string& job_id, const JobEventCallback& on_event, int64_t after_seq = 0,
               StreamTimeout timeout = std::nullopt);

  // A rank's captured output (stdout and stderr interleaved), read from the agent of the node the
  // job's placement puts the rank on. With `follow`, keeps reading until the task exits, the
  // callback returns false or the timeout passes. FAILED_PRECONDITION while the job has no
  // placement (it is still queued); INVALID_ARGUMENT for a rank outside the job. `on_gap`
  // (optional) hears of output the agent already dropped, before the chunk after the gap. Blocks.
  // `selection` picks an attempt and a part of the output (the gap callback then hears only of
  // bytes missing inside that part).
  Status logs(const std::string& job_id, int rank, bool follow, const LogCallback& on_data,
              StreamTimeout timeout = std::nullopt, const LogGapCallback& on_gap = nullptr,
              const LogSelection& selection = {});

 private:
  // A unary call's context with the RPC deadline.
  void set_deadline(grpc::ClientContext* context) const;
  // Now + the RPC timeout.
  std::chrono::system_clock::time_point deadline() const;
  // `status` as a cohort Status naming the rpc and target, with what to do when unreachable.
  Status rpc_error(const grpc::Status& status, std::string_view rpc, const std::string& target) const;

  const std::string address_;
  const ClientOptions options_;
  // The coordinators (one, or a highly available list: calls follow the leader, issue 16).
  std::unique_ptr<tls::LeaderChannel> leader_;

  std::mutex mu_;
};

}  // namespace cohort::client
