#pragma once

// LeaderChannel: the client side of a highly available coordinator (issue 16). Two or three
// coordinators run and one leads; every client (the CLI, agents, worker ranks, schedulers) is given
// the whole list, "h1:p1,h2:p2", wherever it took one address before. A coordinator that is not the
// leader answers every cohort.v1.Coordinator / Rendezvous call with UNAVAILABLE, a message naming
// itself and the leader, and the trailing metadata `cohort-leader: HOST:PORT` (empty when it does
// not know one). LeaderChannel sends each call to the last known leader and, on UNAVAILABLE, moves
// to the hinted leader or else the next address and sends it again, until the call's deadline.
//
//   COHORT_ASSIGN_OR_RETURN(auto leader, LeaderChannel::create("10.0.0.1:7070,10.0.0.2:7070", security));
//   cohort::v1::SubmitJobResponse response;
//   grpc::Status status = leader->unary<cohort::v1::Coordinator>(
//       deadline, &cohort::v1::Coordinator::Stub::SubmitJob, request, &response);
//
// With one address it is nearly a plain channel: one try, one more when that coordinator names
// another leader, and one more when the call never reached it (the connection or its TLS handshake
// failed) and the channel's next connection attempt succeeds; a coordinator that is down fails
// with UNAVAILABLE after that one reconnect attempt (about gRPC's 1 s backoff).
//
// Retrying is for calls a standby refused or a coordinator that could not be reached (its answer
// never came): a call whose connection broke after the leader received it may have taken effect
// there, so a non-idempotent call (SubmitJob) can, rarely, run twice across a failover.
//
// A call that is safe to send twice (idempotent_unary, or call() with Idempotent::kYes: an agent's
// Heartbeat, RegisterNode, ReportTaskExit) also leaves a coordinator that received it but does not
// answer: with several addresses each try gets only its share of the deadline (deadline / number of
// addresses), and a try that runs out of it moves the channel to the next address. A leader that is
// stopped (SIGSTOP) or cut off keeps its connection READY, so without this every call would wait out
// its whole deadline there and never reach the standby that took over (an agent would fence its
// tasks for want of a heartbeat). A call that may not run twice waits out its deadline instead.
//
// Thread-safe: calls may run concurrently from any thread; the leader seen last is shared.

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "worker/base/status.h"
#include "worker/base/tls.h"

namespace cohort::tls {

// Trailing metadata of a standby coordinator's UNAVAILABLE answers: the leader's HOST:PORT, or
// empty while no leader is known.
inline constexpr const char* kLeaderMetadata = "cohort-leader";
// How long one try waits for a connection to a coordinator before the next address is tried
// (only with several addresses: a host that is down or cut off must not use up the deadline).
inline constexpr std::chrono::milliseconds kLeaderConnectTimeout{2000};
// Pause after every address refused or failed in turn (an election is under way), doubling up to
// the maximum, so a client does not spin while no coordinator leads.
inline constexpr std::chrono::milliseconds kLeaderRoundBackoff{200};
inline constexpr std::chrono::milliseconds kMaxLeaderRoundBackoff{1000};
// Reconnect backoff of the channels to coordinators: gRPC's default grows to 120 s, so a
// coordinator that came back (the old leader, restarted) would stay skipped for minutes.
inline constexpr std::chrono::milliseconds kLeaderMaxReconnectBackoff{2000};

// Splits "h1:p1,h2:p2" (spaces around entries allowed) into addresses. INVALID_ARGUMENT for an
// empty list, an empty entry or an entry that is not HOST:PORT, naming it.
StatusOr<std::vector<std::string>> parse_address_list(const std::string& list);

// Whether a call may be sent to another coordinator after one received it and did not answer in
// time (it may have acted on it).
enum class Idempotent { kNo, kYes };

class LeaderChannel {
 public:
  // One try: `context` has the call's deadline (add metadata to it as needed); `channel` leads to
  // the coordinator tried. Returns the call's status.
  using Attempt = std::function<grpc::Status(grpc::ClientContext& context, const std::shared_ptr<grpc::Channel>& channel)>;

  // A LeaderChannel over `address_list` (parse_address_list). Does not connect yet.
  static StatusOr<std::unique_ptr<LeaderChannel>> create(const std::string& address_list,
                                                         const ChannelSecurity& security);
  LeaderChannel(std::vector<std::string> addresses, ChannelSecurity security);

