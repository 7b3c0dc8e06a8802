#include "worker/base/leader_channel.h"

#include <algorithm>
#include <thread>
#include <utility>

#include <fmt/format.h>

namespace cohort::tls {
namespace {

std::string trim(const std::string& text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string::npos) return "";
  const size_t end = text.find_last_not_of(" \t");
  return text.substr(begin, end - begin + 1);
}

bool is_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  const std::string port = address.substr(colon + 1);
  return port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
}

// Waits until `channel` is connected, it failed to connect, or `until`. A refused connection shows
// as TRANSIENT_FAILURE at once, so a dead coordinator costs nothing; a host that does not answer
// costs up to `until`.
bool connected(grpc::Channel& channel, std::chrono::system_clock::time_point until) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE || state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (!channel.WaitForStateChange(state, until)) return false;
    state = channel.GetState(/*try_to_connect=*/true);
  }
  return true;
}

// After a call failed without reaching a server (the channel in TRANSIENT_FAILURE: the connection
// or its TLS handshake failed), waits for the channel's next connection attempt, which gRPC makes
// after its reconnect backoff: true once it is READY, false when that attempt fails too or `until`
// passes.
bool reconnected(grpc::Channel& channel, std::chrono::system_clock::time_point until) {
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/true);
  bool left_failure = state != GRPC_CHANNEL_TRANSIENT_FAILURE;
  while (state != GRPC_CHANNEL_READY) {
    if (state == GRPC_CHANNEL_SHUTDOWN) return false;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && left_failure) return false;  // the next attempt failed too
    if (!channel.WaitForStateChange(state, until)) return false;
    state = channel.GetState(/*try_to_connect=*/true);
    if (state != GRPC_CHANNEL_TRANSIENT_FAILURE) left_failure = true;
  }
  return true;
}

}  // namespace

StatusOr<std::vector<std::string>> parse_address_list(const std::string& list) {
  std::vector<std::string> addresses;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    const std::string entry = trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (entry.empty()) {
      return invalid_argument_error(
          "coordinator address list {:?} has an empty entry; give HOST:PORT[,HOST:PORT...], e.g. "
          "10.0.0.1:7070,10.0.0.2:7070",
          list);
    }
    if (!is_host_port(entry)) {
      return invalid_argument_error("coordinator address {:?} in {:?} is not HOST:PORT (e.g. 10.0.0.1:7070)", entry,
                                    list);
    }
    if (std::find(addresses.begin(), addresses.end(), entry) == addresses.end()) addresses.push_back(entry);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return addresses;
}

std::string leader_hint(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(kLeaderMetadata);
  if (it == trailers.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

StatusOr<std::unique_ptr<LeaderChannel>> LeaderChannel::create(const std::string& address_list,
                                                               const ChannelSecurity& security) {
  COHORT_ASSIGN_OR_RETURN(std::vector<std::string> addresses, parse_address_list(address_list));
  return std::make_unique<LeaderChannel>(std::move(addresses), security);
}

LeaderChannel::LeaderChannel(std::vector<std::string> addresses, ChannelSecurity security)
    : security_(std::move(security)), configured_(addresses.size()) {
  for (std::string& address : addresses) endpoints_.push_back({std::move(address), nullptr});
}

size_t LeaderChannel::index_of_locked(const std::string& address) {
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    if (endpoints_[i].address == address) return i;
  }
  endpoints_.push_back({address, nullptr});
  return endpoints_.size() - 1;
}

std::shared_ptr<grpc::Channel> LeaderChannel::channel_locked(size_t index) {
  Endpoint& endpoint = endpoints_[index];
  if (endpoint.channel == nullptr) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, static_cast<int>(kLeaderMaxReconnectBackoff.count()));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(kLeaderRoundBackoff.count()));
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, static_cast<int>(kLeaderRoundBackoff.count()));
    endpoint.channel = make_channel(endpoint.address, security_, args);
  }
  return endpoint.channel;
}

void LeaderChannel::set_credentials(ChannelSecurity security) {
  std::lock_guard<std::mutex> lock(mu_);
  security_ = std::move(security);
  // A call under way holds its own reference to the channel it uses.
  for (Endpoint& endpoint : endpoints_) endpoint.channel = nullptr;
}

std::shared_ptr<grpc::Channel> LeaderChannel::leader_channel() {
  std::lock_guard<std::mutex> lock(mu_);
  return channel_locked(leader_);
}

std::string LeaderChannel::leader_address() const {
  std::lock_guard<std::mutex> lock(mu_);
  return endpoints_[leader_].address;
}

std::vector<std::string> LeaderChannel::addresses() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> all;
  for (const Endpoint& endpoint : endpoints_) all.push_back(endpoint.address);
  return all;
}

