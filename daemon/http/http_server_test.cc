// HttpServer over real sockets on 127.0.0.1:0: TLS with a certificate from a cluster CA, bearer
// tokens (none / unknown -> 401, a user on an admin page -> 403), plaintext only on loopback; a
// certificate replaced on disk (an agent's renewal) served to new connections without a restart.

#include "daemon/http/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <httplib.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include "daemon/coordinator/temp_dir.h"
#include "daemon/security/cluster_ca.h"

namespace cohort::http {
namespace {

using coordinator::testing::TempDir;

constexpr const char* kUserToken = "user-token";
constexpr const char* kAdminToken = "admin-token";
constexpr time_t kClientTimeoutSeconds = 10;

std::optional<HttpCaller> verify(const std::string& token) {
  if (token == kUserToken) return HttpCaller{"alice", false};
  if (token == kAdminToken) return HttpCaller{"admin", true};
  return std::nullopt;
}

// A server on a loopback port with the tests' tokens and a /page for users, not yet started.
StatusOr<std::unique_ptr<HttpServer>> page_server(HttpServerOptions options) {
  options.listen = "127.0.0.1:0";
  options.verify_token = verify;
  COHORT_ASSIGN_OR_RETURN(std::unique_ptr<HttpServer> server, HttpServer::create(options));
  server->handle_get("/page", HttpAccess::kUser, [](const HttpRequest& request) {
    return HttpResponse{200, "text/plain", "hello " + request.caller.name};
  });
  return server;
}

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<security::ClusterCa> ca = security::ClusterCa::load_or_create(dir_.path() + "/ca");
    ASSERT_TRUE(ca.ok()) << ca.status().to_string();
    StatusOr<security::KeyAndCertificate> issued =
        ca->issue("cohort-coordinator", {"cohort-coordinator"}, {"127.0.0.1"});
    ASSERT_TRUE(issued.ok()) << issued.status().to_string();
    ca_file_ = dir_.path() + "/ca.pem";
    std::ofstream(ca_file_) << ca->certificate_pem();

    HttpServerOptions options;
    options.key_pem = issued->key_pem;
    options.certificate_pem = issued->certificate_pem;
    StatusOr<std::unique_ptr<HttpServer>> server = page_server(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    server_->handle_get("/admin", HttpAccess::kAdmin, [](const HttpRequest&) {
      return HttpResponse{200, "text/plain", "secret"};
    });
    ASSERT_TRUE(server_->start().ok());
    EXPECT_EQ(server_->url(), "https://127.0.0.1:" + std::to_string(server_->port()));
  }

  std::unique_ptr<httplib::SSLClient> client(const std::string& ca_file) {
    auto client = std::make_unique<httplib::SSLClient>("127.0.0.1", server_->port());
    client->set_ca_cert_path(ca_file.c_str());
    client->enable_server_certificate_verification(true);
    client->set_connection_timeout(kClientTimeoutSeconds);
    client->set_read_timeout(kClientTimeoutSeconds);
    return client;
  }

  httplib::Result get(const std::string& path, const std::string& token) {
    httplib::Headers headers;
    if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
    return client(ca_file_)->Get(path.c_str(), headers);
  }

  TempDir dir_;
  std::string ca_file_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerTest, ValidTokenGetsThePage) {
  httplib::Result result = get("/page", kUserToken);
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->body, "hello alice");
}

TEST_F(HttpServerTest, NoTokenIs401WithBearerChallenge) {
  httplib::Result result = get("/page", "");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 401);
  EXPECT_EQ(result->get_header_value("WWW-Authenticate"), "Bearer realm=\"cohort\"");
  EXPECT_NE(result->body.find("Authorization: Bearer"), std::string::npos) << result->body;
}

TEST_F(HttpServerTest, WrongTokenOrSchemeIs401) {
  httplib::Result result = get("/page", "not-a-token");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 401);
  EXPECT_EQ(result->body.find("hello"), std::string::npos);
  // Basic credentials are not a bearer token.
  httplib::Result basic = client(ca_file_)->Get("/page", {{"Authorization", "Basic dXNlcjpwYXNz"}});
  ASSERT_TRUE(basic);
  EXPECT_EQ(basic->status, 401);
}