  // Runs `attempt` against the last known leader, then, while it answers UNAVAILABLE, against the
  // leader the answer names or else the next address, pausing after each full round, until it
  // answers anything else or `deadline` passes (the last UNAVAILABLE, or DEADLINE_EXCEEDED, is
  // returned). With one address: at most that try and one to a leader it names. With several and
  // Idempotent::kYes, a try also ends at its share of the deadline, and one that ran out of it
  // counts as UNAVAILABLE (the next address is tried). Blocks.
  grpc::Status call(std::chrono::system_clock::time_point deadline, const Attempt& attempt,
                    Idempotent idempotent = Idempotent::kNo);

  // One unary method of `Service` (e.g. cohort::v1::Coordinator) through call(). `prepare` may add
  // metadata to each try's context.
  template <typename Service, typename Request, typename Response>
  grpc::Status unary(std::chrono::system_clock::time_point deadline,
                     grpc::Status (Service::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                     const Request& request, Response* response,
                     const std::function<void(grpc::ClientContext&)>& prepare = nullptr) {
    return unary_call<Service>(deadline, method, request, response, prepare, Idempotent::kNo);
  }
  // unary() for a call that is safe to send twice (Idempotent::kYes): a coordinator that does not
  // answer within the try's share of the deadline is left for the next address.
  template <typename Service, typename Request, typename Response>
  grpc::Status idempotent_unary(
      std::chrono::system_clock::time_point deadline,
      grpc::Status (Service::Stub::*method)(grpc::ClientContext*, const Request&, Response*), const Request& request,
      Response* response, const std::function<void(grpc::ClientContext&)>& prepare = nullptr) {
    return unary_call<Service>(deadline, method, request, response, prepare, Idempotent::kYes);
  }

  // The channel of the last known leader, for streams (WatchJob, StreamLogs) that cannot simply be
  // sent again: run the stream on it and pass its end to note_result, so the caller's next try
  // goes to the right coordinator.
  std::shared_ptr<grpc::Channel> leader_channel();
  // The last known leader's address (the first address until some call learned otherwise).
  std::string leader_address() const;
  // Every address, as given (plus leaders learned from hints that were not in the list).
  std::vector<std::string> addresses() const;
  // All addresses joined with commas (for messages).
  std::string address_list() const;
  // Calls from now on present `security` (e.g. a renewed node certificate): every channel is made
  // again on its next use, the known leader is kept. Calls under way finish on the channel they
  // hold. Thread-safe: the object stays, so callers on other threads need no coordination.
  void set_credentials(ChannelSecurity security);
  // Learns from a finished call to `address`: on UNAVAILABLE, the leader moves to the hinted
  // one, or else to the next address. Other results leave it.
  void note_result(const std::string& address, const grpc::ClientContext& context, const grpc::Status& status);

 private:
  template <typename Service, typename Request, typename Response>
  grpc::Status unary_call(std::chrono::system_clock::time_point deadline,
                          grpc::Status (Service::Stub::*method)(grpc::ClientContext*, const Request&, Response*),
                          const Request& request, Response* response,
                          const std::function<void(grpc::ClientContext&)>& prepare, Idempotent idempotent) {
    return call(
        deadline,
        [&](grpc::ClientContext& context, const std::shared_ptr<grpc::Channel>& channel) {
          if (prepare) prepare(context);
          typename Service::Stub stub(channel);
          return (stub.*method)(&context, request, response);
        },
        idempotent);
  }

  struct Endpoint {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;  // made on first use (again after set_credentials)
  };
  // The index of `address`, adding it when it is new (a hinted leader outside the list).
  size_t index_of_locked(const std::string& address);
  std::shared_ptr<grpc::Channel> channel_locked(size_t index);

  mutable std::mutex mu_;
  ChannelSecurity security_;         // guarded by mu_
  std::vector<Endpoint> endpoints_;  // guarded by mu_; only grows
  size_t leader_ = 0;                // guarded by mu_; index of the last known leader
  const size_t configured_;          // how many addresses were given
};

// The leader's address named in a finished call's trailing metadata (kLeaderMetadata); empty when
// there is none.
std::string leader_hint(const grpc::ClientContext& context);

}  // namespace cohort::tls
