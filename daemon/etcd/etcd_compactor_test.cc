// EtcdCompactor against a real 3-member etcd 3.4 cluster with TLS client certificates: a round
// compacts at the revision the previous one read, so history older than that is gone (a Range at an
// old revision fails "required revision has been compacted") while the revision kept still reads;
// nothing happens between rounds.

#include "daemon/etcd/etcd_compactor.h"

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "tests/etcd/etcd_cluster.h"
#include "tests/etcd/etcd_cluster_test.h"

namespace cohort::etcd {
namespace {

using std::chrono::milliseconds;

class EtcdCompactorTest : public testing::EtcdClusterTest {};

TEST_F(EtcdCompactorTest, ARoundCompactsAtTheRevisionThePreviousOneRead) {
  const std::string key = "/cohort-test/compactor/key";
  StatusOr<int64_t> first = client_->put(key, "1");
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  StatusOr<int64_t> second = client_->put(key, "2");
  ASSERT_TRUE(second.ok()) << second.status().to_string();

  const milliseconds interval(60000);
  EtcdCompactor compactor(client_.get(), interval);
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(compactor.tick(start).ok());  // reads the revision to keep; compacts nothing yet
  EXPECT_EQ(compactor.compacted(), 0);
  const int64_t kept = compactor.pending();
  EXPECT_GE(kept, *second);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client_->put(key, "later " + std::to_string(i)).ok());

  // Before the next round the old value is still there.
  ASSERT_TRUE(compactor.tick(start + interval / 2).ok());
  EXPECT_EQ(compactor.compacted(), 0);
  StatusOr<RangeResult> old = client_->range(key, "", 0, *first);
  ASSERT_TRUE(old.ok()) << old.status().to_string();
  ASSERT_EQ(old->kvs.size(), 1u);
  EXPECT_EQ(old->kvs.front().value, "1");

  // The next round compacts at `kept`: older revisions are gone, `kept` and later still read.
  ASSERT_TRUE(compactor.tick(start + interval).ok());
  EXPECT_EQ(compactor.compacted(), kept);
  EXPECT_GT(compactor.pending(), kept);
  StatusOr<RangeResult> gone = client_->range(key, "", 0, *first);
  ASSERT_FALSE(gone.ok()) << "the history before revision " << kept << " must be compacted";
  EXPECT_TRUE(EtcdClient::is_compacted_error(gone.status())) << gone.status().to_string();
  StatusOr<RangeResult> at_kept = client_->range(key, "", 0, kept);
  ASSERT_TRUE(at_kept.ok()) << at_kept.status().to_string();
  ASSERT_EQ(at_kept->kvs.size(), 1u);
  EXPECT_EQ(at_kept->kvs.front().value, "2");

  // Compacting a revision that is gone already is etcd's "compacted" error; a round that meets it
  // (another coordinator compacted further) is not a failure.
  EXPECT_TRUE(EtcdClient::is_compacted_error(client_->compact(*first)));
  ASSERT_TRUE(client_->compact(compactor.pending()).ok());
  EXPECT_TRUE(compactor.tick(start + 2 * interval).ok());
}

}  // namespace
}  // namespace cohort::etcd