std::string LeaderChannel::address_list() const { return fmt::format("{}", fmt::join(addresses(), ",")); }

void LeaderChannel::note_result(const std::string& address, const grpc::ClientContext& context,
                                const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::UNAVAILABLE) return;
  const std::string hint = leader_hint(context);
  std::lock_guard<std::mutex> lock(mu_);
  const size_t tried = index_of_locked(address);
  if (endpoints_[leader_].address != address) return;  // another call moved on already
  if (!hint.empty() && hint != address) {
    leader_ = index_of_locked(hint);
  } else {
    leader_ = (tried + 1) % endpoints_.size();
  }
}

grpc::Status LeaderChannel::call(std::chrono::system_clock::time_point deadline, const Attempt& attempt,
                                 Idempotent idempotent) {
  const bool several = configured_ > 1;
  // A call that may be sent twice gives each try its share of the deadline, so a coordinator that
  // holds it without answering (stopped, cut off: its connection stays READY) leaves time for the
  // others; a try that ran out of its share counts as refused. Fixed at the start, so each of the
  // configured addresses gets the same.
  const bool capped = several && idempotent == Idempotent::kYes;
  const std::chrono::system_clock::duration try_budget =
      capped ? (deadline - std::chrono::system_clock::now()) / static_cast<int>(configured_)
             : std::chrono::system_clock::duration::zero();
  std::chrono::milliseconds backoff = kLeaderRoundBackoff;
  size_t failed_in_a_row = 0;  // tries since the last pause
  bool followed_hint = false;  // one address: the one extra try a named leader gets
  bool reconnect_tried = false;  // one address: the one extra try after a failed connection
  grpc::Status last(grpc::StatusCode::UNAVAILABLE, "no coordinator was tried");
  while (true) {
    std::string address;
    std::shared_ptr<grpc::Channel> channel;
    size_t known = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      address = endpoints_[leader_].address;
      channel = channel_locked(leader_);
      known = endpoints_.size();
    }
    if (several && !connected(*channel, std::min(deadline, std::chrono::system_clock::now() + kLeaderConnectTimeout))) {
      last = grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          fmt::format("cannot connect to the coordinator at {} (tried {})", address, address_list()));
      std::lock_guard<std::mutex> lock(mu_);
      if (endpoints_[leader_].address == address) leader_ = (leader_ + 1) % endpoints_.size();
    } else {
      grpc::ClientContext context;
      const std::chrono::system_clock::time_point try_deadline =
          capped ? std::min(deadline, std::chrono::system_clock::now() + try_budget) : deadline;
      context.set_deadline(try_deadline);
      last = attempt(context, channel);
      if (capped && last.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
          std::chrono::system_clock::now() < deadline) {
        // This coordinator held the call for its whole share: hung or cut off. The next address.
        last = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            fmt::format("the coordinator at {} did not answer within {} ms (tried {}): {}", address,
                                        std::chrono::duration_cast<std::chrono::milliseconds>(try_budget).count(),
                                        address_list(), last.error_message()));
        std::lock_guard<std::mutex> lock(mu_);
        if (endpoints_[leader_].address == address) leader_ = (leader_ + 1) % endpoints_.size();
      } else {
        if (last.error_code() != grpc::StatusCode::UNAVAILABLE) return last;
        const std::string hint = leader_hint(context);
        note_result(address, context, last);
        if (!several) {
          // One address: follow a named leader once. A call that never reached the coordinator (its
          // connection or TLS handshake failed: seen once under load, "Handshake write failed") gets
          // one more try if the channel's next connection attempt, within kLeaderConnectTimeout,
          // succeeds; a coordinator that is down still fails within about gRPC's 1 s reconnect
          // backoff. Else answer as a plain channel would.
          if (!hint.empty() && hint != address && !followed_hint) {
            followed_hint = true;
            continue;
          }
          if (!reconnect_tried && hint.empty() && channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
            reconnect_tried = true;
            if (reconnected(*channel, std::min(deadline, std::chrono::system_clock::now() + kLeaderConnectTimeout))) {
              continue;
            }
          }
          return last;
        }
      }
    }
    if (std::chrono::system_clock::now() >= deadline) return last;
    if (++failed_in_a_row >= known) {
      // Every address refused or failed: no leader right now (an election is under way).
      failed_in_a_row = 0;
      const auto pause = std::min<std::chrono::system_clock::duration>(
          backoff, deadline - std::chrono::system_clock::now());
      if (pause.count() > 0) std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, kMaxLeaderRoundBackoff);
      if (std::chrono::system_clock::now() >= deadline) return last;
    }
  }
}

}  // namespace cohort::tls
