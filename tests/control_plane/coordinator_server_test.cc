// cohortd's coordinator role end to end over gRPC on 127.0.0.1:0: nodes register, a job is
// submitted and placed, two workers (threads) bootstrap through cohort:// URLs and exchange keys
// in the coordinator-kept store; job inspection and cancelling; edge validation; a restarted
// coordinator keeps its jobs.

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "cohort/v1/agent.grpc.pb.h"
#include "cohort/v1/coordinator.grpc.pb.h"
#include "cohort/v1/rendezvous.grpc.pb.h"
#include "daemon/coordinator/temp_dir.h"
#include "daemon/coordinator/test_specs.h"
#include "daemon/server/daemon_server.h"
#include "daemon/server/testing/test_credentials.h"
#include "worker/base/tls.h"
#include "worker/comm/init/cohort/cohort_init_method.h"
#include "worker/comm/init/init_options.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using coordinator::testing::valid_spec;

// Every RPC of these tests finishes well within this; a hang becomes a failure, not a stuck test.
constexpr auto kRpcTimeout = std::chrono::seconds(10);
// Ticks are fast so placement-by-tick is quick to observe.
constexpr auto kTestTickInterval = std::chrono::milliseconds(50);

void set_deadline(grpc::ClientContext* context, std::chrono::milliseconds timeout = kRpcTimeout) {
  context->set_deadline(std::chrono::system_clock::now() + timeout);
}

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override { start_server(); }
  // Tests whose nodes have an agent behind them (a fake one) let the daemon send its orders.
  bool send_orders_ = false;
  void TearDown() override {
    if (server_ != nullptr) server_->shutdown();
  }

  void start_server() {
    DaemonServerOptions options;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir_.path();
    options.tick_interval = kTestTickInterval;
    // The nodes these tests register have no agent behind them: drop the launch orders, so a placed
    // attempt stays PLACED for the test's workers instead of failing its launch.
    if (!send_orders_) options.orders = [](coordinator::AgentOrders) {};
    auto server = DaemonServer::start(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    ASSERT_GT(server_->port(), 0);
    // A user (the first admin, from the data dir) submits and inspects; each registered node and
    // each attempt's ranks use their own credentials (node_stub, rendezvous_for).
    coordinator_ = cohort::v1::Coordinator::NewStub(
        tls::make_channel(server_->address(), testing::admin_security(data_dir_.path())));
    node_stubs_.clear();
  }

  // The Coordinator as node `id`'s agent calls it (its certificate from the cluster CA).
  cohort::v1::Coordinator::Stub& node_stub(const std::string& id) {
    std::unique_ptr<cohort::v1::Coordinator::Stub>& stub = node_stubs_[id];
    if (stub == nullptr) {
      stub = cohort::v1::Coordinator::NewStub(
          tls::make_channel(server_->address(), testing::node_security(*server_, id)));
    }
    return *stub;
  }

  // Rendezvous as a rank of `job_id` attempt `attempt` calls it (the attempt's secret).
  std::unique_ptr<cohort::v1::Rendezvous::Stub> rendezvous_for(const std::string& job_id, int attempt) {
    return cohort::v1::Rendezvous::NewStub(
        tls::make_channel(server_->address(), testing::job_security(*server_, job_id, attempt)));
  }

  void restart_server() {
    server_->shutdown();
    server_.reset();
    start_server();
  }

  void register_node(const std::string& id, int slots, int agent_port) {
    cohort::v1::RegisterNodeRequest request;
    request.mutable_node()->set_node_id(id);
    request.mutable_node()->set_address("127.0.0.1:" + std::to_string(agent_port));
    request.mutable_node()->set_hostname(id);
    request.mutable_node()->set_slots(slots);
    cohort::v1::RegisterNodeResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = node_stub(id).RegisterNode(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_GT(response.lease_ms(), 0);
    EXPECT_GT(response.heartbeat_interval_ms(), 0);
    EXPECT_LT(response.heartbeat_interval_ms(), response.lease_ms());
  }

  // These tests drive queueing and placement, often with nodes that register later (or never), so
  // they queue past the capacity check by default; CapacityIsCheckedAtSubmit covers the refusal.
  grpc::Status submit(const cohort::v1::JobSpec& spec, std::string* job_id, bool wait_for_capacity = true) {
    cohort::v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    request.set_wait_for_capacity(wait_for_capacity);
    cohort::v1::SubmitJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = coordinator_->SubmitJob(&context, request, &response);
    *job_id = response.job_id();
    return status;
  }

  grpc::Status get_job(const std::string& job_id, cohort::v1::JobRecord* job) {
    cohort::v1::GetJobRequest request;
    request.set_job_id(job_id);
    cohort::v1::GetJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    grpc::Status status = coordinator_->GetJob(&context, request, &response);
    *job = response.job();
    return status;
  }

  // Polls GetJob until the job is in `state` or kRpcTimeout passes.
  cohort::v1::JobRecord wait_for_state(const std::string& job_id, cohort::v1::JobState state) {
    const auto give_up = std::chrono::steady_clock::now() + kRpcTimeout;
    cohort::v1::JobRecord job;
    while (std::chrono::steady_clock::now() < give_up) {
      grpc::Status status = get_job(job_id, &job);
      EXPECT_TRUE(status.ok()) << status.error_message();
      if (!status.ok() || job.state() == state) return job;
      std::this_thread::sleep_for(kTestTickInterval);
    }
    ADD_FAILURE() << "job " << job_id << " stayed " << cohort::v1::JobState_Name(job.state()) << " ("
                  << job.waiting_for() << "), expected " << cohort::v1::JobState_Name(state);
    return job;
  }

  TempDir data_dir_;
  std::unique_ptr<DaemonServer> server_;
  std::unique_ptr<cohort::v1::Coordinator::Stub> coordinator_;
  std::map<std::string, std::unique_ptr<cohort::v1::Coordinator::Stub>> node_stubs_;
};

TEST_F(CoordinatorServerTest, TwoWorkersBootstrapThroughCohortUrlsAndExchangeKeys) {
  register_node("node-a", 1, 7071);
  register_node("node-b", 1, 7072);
  {
    cohort::v1::ListNodesResponse nodes;
    grpc::ClientContext context;
    set_deadline(&context);
    ASSERT_TRUE(coordinator_->ListNodes(&context, cohort::v1::ListNodesRequest(), &nodes).ok());
    ASSERT_EQ(nodes.nodes_size(), 2);
    EXPECT_EQ(nodes.nodes(0).node().node_id(), "node-a");
    EXPECT_EQ(nodes.nodes(0).node().free_slots(), 1);
    EXPECT_GT(nodes.nodes(0).lease_remaining_ms(), 0);
  }

  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("mlp", /*nodes=*/2, /*procs_per_node=*/1), &job_id).ok());
  cohort::v1::JobRecord placed = wait_for_state(job_id, cohort::v1::PLACED);
  ASSERT_EQ(placed.state(), cohort::v1::PLACED);
  EXPECT_EQ(placed.attempt(), 1);
  EXPECT_EQ(placed.placement().world_size(), 2);

  // The agent would start these workers with the URL, COHORT_NODE_ID, the cluster CA and the
  // attempt's secret; threads stand in for them.
  ::setenv(tls::kCaCertificateEnv, server_->security().ca_pem().c_str(), 1);
  ::setenv(tls::kJobSecretEnv, server_->security().attempt_secret(job_id, 1).c_str(), 1);
  ASSERT_TRUE(comm::register_cohort_init_method().ok());
  ASSERT_TRUE(comm::register_cohort_init_method().ok()) << "registering twice is harmless";
  const std::string url = "cohort://" + server_->address() + "/" + job_id + "?attempt=1&local_rank=0";
  const std::vector<std::string> node_ids = {"node-a", "node-b"};
  std::vector<StatusOr<comm::Bootstrap>> boots(2, Status(StatusCode::kUnknown, "not run"));
  std::vector<StatusOr<std::string>> peer_values(2, Status(StatusCode::kUnknown, "not run"));
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      comm::InitOptions options = comm::InitOptions::from_url(url);
      options.node_id = node_ids[w];
      options.timeout = kRpcTimeout;
      boots[w] = comm::resolve_init(options);
      if (!boots[w].ok()) return;
      const comm::Bootstrap& boot = *boots[w];
      Status set = boot.store->set("addr/" + std::to_string(boot.rank), "worker on " + node_ids[w]);
      if (!set.ok()) {
        peer_values[w] = set;
        return;
      }
      peer_values[w] = boot.store->get("addr/" + std::to_string(1 - boot.rank), kRpcTimeout);
    });
  }
  for (std::thread& worker : workers) worker.join();

  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(boots[w].ok()) << boots[w].status().to_string();
    EXPECT_EQ(boots[w]->world_size, 2);
    EXPECT_EQ(boots[w]->local_rank, 0);
    EXPECT_EQ(boots[w]->local_world_size, 1);
    EXPECT_EQ(boots[w]->node_id, node_ids[w]);
    EXPECT_EQ(boots[w]->master_address, "127.0.0.1");
    ASSERT_TRUE(peer_values[w].ok()) << peer_values[w].status().to_string();
  }
  // Placement is node-major in registry order: node-a holds rank 0.
  EXPECT_EQ(boots[0]->rank, 0);
  EXPECT_EQ(boots[1]->rank, 1);
  EXPECT_EQ(*peer_values[0], "worker on node-b");
  EXPECT_EQ(*peer_values[1], "worker on node-a");

  // The rest of the Store contract over RPC, through one worker's store.
  comm::Store& store = *boots[0]->store;
  EXPECT_EQ(store.add("counter", 2).value_or(-1), 2);
  EXPECT_EQ(store.add("counter", 3).value_or(-1), 5);
  EXPECT_EQ(store.compare_set("cas", "", "first").value_or("?"), "first");
  EXPECT_EQ(store.compare_set("cas", "wrong", "second").value_or("?"), "first");
  EXPECT_TRUE(store.check({"addr/0", "addr/1"}).value_or(false));
  EXPECT_FALSE(store.check({"addr/0", "nobody"}).value_or(true));
  EXPECT_EQ(store.num_keys().value_or(-1), 4);
  EXPECT_TRUE(store.delete_key("cas").value_or(false));
  EXPECT_FALSE(store.delete_key("cas").value_or(true));
  Status timed_out = store.wait({"never-set"}, std::chrono::milliseconds(200));
  EXPECT_EQ(timed_out.code(), StatusCode::kDeadlineExceeded) << timed_out.to_string();
  EXPECT_NE(timed_out.message().find("never-set"), std::string::npos) << timed_out.message();

  // Barrier over RPC with its generation: both ranks open barrier 0; rank 0's call sent again (its
  // answer lost) is answered at once instead of waiting in barrier 1; a generation beyond the
  // barriers opened is refused.
  auto barrier = [&](int rank, std::optional<int64_t> generation, int64_t timeout_ms) {
    cohort::v1::BarrierRequest request;
    request.mutable_attempt()->set_job_id(job_id);
    request.mutable_attempt()->set_attempt(1);
    request.set_rank(rank);
    request.set_timeout_ms(timeout_ms);
    if (generation.has_value()) request.set_generation(*generation);
    cohort::v1::BarrierResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    return rendezvous_for(job_id, 1)->Barrier(&context, request, &response);
  };
  const int64_t rpc_timeout_ms = std::chrono::duration_cast<std::chrono::milliseconds>(kRpcTimeout).count();
  {
    std::thread other([&] {
      grpc::Status opened = barrier(1, 0, rpc_timeout_ms);
      EXPECT_TRUE(opened.ok()) << opened.error_message();
    });
    grpc::Status opened = barrier(0, 0, rpc_timeout_ms);
    EXPECT_TRUE(opened.ok()) << opened.error_message();
    other.join();
  }
  grpc::Status again = barrier(0, 0, 200);
  EXPECT_TRUE(again.ok()) << "a barrier sent again after it opened: " << again.error_message();
  EXPECT_EQ(barrier(0, 5, 200).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(barrier(0, std::nullopt, 200).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "without a generation, the call counts in barrier 1 (rank 1 never comes)";

  // A watcher sees the cancellation and its stream ends on the final state.
  grpc::ClientContext watch_context;
  set_deadline(&watch_context);
  cohort::v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  auto reader = coordinator_->WatchJob(&watch_context, watch);
  cohort::v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  cohort::v1::CancelJobResponse cancelled;
  {
    grpc::ClientContext context;
    set_deadline(&context);
    ASSERT_TRUE(coordinator_->CancelJob(&context, cancel, &cancelled).ok());
  }
  EXPECT_EQ(cancelled.job().state(), cohort::v1::CANCELLED);
  std::vector<cohort::v1::JobState> seen;
  cohort::v1::JobEvent event;
  while (reader->Read(&event)) {
    if (event.has_state_change()) seen.push_back(event.state_change().to());
  }
  grpc::Status watch_status = reader->Finish();
  EXPECT_TRUE(watch_status.ok()) << watch_status.error_message();
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.front(), cohort::v1::PENDING);
  EXPECT_EQ(seen.back(), cohort::v1::CANCELLED);

  // The cancelled attempt's store is closed: no worker waits on it any more.
  EXPECT_FALSE(store.get("addr/0", std::chrono::milliseconds(200)).ok());
}