TEST_F(HttpServerTest, AdminPageRefusesUsersWith403) {
  httplib::Result user = get("/admin", kUserToken);
  ASSERT_TRUE(user);
  EXPECT_EQ(user->status, 403);
  EXPECT_NE(user->body.find("alice is not an admin"), std::string::npos) << user->body;
  httplib::Result admin = get("/admin", kAdminToken);
  ASSERT_TRUE(admin);
  EXPECT_EQ(admin->status, 200);
  EXPECT_EQ(admin->body, "secret");
}

TEST_F(HttpServerTest, UnknownPathIs404) {
  httplib::Result result = get("/nothing", kAdminToken);
  ASSERT_TRUE(result);
  EXPECT_EQ(result->status, 404);
}

TEST_F(HttpServerTest, ClientNotTrustingTheClusterCaFailsTheHandshake) {
  TempDir other;
  StatusOr<security::ClusterCa> other_ca = security::ClusterCa::load_or_create(other.path() + "/ca");
  ASSERT_TRUE(other_ca.ok());
  const std::string other_file = other.path() + "/other.pem";
  std::ofstream(other_file) << other_ca->certificate_pem();
  httplib::Result result =
      client(other_file)->Get("/page", {{"Authorization", std::string("Bearer ") + kUserToken}});
  EXPECT_FALSE(result);
}

TEST_F(HttpServerTest, StopIsIdempotent) {
  server_->stop();
  server_->stop();
  EXPECT_FALSE(get("/page", kUserToken));
}

// One TLS connection from a bare OpenSSL client that trusts only the cluster CA and checks the
// server's certificate names 127.0.0.1: shows which certificate the server handed this connection.
class TlsConnection {
 public:
  TlsConnection(int port, const std::string& ca_file) {
    ctx_ = SSL_CTX_new(TLS_client_method());
    if (ctx_ == nullptr || SSL_CTX_load_verify_locations(ctx_, ca_file.c_str(), nullptr) != 1) return;
    SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER, nullptr);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval timeout{kClientTimeoutSeconds, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return;
    ssl_ = SSL_new(ctx_);
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_), "127.0.0.1");
    SSL_set_fd(ssl_, fd_);
    connected_ = SSL_connect(ssl_) == 1 && SSL_get_verify_result(ssl_) == X509_V_OK;
  }
  ~TlsConnection() {
    if (ssl_ != nullptr) SSL_free(ssl_);
    if (fd_ >= 0) ::close(fd_);
    if (ctx_ != nullptr) SSL_CTX_free(ctx_);
  }
  bool connected() const { return connected_; }

  // The serial number (hex) of the certificate the server presented; "" when not connected.
  std::string served_serial() const {
    if (!connected_) return "";
    X509* cert = SSL_get1_peer_certificate(ssl_);
    if (cert == nullptr) return "";
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, cert);
    char* data = nullptr;
    const long size = BIO_get_mem_data(bio, &data);
    StatusOr<security::CertificateInfo> info = security::certificate_info(std::string(data, size));
    BIO_free(bio);
    X509_free(cert);
    return info.ok() ? info->serial : "";
  }

  // GET `path` with the user's token over this connection; the whole answer ("" on a failure).
  std::string get(const std::string& path) {
    if (!connected_) return "";
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " +
                                kUserToken + "\r\nConnection: close\r\n\r\n";
    if (SSL_write(ssl_, request.data(), static_cast<int>(request.size())) != static_cast<int>(request.size()))
      return "";
    std::string answer;
    char buffer[4096];
    int n = 0;
    while ((n = SSL_read(ssl_, buffer, sizeof(buffer))) > 0) answer.append(buffer, n);
    return answer;
  }

 private:
  SSL_CTX* ctx_ = nullptr;
  SSL* ssl_ = nullptr;
  int fd_ = -1;
  bool connected_ = false;
};

// What the default logger writes while it lives (the server's warnings).
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  // How often `needle` was logged so far.
  int count(const std::string& needle) {
    sink_->flush();
    const std::string text = text_.str();
    int found = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++found;
    return found;
  }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

// How long a replaced certificate may take to reach new connections (checked once a second).
constexpr auto kRenewalWait = std::chrono::seconds(10);

