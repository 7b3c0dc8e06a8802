#include "tests/etcd/etcd_cluster.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace cohort::etcd::testing {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A port the kernel hands out for 127.0.0.1:0, released again for etcd to bind. Another process
// could take it in between; the ephemeral range makes that unlikely, and start() then fails with
// etcd's "address already in use" in the log rather than hanging.
StatusOr<int> free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno_status("socket", errno);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof(address);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    const int err = errno;
    ::close(fd);
    return errno_status("bind(127.0.0.1:0)", err);
  }
  ::close(fd);
  return static_cast<int>(ntohs(address.sin_port));
}

// Runs a shell command (openssl) with its output in `log`; an error carries the log.
Status run_shell(const std::string& command, const std::string& log) {
  const std::string full = "(" + command + ") >" + log + " 2>&1";
  const int rc = std::system(full.c_str());
  if (rc != 0) {
    return internal_error("test certificate command failed (status {}): {}\n{}", rc, command, read_text(log));
  }
  return ok_status();
}

}  // namespace

StatusOr<std::unique_ptr<EtcdCluster>> EtcdCluster::start(EtcdClusterOptions options) {
  if (options.members < 1 || options.members > 7) {
    return invalid_argument_error("EtcdCluster: members must be 1..7, not {}", options.members);
  }
  if (access(options.etcd_binary.c_str(), X_OK) != 0) {
    return failed_precondition_error("{} is not executable: run deploy/install-deps.sh (etcd-server)",
                                     options.etcd_binary);
  }
  std::unique_ptr<EtcdCluster> cluster(new EtcdCluster(std::move(options)));
  const char* base = std::getenv("TEST_TMPDIR");
  std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/cohort-etcd-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return errno_status("mkdtemp(" + pattern + ")", errno);
  cluster->dir_ = pattern;
  if (cluster->options_.tls) COHORT_RETURN_IF_ERROR(cluster->make_certificates());

  for (int i = 0; i < cluster->options_.members; ++i) {
    Member member;
    member.name = "m" + std::to_string(i);
    COHORT_ASSIGN_OR_RETURN(member.client_port, free_port());
    COHORT_ASSIGN_OR_RETURN(member.peer_port, free_port());
    member.data_dir = cluster->dir_ + "/" + member.name + ".etcd";
    member.log = cluster->dir_ + "/" + member.name + ".log";
    cluster->members_.push_back(member);
  }
  for (int i = 0; i < cluster->size(); ++i) COHORT_RETURN_IF_ERROR(cluster->launch(i, /*initial=*/true));

  // Ready when a read through the client certificate succeeds (a quorum has elected a leader).
  EtcdOptions client_options = cluster->client_options();
  client_options.call_timeout = std::chrono::milliseconds(1000);
  client_options.attempt_timeout = std::chrono::milliseconds(500);
  const auto deadline = std::chrono::steady_clock::now() + kClusterStartTimeout;
  Status last;
  while (std::chrono::steady_clock::now() < deadline) {
    // A linearizable read needs the raft leader: it answers only once the cluster has formed. A
    // fresh client each round, so no connection state of a member that was not up yet lingers.
    COHORT_ASSIGN_OR_RETURN(auto client, EtcdClient::create(client_options));
    last = client->range("/cohort-test/ready").status();
    if (last.ok()) return cluster;
    for (const Member& member : cluster->members_) {
      int status = 0;
      if (member.pid > 0 && waitpid(member.pid, &status, WNOHANG) == member.pid) {
        return internal_error("etcd member {} exited during start-up (status {}); logs:\n{}", member.name,
                              status, cluster->logs_tail());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return deadline_exceeded_error("etcd cluster of {} did not answer within {} s: {}; logs:\n{}",
                                 cluster->size(), kClusterStartTimeout.count(), last.to_string(),
                                 cluster->logs_tail());
}

Status EtcdCluster::make_certificates() {
  ca_file_ = dir_ + "/ca.pem";
  server_cert_file_ = dir_ + "/member.pem";
  server_key_file_ = dir_ + "/member-key.pem";
  client_cert_file_ = dir_ + "/client.pem";
  client_key_file_ = dir_ + "/client-key.pem";
  const std::string ca_key = dir_ + "/ca-key.pem";
  const std::string log = dir_ + "/openssl.log";
  const std::string ext = dir_ + "/member.ext";
  {
    // Members serve clients and dial each other with the same certificate: both usages.
    std::ofstream out(ext);
    out << "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        << "extendedKeyUsage=serverAuth,clientAuth\n"
        << "keyUsage=digitalSignature,keyEncipherment\n";
  }
  const std::string client_ext = dir_ + "/client.ext";
  {
    std::ofstream out(client_ext);
    out << "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n";
  }
  const std::string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  COHORT_RETURN_IF_ERROR(run_shell("openssl req -x509 " + ec +
                                       " -days 2 -subj /CN=cohort-test-etcd-ca -keyout " + ca_key + " -out " +
                                       ca_file_,
                                   log));
  COHORT_RETURN_IF_ERROR(run_shell(
      "openssl req -new " + ec + " -subj /CN=etcd-member -keyout " + server_key_file_ + " -out " + dir_ +
          "/member.csr && openssl x509 -req -in " + dir_ + "/member.csr -CA " + ca_file_ + " -CAkey " +
          ca_key + " -CAcreateserial -days 2 -extfile " + ext + " -out " + server_cert_file_,
      log));
  COHORT_RETURN_IF_ERROR(run_shell(
      "openssl req -new " + ec + " -subj /CN=cohort-coordinator -keyout " + client_key_file_ + " -out " +
          dir_ + "/client.csr && openssl x509 -req -in " + dir_ + "/client.csr -CA " + ca_file_ + " -CAkey " +
          ca_key + " -CAcreateserial -days 2 -extfile " + client_ext + " -out " + client_cert_file_,
      log));
  return ok_status();
}

Status EtcdCluster::launch(int i, bool initial) {
  Member& member = members_[i];
  const std::string scheme = options_.tls ? "https://" : "http://";
  const std::string client_url = scheme + "127.0.0.1:" + std::to_string(member.client_port);
  const std::string peer_url = scheme + "127.0.0.1:" + std::to_string(member.peer_port);
  std::string initial_cluster;
  for (const Member& m : members_) {
    if (!initial_cluster.empty()) initial_cluster += ",";
    initial_cluster += m.name + "=" + scheme + "127.0.0.1:" + std::to_string(m.peer_port);
  }
  std::vector<std::string> args = {
      options_.etcd_binary,
      "--name=" + member.name,
      "--data-dir=" + member.data_dir,
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=" + initial_cluster,
      "--initial-cluster-state=" + std::string(initial ? "new" : "existing"),
      "--initial-cluster-token=cohort-test-" + std::to_string(getpid()),
      "--heartbeat-interval=50",
      "--election-timeout=500",
      "--log-outputs=stderr",
      "--logger=zap",
  };
  if (options_.tls) {
    for (const std::string& arg :
         {"--cert-file=" + server_cert_file_, "--key-file=" + server_key_file_,
          "--trusted-ca-file=" + ca_file_, std::string("--client-cert-auth"),
          "--peer-cert-file=" + server_cert_file_, "--peer-key-file=" + server_key_file_,
          "--peer-trusted-ca-file=" + ca_file_, std::string("--peer-client-cert-auth")}) {
      args.push_back(arg);
    }
  }
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log_fd = ::open(member.log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return errno_status("open(" + member.log + ")", errno);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    ::close(log_fd);
    return errno_status("fork", err);
  }
  if (pid == 0) {
    // The member dies with the test process, whatever ends it.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) dup2(null_fd, STDIN_FILENO);
    execv(argv[0], argv.data());
    _exit(127);
  }
  ::close(log_fd);
  member.pid = pid;
  return ok_status();
}

EtcdCluster::~EtcdCluster() {
  kill_all();
  if (!dir_.empty()) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

void EtcdCluster::kill_member(int i) {
  Member& member = members_[i];
  if (member.pid <= 0) return;
  ::kill(member.pid, SIGKILL);
  ::waitpid(member.pid, nullptr, 0);
  member.pid = -1;
}

void EtcdCluster::kill_all() {
  for (int i = 0; i < size(); ++i) kill_member(i);
}

void EtcdCluster::stop_member(int i) {
  if (members_[i].pid > 0) ::kill(members_[i].pid, SIGSTOP);
}

void EtcdCluster::continue_member(int i) {
  if (members_[i].pid > 0) ::kill(members_[i].pid, SIGCONT);
}

Status EtcdCluster::restart_member(int i) {
  if (members_[i].pid > 0)
    return failed_precondition_error("etcd member {} is still running", members_[i].name);
  // The data directory holds the member's identity: it rejoins as itself.
  return launch(i, /*initial=*/true);
}

std::vector<std::string> EtcdCluster::endpoints() const {
  std::vector<std::string> out;
  for (const Member& member : members_) out.push_back("127.0.0.1:" + std::to_string(member.client_port));
  return out;
}

std::string EtcdCluster::url() const {
  std::string url = "etcd://";
  for (const std::string& endpoint : endpoints()) {
    if (url.size() > 7) url += ",";
    url += endpoint;
  }
  return url;
}

std::string EtcdCluster::ca_pem() const { return ca_file_.empty() ? "" : read_text(ca_file_); }
std::string EtcdCluster::client_cert_pem() const {
  return client_cert_file_.empty() ? "" : read_text(client_cert_file_);
}
std::string EtcdCluster::client_key_pem() const {
  return client_key_file_.empty() ? "" : read_text(client_key_file_);
}

EtcdOptions EtcdCluster::client_options() const {
  EtcdOptions options;
  options.endpoints = endpoints();
  options.ca_pem = ca_pem();
  options.certificate_pem = client_cert_pem();
  options.key_pem = client_key_pem();
  return options;
}

std::string EtcdCluster::logs_tail() const {
  std::string out;
  for (const Member& member : members_) {
    std::string text = read_text(member.log);
    if (text.size() > 2000) text = "..." + text.substr(text.size() - 2000);
    out += "--- " + member.name + " (" + member.log + ")\n" + text + "\n";
  }
  return out;
}

}  // namespace cohort::etcd::testing
