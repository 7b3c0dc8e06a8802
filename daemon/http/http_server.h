#pragma once

// HttpServer: cohortd's HTTPS port (`http_listen`), for Prometheus' /metrics today and the
// dashboard later. It is cpp-httplib (Debian's libcpp-httplib-dev) over OpenSSL, with the same
// certificate as the daemon's gRPC port, and one rule for every page: a request carries
// `Authorization: Bearer <token>` (what Prometheus' scrape config sends), checked by the
// TokenVerifier the daemon supplies (the coordinator's users; an agent's configured token).
// A missing or unknown token is 401 with `WWW-Authenticate: Bearer`; a user who is not an admin
// asking for an admin page is 403. A plaintext server (insecure mode: loopback only, like gRPC's)
// serves plain HTTP and treats every caller as a local admin.
//
// Certificate renewal: with key_file and certificate_file set, the server reads its key and chain
// from those files and keeps reading them while it runs: each new TLS connection gets the pair last
// read, and the files are looked at (stat: inode, size, mtime) at most once per
// certificate_check_interval, on the handshake that comes due. An agent's renewed node certificate
// (<data_dir>/node/serving.pem, replaced by a rename) is so served from its next connection on,
// without a restart; connections already open keep the certificate they started with. A
// replacement that does not load (unreadable, no certificate, a key that is not the certificate's)
// is logged once, naming the files, and the previous pair is served until the files change again.
//
//   HttpServerOptions options;
//   options.listen = "127.0.0.1:0";                      // port 0: the kernel picks
//   options.key_pem = ...; options.certificate_pem = ...;  // this daemon's certificate
//   options.verify_token = [&](const std::string& token) -> std::optional<HttpCaller> { ... };
//   COHORT_ASSIGN_OR_RETURN(auto server, HttpServer::create(options));   // binds
//   server->handle_get("/metrics", HttpAccess::kUser, [&](const HttpRequest&) {
//     return HttpResponse{200, kPrometheusContentType, registry_text()};
//   });
//   COHORT_RETURN_IF_ERROR(server->start());              // serves on its own threads
//   ...
//   server->stop();
//
// Thread-safety: handle_get() before start() only; handlers run on the server's threads, several
// at once. stop() may be called from any thread, more than once; the destructor calls it.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "worker/base/status.h"

namespace httplib {
class Server;
}

namespace cohort::http {

class ServingCertificate;  // http_server.cc: the key and chain new connections get

// Requests served at once; the rest wait in the accept backlog. Scrapes and page loads are short.
inline constexpr int kDefaultHttpThreads = 4;
// How long a client may take to send its request, and the server to write the answer.
inline constexpr std::chrono::seconds kDefaultHttpIoTimeout{10};
// The largest request body accepted: every page is a GET, so anything bigger is not cohort's client.
inline constexpr size_t kMaxHttpRequestBytes = 64 * 1024;
// How often at most the key and certificate files are looked at for a replacement (key_file).
inline constexpr std::chrono::milliseconds kDefaultCertificateCheckInterval{1000};
// How long start() waits for the listening thread to begin accepting.
inline constexpr std::chrono::seconds kHttpStartTimeout{10};

// Who may open a page.
enum class HttpAccess {
  kPublic,  // anyone, no token: pages that hold no data (the dashboard's login page and scripts)
  kUser,   // any valid token
  kAdmin,  // an admin's token (403 for other users)
};

// Who is asking, as the TokenVerifier established it.
struct HttpCaller {
  std::string name;    // user name ("local" on a plaintext server)
  bool admin = false;  // may open kAdmin pages
};

// The caller a bearer token belongs to; nullopt when the token is unknown or revoked. Called on
// the server's threads for every request: must be thread-safe and quick.
using TokenVerifier = std::function<std::optional<HttpCaller>(const std::string& token)>;

struct HttpRequest {
  std::string path;                                // "/metrics"
  std::multimap<std::string, std::string> params;  // query parameters
  HttpCaller caller;                               // who is asking (authenticated)
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::multimap<std::string, std::string> headers{};  // extra headers (Content-Security-Policy, ...)
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string listen;                 // HOST:PORT; port 0 picks a free one
  std::string key_pem;                // TLS private key (PEM); required unless plaintext
  std::string certificate_pem;        // TLS certificate, leaf first (PEM); required unless plaintext
  // Instead of key_pem/certificate_pem: files holding them (PEM; the same file may hold both, as
  // serving.pem does), re-read when they change (see "Certificate renewal" above).
  std::string key_file;
  std::string certificate_file;
  std::chrono::milliseconds certificate_check_interval = kDefaultCertificateCheckInterval;
  bool plaintext = false;             // insecure mode: HTTP, no authentication (loopback hosts only)
  TokenVerifier verify_token;         // required unless plaintext
  int threads = kDefaultHttpThreads;  // requests served at once
  std::chrono::seconds io_timeout = kDefaultHttpIoTimeout;  // read / write timeout per request
};

class HttpServer {
 public:
  // Checks the options, sets up TLS and binds the address (it listens from here on; requests
  // wait until start()). INVALID_ARGUMENT for a malformed address, a non-loopback plaintext
  // server, missing TLS material or verifier, key and certificate files that do not load;
  // UNAVAILABLE when the address cannot be bound.
  static StatusOr<std::unique_ptr<HttpServer>> create(HttpServerOptions options);

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;
  ~HttpServer();

  // Serves GET `path` (exact match) to callers with `access`. Before start() only.
  void handle_get(const std::string& path, HttpAccess access, HttpHandler handler);

  // Starts accepting on a thread of its own. Blocks until it accepts (up to kHttpStartTimeout).
  Status start();
  // Stops accepting and waits for the serving thread. Idempotent.
  void stop();

  int port() const { return port_; }
  // "https://HOST:PORT" (or http:// when plaintext), for logs and clients.
  const std::string& url() const { return url_; }

 private:
  explicit HttpServer(HttpServerOptions options);  // out of line: httplib::Server is incomplete here

  const HttpServerOptions options_;
  // Before server_: the SSL_CTX's certificate callback points at it, so it outlives the server.
  std::unique_ptr<ServingCertificate> certificate_;
  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::string url_;
  std::thread thread_;
  bool started_ = false;
};

// Parses "Authorization: Bearer <token>"; empty when the header is missing or another scheme.
std::string bearer_token(const std::string& authorization);

}  // namespace cohort::http
