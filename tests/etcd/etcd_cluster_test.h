#pragma once

// EtcdClusterTest: a GoogleTest fixture whose suite shares one real etcd cluster (starting one costs
// seconds) and whose every test gets a fresh EtcdClient on it. Tests that share the cluster keep
// their keys apart (their own prefix or election name).
//
//   class MyTest : public cohort::etcd::testing::EtcdClusterTest {};
//   TEST_F(MyTest, Puts) { ASSERT_TRUE(client_->put("/k", "v").ok()); }

#include <memory>

#include <gtest/gtest.h>

#include "daemon/etcd/etcd_client.h"
#include "tests/etcd/etcd_cluster.h"

namespace cohort::etcd::testing {

class EtcdClusterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto started = EtcdCluster::start();
    ASSERT_TRUE(started.ok()) << started.status().to_string();
    cluster_ = std::move(started).value().release();
  }
  static void TearDownTestSuite() {
    delete cluster_;
    cluster_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(cluster_, nullptr);
    auto created = EtcdClient::create(cluster_->client_options());
    ASSERT_TRUE(created.ok()) << created.status().to_string();
    client_ = std::move(created).value();
  }

  // The suite's cluster (owned here; set between SetUpTestSuite and TearDownTestSuite).
  static inline EtcdCluster* cluster_ = nullptr;
  std::unique_ptr<EtcdClient> client_;
};

}  // namespace cohort::etcd::testing