TEST_F(CoordinatorServerTest, GetListAndCancelJobsRoundTrip) {
  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("queued", 1, 1), &job_id).ok());  // no nodes: stays PENDING
  cohort::v1::JobRecord job;
  ASSERT_TRUE(get_job(job_id, &job).ok());
  EXPECT_EQ(job.id(), job_id);
  EXPECT_EQ(job.spec().name(), "queued");
  EXPECT_EQ(job.state(), cohort::v1::PENDING);
  EXPECT_TRUE(job.has_submit_time());
  EXPECT_FALSE(job.waiting_for().empty());

  auto list = [&](std::vector<cohort::v1::JobState> states) {
    cohort::v1::ListJobsRequest request;
    for (cohort::v1::JobState state : states) request.add_states(state);
    cohort::v1::ListJobsResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_TRUE(coordinator_->ListJobs(&context, request, &response).ok());
    return response;
  };
  EXPECT_EQ(list({}).jobs_size(), 1);
  EXPECT_EQ(list({cohort::v1::PENDING}).jobs_size(), 1);
  EXPECT_EQ(list({cohort::v1::SUCCEEDED, cohort::v1::FAILED}).jobs_size(), 0);

  cohort::v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  cancel.set_reason("no longer needed");
  {
    cohort::v1::CancelJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    ASSERT_TRUE(coordinator_->CancelJob(&context, cancel, &response).ok());
    EXPECT_EQ(response.job().state(), cohort::v1::CANCELLED);
    EXPECT_NE(response.job().reason().find("no longer needed"), std::string::npos) << response.job().reason();
  }
  {
    cohort::v1::CancelJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_EQ(coordinator_->CancelJob(&context, cancel, &response).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  EXPECT_EQ(list({cohort::v1::CANCELLED}).jobs_size(), 1);

  // Watching a job that is already over replays its events and ends the stream.
  grpc::ClientContext watch_context;
  set_deadline(&watch_context);
  cohort::v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  auto reader = coordinator_->WatchJob(&watch_context, watch);
  cohort::v1::JobEvent event;
  int64_t last_seq = 0;
  cohort::v1::JobState last_state = cohort::v1::JOB_STATE_UNSPECIFIED;
  while (reader->Read(&event)) {
    EXPECT_GT(event.seq(), last_seq);
    last_seq = event.seq();
    if (event.has_state_change()) last_state = event.state_change().to();
  }
  EXPECT_TRUE(reader->Finish().ok());
  EXPECT_EQ(last_state, cohort::v1::CANCELLED);

  EXPECT_EQ(get_job("no-such-job-7", &job).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(get_job("", &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServerTest, InvalidSpecIsRejectedNamingTheField) {
  cohort::v1::JobSpec spec = valid_spec();
  spec.set_batch_size(0);
  std::string job_id;
  grpc::Status status = submit(spec, &job_id);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("batch_size"), std::string::npos) << status.error_message();
  cohort::v1::ListJobsResponse jobs;
  grpc::ClientContext context;
  set_deadline(&context);
  ASSERT_TRUE(coordinator_->ListJobs(&context, cohort::v1::ListJobsRequest(), &jobs).ok());
  EXPECT_EQ(jobs.jobs_size(), 0) << "a rejected job is not recorded";
}

// A job larger than the cluster is refused naming both numbers, unless it asks to wait; a model
// that cannot fit any rank (a 2-billion-unit linear layer) is refused either way.
TEST_F(CoordinatorServerTest, CapacityIsCheckedAtSubmit) {
  std::string job_id;
  grpc::Status none = submit(valid_spec("early", 1, 1), &job_id, /*wait_for_capacity=*/false);
  EXPECT_EQ(none.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(none.error_message().find("the cluster has 0 live node(s)"), std::string::npos)
      << none.error_message();
  register_node("node-a", 2, 7071);
  EXPECT_TRUE(submit(valid_spec("fits", 1, 2), &job_id, false).ok());
  grpc::Status wide = submit(valid_spec("wide", 1, 3), &job_id, false);
  EXPECT_EQ(wide.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(wide.error_message().find("needs 1 node(s) with 3 slot(s) each"), std::string::npos)
      << wide.error_message();
  EXPECT_TRUE(submit(valid_spec("wide", 1, 3), &job_id, /*wait_for_capacity=*/true).ok());

  cohort::v1::JobSpec huge = valid_spec("huge", 1, 1);
  cohort::v1::Layer* layer = huge.mutable_data_parallel()->mutable_graph()->mutable_layers(0);
  layer->set_out_features(2'000'000'000);
  huge.mutable_dataset()->set_num_classes(2'000'000'000);
  grpc::Status refused = submit(huge, &job_id, /*wait_for_capacity=*/true);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("kMaxEstimatedBytesPerRank"), std::string::npos)
      << refused.error_message();
}

// ListJobs pages: page_size, page_token and next_page_token walk every job once, in order.
TEST_F(CoordinatorServerTest, ListJobsPages) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    std::string job_id;
    ASSERT_TRUE(submit(valid_spec("job" + std::to_string(i), 1, 1), &job_id).ok());
    ids.push_back(job_id);
  }
  cohort::v1::ListJobsRequest request;
  request.set_page_size(2);
  std::vector<std::string> seen;
  int pages = 0;
  do {
    cohort::v1::ListJobsResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    ASSERT_TRUE(coordinator_->ListJobs(&context, request, &response).ok());
    EXPECT_LE(response.jobs_size(), 2);
    for (const cohort::v1::JobRecord& job : response.jobs()) seen.push_back(job.id());
    request.set_page_token(response.next_page_token());
    ASSERT_LT(++pages, 10) << "the pages never end";
  } while (!request.page_token().empty());
  EXPECT_EQ(seen, ids);
  EXPECT_EQ(pages, 3);

  request.set_page_token("not-a-token");
  cohort::v1::ListJobsResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  grpc::Status bad = coordinator_->ListJobs(&context, request, &response);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(bad.error_message().find("page_token 'not-a-token'"), std::string::npos) << bad.error_message();
}

TEST_F(CoordinatorServerTest, RendezvousCallsAreValidatedAndBoundedByTheirTimeout) {
  std::unique_ptr<cohort::v1::Rendezvous::Stub> rendezvous_ = rendezvous_for("no-such-job-1", 1);
  cohort::v1::JoinRequest join;
  join.mutable_attempt()->set_job_id("no-such-job-1");
  join.mutable_attempt()->set_attempt(1);
  join.set_node_id("node-a");
  cohort::v1::JoinResponse joined;
  {
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_EQ(rendezvous_->Join(&context, join, &joined).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  join.mutable_attempt()->set_attempt(0);
  {
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_EQ(rendezvous_->Join(&context, join, &joined).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }

  // A 2-rank job where only one rank shows up: Join ends at its timeout naming the missing rank.
  register_node("node-a", 1, 7071);
  register_node("node-b", 1, 7072);
  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("lonely", 2, 1), &job_id).ok());
  ASSERT_EQ(wait_for_state(job_id, cohort::v1::PLACED).state(), cohort::v1::PLACED);
  join.mutable_attempt()->set_job_id(job_id);
  join.mutable_attempt()->set_attempt(1);
  join.set_timeout_ms(300);
  {
    // Another attempt's secret (or another job's) is refused before anything is read.
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_EQ(rendezvous_->Join(&context, join, &joined).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  rendezvous_ = rendezvous_for(job_id, 1);
  grpc::ClientContext context;
  set_deadline(&context);
  const auto started = std::chrono::steady_clock::now();
  grpc::Status status = rendezvous_->Join(&context, join, &joined);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << status.error_message();
  EXPECT_NE(status.error_message().find("node-b"), std::string::npos) << status.error_message();
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));

  // timeout_ms 0 (the server's 5-minute default) is still capped by the client's deadline.
  join.set_timeout_ms(0);
  grpc::ClientContext short_context;
  set_deadline(&short_context, std::chrono::milliseconds(300));
  const auto capped_start = std::chrono::steady_clock::now();
  EXPECT_EQ(rendezvous_->Join(&short_context, join, &joined).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_LT(std::chrono::steady_clock::now() - capped_start, std::chrono::seconds(5));
}

TEST_F(CoordinatorServerTest, RestartedCoordinatorKeepsItsJobs) {
  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("durable", 1, 1), &job_id).ok());
  restart_server();
  cohort::v1::JobRecord job;
  grpc::Status status = get_job(job_id, &job);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(job.spec().name(), "durable");
  EXPECT_EQ(job.state(), cohort::v1::PENDING);
  // The new coordinator still places it once a node appears.
  register_node("node-a", 1, 7071);
  EXPECT_EQ(wait_for_state(job_id, cohort::v1::PLACED).state(), cohort::v1::PLACED);
}

TEST_F(CoordinatorServerTest, ShutdownEndsAWatchPromptly) {
  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("waiting", 1, 1), &job_id).ok());  // no nodes: never finishes
  grpc::ClientContext watch_context;
  set_deadline(&watch_context);
  cohort::v1::WatchJobRequest watch;
  watch.set_job_id(job_id);
  auto reader = coordinator_->WatchJob(&watch_context, watch);
  cohort::v1::JobEvent event;
  ASSERT_TRUE(reader->Read(&event)) << "the submission event";
  const auto started = std::chrono::steady_clock::now();
  server_->shutdown();
  while (reader->Read(&event)) {
  }
  grpc::Status status = reader->Finish();
  EXPECT_FALSE(status.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - started, kDefaultShutdownGrace)
      << "the coordinator's shutdown wakes watchers instead of waiting out the grace period";
}

// An agent of node `node_id` that takes every launch and refuses the first `refused_stops` stops
// with `refusal` (UNAVAILABLE: what a TLS handshake failing under load or a missed deadline looks
// like; NOT_FOUND: what an agent holding no task of the job answers), served with the node's
// certificate from the cluster CA, as a real agent is.
class FlakyStopAgent final : public cohort::v1::Agent::Service {
 public:
  FlakyStopAgent(DaemonServer& coordinator, const std::string& node_id, int refused_stops,
                 grpc::StatusCode refusal = grpc::StatusCode::UNAVAILABLE)
      : refused_stops_(refused_stops), refusal_(refusal) {
    const tls::ChannelSecurity node = testing::node_security(coordinator, node_id);
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = node.ca_pem;
    ssl.pem_key_cert_pairs.push_back({node.key_pem, node.certificate_pem});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~FlakyStopAgent() override { server_->Shutdown(std::chrono::system_clock::now()); }

  int port() const { return port_; }

  grpc::Status LaunchTasks(grpc::ServerContext*, const cohort::v1::LaunchTasksRequest*,
                           cohort::v1::LaunchTasksResponse*) override {
    return grpc::Status::OK;
  }
  grpc::Status StopTasks(grpc::ServerContext*, const cohort::v1::StopTasksRequest* request,
                         cohort::v1::StopTasksResponse*) override {
    std::lock_guard<std::mutex> lock(mu_);
    stops_.push_back(request->job_id() + "/" + std::to_string(request->attempt()));
    changed_.notify_all();
    if (static_cast<int>(stops_.size()) <= refused_stops_)
      return grpc::Status(refusal_, "stop refused (test)");
    return grpc::Status::OK;
  }

  // The stops received ("job/attempt"), once there are `count` or `timeout` passed.
  std::vector<std::string> wait_for_stops(size_t count, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait_for(lock, timeout, [&] { return stops_.size() >= count; });
    return stops_;
  }

 private:
  const int refused_stops_;
  const grpc::StatusCode refusal_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::string> stops_;
};

class CoordinatorDispatchTest : public CoordinatorServerTest {
 protected:
  void SetUp() override {
    send_orders_ = true;
    start_server();
  }

  // Registers node-a with `agent` behind it, runs a one-rank job there and cancels it; its id.
  std::string run_and_cancel(const FlakyStopAgent& agent) {
    register_node("node-a", 1, agent.port());
    std::string job_id;
    EXPECT_TRUE(submit(valid_spec("cancelled", 1, 1), &job_id).ok());
    EXPECT_EQ(wait_for_state(job_id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
    cohort::v1::CancelJobRequest cancel;
    cancel.set_job_id(job_id);
    cohort::v1::CancelJobResponse response;
    grpc::ClientContext context;
    set_deadline(&context);
    EXPECT_TRUE(coordinator_->CancelJob(&context, cancel, &response).ok());
    return job_id;
  }
};

TEST_F(CoordinatorDispatchTest, AStopTheAgentDidNotTakeIsSentAgainUntilItDoes) {
  FlakyStopAgent agent(*server_, "node-a", /*refused_stops=*/2);
  ASSERT_GT(agent.port(), 0);
  register_node("node-a", 1, agent.port());
  std::string job_id;
  ASSERT_TRUE(submit(valid_spec("cancelled", 1, 1), &job_id).ok());
  ASSERT_EQ(wait_for_state(job_id, cohort::v1::RUNNING).state(), cohort::v1::RUNNING);
  cohort::v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  cohort::v1::CancelJobResponse response;
  grpc::ClientContext context;
  set_deadline(&context);
  ASSERT_TRUE(coordinator_->CancelJob(&context, cancel, &response).ok());
  // Refused twice: sent again after 1 s, then after 2 s more (kStopRetryInterval, doubling).
  const auto cancelled = std::chrono::steady_clock::now();
  const std::vector<std::string> stops = agent.wait_for_stops(3, kRpcTimeout);
  EXPECT_EQ(stops, std::vector<std::string>(3, job_id + "/1"));
  EXPECT_GE(std::chrono::steady_clock::now() - cancelled, kStopRetryInterval * 3 - std::chrono::milliseconds(100));
  // Taken the third time: no more.
  EXPECT_EQ(agent.wait_for_stops(4, kStopRetryInterval * 5).size(), 3u);
}

TEST_F(CoordinatorDispatchTest, AStopAnsweredNotFoundIsNotSentAgain) {
  // The agent holds nothing of the job (e.g. a launch that timed out never reached it): taken.
  FlakyStopAgent agent(*server_, "node-a", /*refused_stops=*/1000, grpc::StatusCode::NOT_FOUND);
  ASSERT_GT(agent.port(), 0);
  const std::string job_id = run_and_cancel(agent);
  ASSERT_EQ(agent.wait_for_stops(1, kRpcTimeout), std::vector<std::string>{job_id + "/1"});
  // A retry would come after kStopRetryInterval.
  EXPECT_EQ(agent.wait_for_stops(2, kStopRetryInterval * 3).size(), 1u);
}

TEST_F(CoordinatorDispatchTest, AStopNeverTakenIsDroppedAfterKMaxStopTries) {
  FlakyStopAgent agent(*server_, "node-a", /*refused_stops=*/1000);
  ASSERT_GT(agent.port(), 0);
  const std::string job_id = run_and_cancel(agent);
  // Sent after 0, 1 and 3 s (kStopRetryInterval, doubling); the node stays registered meanwhile
  // (its lease is kDefaultNodeLease), so only the bound ends the retries.
  ASSERT_EQ(kMaxStopTries, 3);
  EXPECT_EQ(agent.wait_for_stops(kMaxStopTries, kRpcTimeout),
            std::vector<std::string>(kMaxStopTries, job_id + "/1"));
  // Unbounded, the next would come 4 s after the last.
  EXPECT_EQ(agent.wait_for_stops(kMaxStopTries + 1, kStopRetryInterval * 6).size(),
            static_cast<size_t>(kMaxStopTries));
}

// Once the stop's retries ran out, the node's heartbeat is the backstop: still registered, its agent
// reports the cancelled job's task running and the reply orders it stopped. An older agent's
// heartbeat (the running list not marked reported) gets nothing, nor does a report that no longer
// lists the task; an entry without a job id is skipped, not a reason to refuse the heartbeat (and
// so its lease renewal).
TEST_F(CoordinatorDispatchTest, AHeartbeatReportingATaskWhoseStopsAllFailedGetsItsStopInTheReply) {
  FlakyStopAgent agent(*server_, "node-a", /*refused_stops=*/1000);
  ASSERT_GT(agent.port(), 0);
  const std::string job_id = run_and_cancel(agent);
  ASSERT_EQ(agent.wait_for_stops(kMaxStopTries, kRpcTimeout).size(), static_cast<size_t>(kMaxStopTries));
  auto heartbeat = [&](bool reported, const std::vector<int>& ranks, cohort::v1::HeartbeatResponse* response,
                       bool bad_entry = false) {
    cohort::v1::HeartbeatRequest request;
    request.set_node_id("node-a");
    request.set_running_reported(reported);
    if (bad_entry) {
      cohort::v1::RunningAttempt* running = request.add_running();
      running->set_attempt(1);
      running->add_ranks(0);
    }
    if (!ranks.empty()) {
      cohort::v1::RunningAttempt* running = request.add_running();
      running->set_job_id(job_id);
      running->set_attempt(1);
      for (int rank : ranks) running->add_ranks(rank);
    }
    grpc::ClientContext context;
    set_deadline(&context);
    return node_stub("node-a").Heartbeat(&context, request, response);
  };
  // Entries in a heartbeat not marked reported are not judged (the compatibility branch).
  cohort::v1::HeartbeatResponse old_agent;
  ASSERT_TRUE(heartbeat(false, {0}, &old_agent).ok());
  EXPECT_GT(old_agent.lease_ms(), 0);
  EXPECT_EQ(old_agent.stops_size(), 0);
  cohort::v1::HeartbeatResponse reply;
  grpc::Status status = heartbeat(true, {0}, &reply);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(reply.lease_ms(), 0);
  ASSERT_EQ(reply.stops_size(), 1);
  EXPECT_EQ(reply.stops(0).job_id(), job_id);
  EXPECT_EQ(reply.stops(0).attempt(), 1);
  EXPECT_NE(reply.stops(0).reason().find("the job is CANCELLED"), std::string::npos) << reply.stops(0).reason();
  cohort::v1::HeartbeatResponse with_bad_entry;
  status = heartbeat(true, {0}, &with_bad_entry, /*bad_entry=*/true);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_GT(with_bad_entry.lease_ms(), 0);
  ASSERT_EQ(with_bad_entry.stops_size(), 1);
  EXPECT_EQ(with_bad_entry.stops(0).job_id(), job_id);
  cohort::v1::HeartbeatResponse nothing_left;
  ASSERT_TRUE(heartbeat(true, {}, &nothing_left).ok());
  EXPECT_EQ(nothing_left.stops_size(), 0);
}

TEST(DaemonServerTest, AnAddressInUseIsUnavailable) {
  TempDir first_dir;
  TempDir second_dir;
  DaemonServerOptions options;
  options.listen = "127.0.0.1:0";
  options.data_dir = first_dir.path();
  auto first = DaemonServer::start(options);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  options.listen = (*first)->address();
  options.data_dir = second_dir.path();
  auto second = DaemonServer::start(options);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().to_string();
  EXPECT_NE(second.status().message().find(options.listen), std::string::npos);
}

TEST(DaemonServerTest, RejectsABadListenAddressAndAMissingDataDir) {
  TempDir dir;
  DaemonServerOptions options;
  options.data_dir = dir.path();
  options.listen = "localhost";
  auto server = DaemonServer::start(options);
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("localhost"), std::string::npos);
  options.listen = "127.0.0.1:0";
  options.data_dir.clear();
  EXPECT_EQ(DaemonServer::start(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cohort::daemon
