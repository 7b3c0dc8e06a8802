#pragma once

// EtcdCluster: a real etcd cluster (Debian's /usr/bin/etcd, 3.4) for tests, on 127.0.0.1 with ports
// it picks itself, data directories in a temporary directory, and TLS everywhere: the harness makes
// its own CA (openssl), one certificate for the members (server and peer, SAN 127.0.0.1 and
// localhost) and one client certificate, and starts the members with --client-cert-auth and
// --peer-client-cert-auth, so a client without a certificate signed by that CA is refused.
//
//   auto cluster = EtcdCluster::start();            // 3 members, TLS, waits until it serves
//   ASSERT_TRUE(cluster.ok()) << cluster.status().to_string();
//   auto client = EtcdClient::create((*cluster)->client_options());
//   (*cluster)->kill_member(0);                     // SIGKILL one member
//
// Every member runs with PR_SET_PDEATHSIG=SIGKILL, and the destructor SIGKILLs and reaps all of
// them and removes the directory: the cluster goes away whatever happens to the test.
// Members elect fast (heartbeat 50 ms, election timeout 500 ms) so failover tests stay short.
//
// Not thread-safe: one test thread drives it. Several clusters may be started one after the other
// in one process (checked: three in a row); starting one per test binary (SetUpTestSuite) with a
// key prefix per test keeps a suite short (about 3 s per start on a loaded 2-core machine).

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "daemon/etcd/etcd_client.h"
#include "worker/base/status.h"

namespace cohort::etcd::testing {

// How long start() waits for the members to form a cluster that answers a read.
inline constexpr std::chrono::seconds kClusterStartTimeout{60};

struct EtcdClusterOptions {
  int members = 3;  // 1..7
  bool tls = true;  // false: plaintext client and peer URLs (only for a test of that)
  std::string etcd_binary = "/usr/bin/etcd";
};

class EtcdCluster {
 public:
  // Generates the certificates, starts every member and waits (kClusterStartTimeout) until the
  // cluster answers a read over TLS with the client certificate. On failure, the members' logs'
  // tails are in the error.
  static StatusOr<std::unique_ptr<EtcdCluster>> start(EtcdClusterOptions options = {});
  ~EtcdCluster();
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // Every member's client endpoint, HOST:PORT.
  std::vector<std::string> endpoints() const;
  // "etcd://127.0.0.1:P1,127.0.0.1:P2,...": what `job_store:` in a daemon config takes.
  std::string url() const;
  // Options for an EtcdClient trusting the cluster's CA and holding the client certificate.
  EtcdOptions client_options() const;

  // PEM files (for a daemon config: etcd_ca, etcd_cert, etcd_key) and their contents.
  const std::string& ca_file() const { return ca_file_; }
  const std::string& client_cert_file() const { return client_cert_file_; }
  const std::string& client_key_file() const { return client_key_file_; }
  std::string ca_pem() const;
  std::string client_cert_pem() const;
  std::string client_key_pem() const;
  // A temporary directory that lives as long as the cluster (for a test's other files).
  const std::string& dir() const { return dir_; }

  // SIGKILLs member `i` and reaps it (its data directory stays, so restart_member can bring it back).
  void kill_member(int i);
  // SIGSTOP / SIGCONT member `i` (a hung member: connections stay open, nothing answers).
  void stop_member(int i);
  void continue_member(int i);
  // Starts a killed member again on its ports and data directory (rejoins the cluster).
  Status restart_member(int i);
  // SIGKILLs every member (the cluster is gone; `restart_member` can bring members back).
  void kill_all();
  pid_t pid(int i) const { return members_[i].pid; }
  // The member's log file (stdout and stderr).
  std::string log_file(int i) const { return members_[i].log; }

 private:
  struct Member {
    std::string name;
    int client_port = 0;
    int peer_port = 0;
    std::string data_dir;
    std::string log;
    pid_t pid = -1;
  };

  explicit EtcdCluster(EtcdClusterOptions options) : options_(std::move(options)) {}
  Status make_certificates();
  Status launch(int i, bool initial);
  std::string logs_tail() const;

  EtcdClusterOptions options_;
  std::string dir_;
  std::string ca_file_;
  std::string server_cert_file_;
  std::string server_key_file_;
  std::string client_cert_file_;
  std::string client_key_file_;
  std::vector<Member> members_;
};

}  // namespace cohort::etcd::testing