// The server reads its key and chain from one file, as an agent's port reads serving.pem, and the
// test replaces that file the way a renewal does (write_private_file: a temporary name, renamed).
class HttpServerRenewalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StatusOr<security::ClusterCa> ca = security::ClusterCa::load_or_create(dir_.path() + "/ca");
    ASSERT_TRUE(ca.ok()) << ca.status().to_string();
    ca_pem_ = ca->certificate_pem();
    ca_file_ = dir_.path() + "/ca.pem";
    std::ofstream(ca_file_) << ca_pem_;
    for (const char* name : {"node-a", "node-b", "node-c"}) {
      StatusOr<security::KeyAndCertificate> issued = ca->issue(name, {name}, {"127.0.0.1"});
      ASSERT_TRUE(issued.ok()) << issued.status().to_string();
      issued_.push_back(*issued);
    }
    serving_file_ = dir_.path() + "/serving.pem";
    write_serving(issued_[0].key_pem, issued_[0].certificate_pem);

    HttpServerOptions options;
    options.key_file = options.certificate_file = serving_file_;
    StatusOr<std::unique_ptr<HttpServer>> server = page_server(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    ASSERT_TRUE(server_->start().ok());
  }
  void TearDown() override {
    if (server_ != nullptr) server_->stop();  // before the log capture goes
  }

  void write_serving(const std::string& key_pem, const std::string& certificate_pem) {
    Status written = security::write_private_file(serving_file_, key_pem + certificate_pem + ca_pem_, 0600);
    ASSERT_TRUE(written.ok()) << written.to_string();
  }
  std::string served_serial() { return TlsConnection(server_->port(), ca_file_).served_serial(); }
  // Opens new connections until one is served `serial` or kRenewalWait passes; the last serial seen.
  std::string wait_for_serial(const std::string& serial) {
    const auto deadline = std::chrono::steady_clock::now() + kRenewalWait;
    std::string seen = served_serial();
    while (seen != serial && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      seen = served_serial();
    }
    return seen;
  }

  LogCapture log_;
  TempDir dir_;
  std::string ca_pem_;
  std::string ca_file_;
  std::string serving_file_;
  std::vector<security::KeyAndCertificate> issued_;  // node-a, node-b, node-c, all from the same CA
  std::unique_ptr<HttpServer> server_;
};

TEST_F(HttpServerRenewalTest, NewConnectionsGetTheReplacedCertificateOldOnesKeepWorking) {
  const std::string serial_a = issued_[0].serial, serial_b = issued_[1].serial;
  ASSERT_NE(serial_a, serial_b);
  TlsConnection before(server_->port(), ca_file_);
  ASSERT_TRUE(before.connected());
  EXPECT_EQ(before.served_serial(), serial_a);
  httplib::SSLClient keep_alive("127.0.0.1", server_->port());
  keep_alive.set_ca_cert_path(ca_file_.c_str());
  keep_alive.enable_server_certificate_verification(true);
  keep_alive.set_keep_alive(true);
  keep_alive.set_read_timeout(kClientTimeoutSeconds);
  const httplib::Headers token{{"Authorization", std::string("Bearer ") + kUserToken}};
  httplib::Result first = keep_alive.Get("/page", token);
  ASSERT_TRUE(first) << httplib::to_string(first.error());
  EXPECT_EQ(first->status, 200);

  // Clients keep connecting while the file is replaced: every handshake gets A or B, none fails.
  std::atomic<bool> stop{false};
  std::atomic<int> served{0}, failed{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&] {
      while (!stop) {
        TlsConnection connection(server_->port(), ca_file_);
        const std::string serial = connection.served_serial();
        const std::string answer = connection.get("/page");
        const bool ok = (serial == serial_a || serial == serial_b) && answer.rfind("HTTP/1.1 200", 0) == 0;
        ++(ok ? served : failed);
      }
    });
  }
  write_serving(issued_[1].key_pem, issued_[1].certificate_pem);
  EXPECT_EQ(wait_for_serial(serial_b), serial_b) << "a new connection still gets the replaced certificate";
  stop = true;
  for (std::thread& client : clients) client.join();
  EXPECT_GT(served.load(), 0);
  EXPECT_EQ(failed.load(), 0);

  // The connection opened before the renewal keeps its certificate and is served.
  EXPECT_EQ(before.served_serial(), serial_a);
  const std::string answer = before.get("/page");
  EXPECT_EQ(answer.rfind("HTTP/1.1 200", 0), 0u) << answer;
  EXPECT_NE(answer.find("hello alice"), std::string::npos) << answer;
  // A keep-alive client goes on (over its connection, or a new one that verifies B).
  httplib::Result again = keep_alive.Get("/page", token);
  ASSERT_TRUE(again) << httplib::to_string(again.error());
  EXPECT_EQ(again->status, 200);
  EXPECT_EQ(log_.count("cannot use the changed key"), 0);
}

