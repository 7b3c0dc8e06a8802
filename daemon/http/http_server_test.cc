// HttpServer over real sockets on 127.0.0.1:0: TLS with a certificate from a cluster CA, bearer
// tokens (none / unknown -> 401, a user on an admin page -> 403), plaintext only on loopback.

#include "daemon/http/http_server.h"

#include <fstream>
#include <optional>

#include <gtest/gtest.h>
#include <httplib.h>

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
    options.listen = "127.0.0.1:0";
    options.key_pem = issued->key_pem;
    options.certificate_pem = issued->certificate_pem;
    options.verify_token = verify;
    StatusOr<std::unique_ptr<HttpServer>> server = HttpServer::create(options);
    ASSERT_TRUE(server.ok()) << server.status().to_string();
    server_ = std::move(*server);
    server_->handle_get("/page", HttpAccess::kUser, [](const HttpRequest& request) {
      return HttpResponse{200, "text/plain", "hello " + request.caller.name};
    });
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
