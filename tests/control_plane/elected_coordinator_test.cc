// A coordinator DaemonServer (in process, TLS) electing itself in a real 3-member etcd cluster with
// TLS client certificates (tests/etcd) and keeping its jobs there (`election:` and
// `job_store: etcd://...`, issue 16):
//   - a leadership lost while the coordinator loads its store (become_leader, on the election's
//     campaign thread) is not led: the coordinator never opens its gate, and reports the loss
//     (on_leadership_lost: cohortd exits and comes back a standby);
//   - the leader compacts etcd's history every etcd_compaction_interval (a Range at a revision from
//     before the last compaction fails "required revision has been compacted").

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/etcd/etcd_client.h"
#include "daemon/server/daemon_server.h"
#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::daemon {
namespace {

using coordinator::testing::TempDir;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr seconds kLeaderLeaseTtl{2};

template <typename Predicate>
bool eventually(Predicate predicate, milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < until) {
    if (predicate()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return predicate();
}

class ElectedCoordinatorTest : public etcd::testing::EtcdClusterTest {
 protected:
  // A coordinator campaigning under `election_name` with its jobs under the store's default prefix.
  DaemonServerOptions options(const std::string& election_name) const {
    DaemonServerOptions options;
    options.role = DaemonRole::kCoordinator;
    options.listen = "127.0.0.1:0";
    options.data_dir = data_dir_.path();
    options.tick_interval = milliseconds(50);
    options.election = cluster_->url();
    options.job_store = cluster_->url();
    options.etcd_ca_file = cluster_->ca_file();
    options.etcd_cert_file = cluster_->client_cert_file();
    options.etcd_key_file = cluster_->client_key_file();
    options.election_name = election_name;
    options.leader_lease_ttl = kLeaderLeaseTtl;
    return options;
  }

  TempDir data_dir_;
};

TEST_F(ElectedCoordinatorTest, LeadershipLostWhileLoadingTheStoreIsNotLed) {
  const std::string name = "/cohort-test/election-lost-while-loading";
  // The coordinator is held in become_leader, its store loaded, until released.
  std::mutex mu;
  std::condition_variable changed;
  bool held = false;
  bool released = false;
  std::atomic<int> losses{0};
  DaemonServerOptions options = this->options(name);
  options.before_leading = [&] {
    std::unique_lock<std::mutex> lock(mu);
    if (held) return;  // only the first term
    held = true;
    changed.notify_all();
    changed.wait(lock, [&] { return released; });
  };
  options.on_leadership_lost = [&] { ++losses; };
  auto release = [&] {
    std::lock_guard<std::mutex> lock(mu);
    released = true;
    changed.notify_all();
  };
  auto started = DaemonServer::start(options);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<DaemonServer> server = std::move(*started);
  // Released before the server goes, however the test ends (its shutdown waits for become_leader).
  struct ReleaseAtExit {
    std::function<void()> release;
    ~ReleaseAtExit() { release(); }
  } release_at_exit{release};
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, seconds(30), [&] { return held; })) << "the coordinator was never elected";
  }

  // Its election key's lease is revoked (as when etcd expired it): the key is gone, and the
  // election's keep-alive (every TTL / 4) learns it within a renewal or two and steps down.
  StatusOr<std::optional<etcd::KeyValue>> leader = client_->leader(name);
  ASSERT_TRUE(leader.ok()) << leader.status().to_string();
  ASSERT_TRUE(leader->has_value()) << "no leader key under " << name;
  ASSERT_TRUE(client_->lease_revoke((*leader)->lease).ok());
  std::this_thread::sleep_for(kLeaderLeaseTtl + milliseconds(500));
  release();

  // Not led: the loss is reported, and the coordinator does not lead now nor after it campaigns
  // again (it wins the same election once more, alone in it).
  EXPECT_TRUE(eventually([&] { return losses.load() > 0; }, milliseconds(5000)))
      << "a coordinator that lost its election while loading the store must report the loss";
  EXPECT_FALSE(server->leading());
  std::this_thread::sleep_for(kLeaderLeaseTtl);
  EXPECT_FALSE(server->leading()) << "a coordinator whose leadership was lost while it loaded the store leads";
  server->shutdown();
}

TEST_F(ElectedCoordinatorTest, TheLeaderCompactsEtcdsHistory) {
  DaemonServerOptions options = this->options("/cohort-test/election-compacts");
  options.etcd_compaction_interval = milliseconds(300);
  auto started = DaemonServer::start(options);
  ASSERT_TRUE(started.ok()) << started.status().to_string();
  std::unique_ptr<DaemonServer> server = std::move(*started);
  ASSERT_TRUE(eventually([&] { return server->leading(); }, milliseconds(30000))) << "the coordinator never led";

  const std::string key = "/cohort-test/compaction/key";
  StatusOr<int64_t> old = client_->put(key, "old");
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  ASSERT_TRUE(client_->put(key, "new").ok());
  // The leader's next rounds compact at a revision read after both writes: `old` is then history.
  StatusOr<etcd::RangeResult> read = client_->range(key, "", 0, *old);
  EXPECT_TRUE(eventually(
      [&] {
        read = client_->range(key, "", 0, *old);
        return !read.ok();
      },
      milliseconds(10000)))
      << "revision " << *old << " still reads after 10 s of compaction every 300 ms";
  EXPECT_TRUE(etcd::EtcdClient::is_compacted_error(read.status())) << read.status().to_string();
  StatusOr<etcd::RangeResult> now = client_->range(key);
  ASSERT_TRUE(now.ok()) << now.status().to_string();
  ASSERT_EQ(now->kvs.size(), 1u);
  EXPECT_EQ(now->kvs.front().value, "new");
  server->shutdown();
}

}  // namespace
}  // namespace cohort::daemon