TEST_F(HttpServerRenewalTest, AReplacementThatDoesNotLoadKeepsThePreviousCertificateAndWarnsOnce) {
  const std::string serial_b = issued_[1].serial, serial_c = issued_[2].serial;
  write_serving(issued_[1].key_pem, issued_[1].certificate_pem);
  ASSERT_EQ(wait_for_serial(serial_b), serial_b);

  // node-c's certificate with node-b's key: the pair does not match.
  write_serving(issued_[1].key_pem, issued_[2].certificate_pem);
  const std::string warning =
      "cannot use the changed key " + serving_file_ + " and certificate " + serving_file_;
  const auto deadline = std::chrono::steady_clock::now() + kRenewalWait;
  while (log_.count(warning) == 0 && std::chrono::steady_clock::now() < deadline) {
    EXPECT_EQ(served_serial(), serial_b);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(log_.count(warning), 1) << "no warning naming " << serving_file_;
  EXPECT_EQ(log_.count("is not the key of the certificate"), 1);
  // Past the next checks: still B, and the unchanged broken file is not warned about again.
  const auto later = std::chrono::steady_clock::now() + 2 * kDefaultCertificateCheckInterval +
                     std::chrono::milliseconds(200);
  while (std::chrono::steady_clock::now() < later) {
    EXPECT_EQ(served_serial(), serial_b);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(log_.count(warning), 1);

  // A good pair again is taken into use.
  write_serving(issued_[2].key_pem, issued_[2].certificate_pem);
  EXPECT_EQ(wait_for_serial(serial_c), serial_c);
}

TEST_F(HttpServerRenewalTest, KeyAndCertificateFilesThatDoNotLoadFailCreate) {
  HttpServerOptions options;
  options.listen = "127.0.0.1:0";
  options.verify_token = verify;
  options.key_file = options.certificate_file = dir_.path() + "/missing.pem";
  StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find(options.key_file), std::string::npos)
      << server.status().to_string();
}

TEST(HttpServerPlaintextTest, ServesWithoutAuthenticationOnLoopbackOnly) {
  HttpServerOptions options;
  options.listen = "0.0.0.0:0";
  options.plaintext = true;
  StatusOr<std::unique_ptr<HttpServer>> refused = HttpServer::create(options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("loopback"), std::string::npos) << refused.status().to_string();

  options.listen = "127.0.0.1:0";
  StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::create(options);
  ASSERT_TRUE(server.ok()) << server.status().to_string();
  (*server)->handle_get("/admin", HttpAccess::kAdmin, [](const HttpRequest& request) {
    return HttpResponse{200, "text/plain", request.caller.name};
  });
  ASSERT_TRUE((*server)->start().ok());
  httplib::Client client("127.0.0.1", (*server)->port());
  client.set_read_timeout(kClientTimeoutSeconds);
  httplib::Result result = client.Get("/admin");
  ASSERT_TRUE(result) << httplib::to_string(result.error());
  EXPECT_EQ(result->status, 200);
  EXPECT_EQ(result->body, "local");
}

TEST(HttpServerOptionsTest, MalformedAddressAndMissingTlsAreRefused) {
  HttpServerOptions options;
  options.listen = "127.0.0.1";
  StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_NE(server.status().message().find("HOST:PORT"), std::string::npos);
  options.listen = "127.0.0.1:0";
  server = HttpServer::create(options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument);
}

TEST(BearerTokenTest, ParsesOnlyTheBearerScheme) {
  EXPECT_EQ(bearer_token("Bearer abc"), "abc");
  EXPECT_EQ(bearer_token("Bearer "), "");
  EXPECT_EQ(bearer_token("Basic abc"), "");
  EXPECT_EQ(bearer_token(""), "");
}

}  // namespace
}  // namespace cohort::http
