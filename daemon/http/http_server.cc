#include "daemon/http/http_server.h"

#include <openssl/pem.h>
#include <openssl/ssl.h>

#include <httplib.h>
#include <spdlog/spdlog.h>

namespace cohort::http {
namespace {

// HOST:PORT or [V6]:PORT -> (host without brackets, port).
StatusOr<std::pair<std::string, int>> split_listen(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  const std::string port = colon == std::string::npos ? "" : listen.substr(colon + 1);
  const bool numeric =
      !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (colon == 0 || colon == std::string::npos || !numeric || std::stoi(port) > 65535) {
    return invalid_argument_error(
        "http_listen {:?} is not HOST:PORT (e.g. 127.0.0.1:9090, or port 0 for any free one)", listen);
  }
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return std::make_pair(host, std::stoi(port));
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Installs the key and certificate chain (leaf first) from memory and refuses TLS below 1.2.
bool setup_tls(SSL_CTX& ctx, const std::string& key_pem, const std::string& certificate_pem) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  std::unique_ptr<BIO, decltype(&BIO_free)> certs(
      BIO_new_mem_buf(certificate_pem.data(), static_cast<int>(certificate_pem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> leaf(PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr),
                                                   X509_free);
  if (leaf == nullptr || SSL_CTX_use_certificate(&ctx, leaf.get()) != 1) return false;
  while (X509* extra = PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr)) {
    if (SSL_CTX_add_extra_chain_cert(&ctx, extra) != 1) {  // takes ownership on success
      X509_free(extra);
      return false;
    }
  }
  std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), BIO_free);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), EVP_PKEY_free);
  return key != nullptr && SSL_CTX_use_PrivateKey(&ctx, key.get()) == 1 &&
         SSL_CTX_check_private_key(&ctx) == 1;
}

void refuse(httplib::Response& response, int status, const std::string& message) {
  response.status = status;
  // RFC 6750: a 401 names the scheme the client should use.
  if (status == 401) response.set_header("WWW-Authenticate", "Bearer realm=\"cohort\"");
  response.set_content(message + "\n", "text/plain; charset=utf-8");
}

}  // namespace

std::string bearer_token(const std::string& authorization) {
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() <= kBearer.size() || authorization.compare(0, kBearer.size(), kBearer) != 0)
    return "";
  return authorization.substr(kBearer.size());
}

StatusOr<std::unique_ptr<HttpServer>> HttpServer::create(HttpServerOptions options) {
  COHORT_ASSIGN_OR_RETURN(auto host_port, split_listen(options.listen));
  const auto& [host, port] = host_port;
  if (options.threads < 1)
    return invalid_argument_error("HTTP threads is {}; it must be at least 1", options.threads);
  if (options.plaintext && !is_loopback(host)) {
    return invalid_argument_error(
        "http_listen {:?} is not a loopback address, and insecure mode serves plain HTTP without "
        "authentication; listen on 127.0.0.1 or turn insecure off",
        options.listen);
  }
  if (!options.plaintext &&
      (options.key_pem.empty() || options.certificate_pem.empty() || !options.verify_token)) {
    return invalid_argument_error(
        "the HTTPS server on {} needs a key, a certificate and a token verifier (a daemon bug)",
        options.listen);
  }

  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options)));
  const HttpServerOptions& opts = server->options_;
  if (opts.plaintext) {
    server->server_ = std::make_unique<httplib::Server>();
  } else {
    auto tls = std::make_unique<httplib::SSLServer>(
        [&opts](SSL_CTX& ctx) { return setup_tls(ctx, opts.key_pem, opts.certificate_pem); });
    if (!tls->is_valid()) {
      return invalid_argument_error(
          "the HTTPS server on {} cannot use this daemon's key and certificate (OpenSSL refused them)",
          opts.listen);
    }
    server->server_ = std::move(tls);
  }
  const int threads = opts.threads;
  server->server_->new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<size_t>(threads));
  };
  server->server_->set_read_timeout(opts.io_timeout);
  server->server_->set_write_timeout(opts.io_timeout);
  server->server_->set_payload_max_length(kMaxHttpRequestBytes);
  // A handler that throws answers 500 instead of taking the daemon down.
  server->server_->set_exception_handler(
      [](const httplib::Request& request, httplib::Response& response, std::exception_ptr error) {
        std::string what = "unknown error";
        try {
          if (error) std::rethrow_exception(error);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        spdlog::error("HTTP {} {}: {}", request.method, request.path, what);
        refuse(response, 500, "internal error; the daemon's log has the details");
      });

  if (port == 0) {
    server->port_ = server->server_->bind_to_any_port(host);
  } else if (server->server_->bind_to_port(host, port)) {
    server->port_ = port;
  }
  if (server->port_ <= 0) {
    return unavailable_error(
        "cannot listen on http_listen {}: the address is in use or not local; pick another", opts.listen);
  }
  const std::string shown_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  server->url_ = fmt::format("{}://{}:{}", opts.plaintext ? "http" : "https", shown_host, server->port_);
  return server;
}

HttpServer::HttpServer(HttpServerOptions options) : options_(std::move(options)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::handle_get(const std::string& path, HttpAccess access, HttpHandler handler) {
  // httplib matches patterns as regular expressions: quote the path so it matches only itself.
  std::string pattern;
  for (char c : path) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) pattern += '\\';
    pattern += c;
  }
  const bool plaintext = options_.plaintext;
  const TokenVerifier verify = options_.verify_token;
  server_->Get(pattern, [plaintext, verify, access, handler = std::move(handler)](
                            const httplib::Request& request, httplib::Response& response) {
    HttpRequest call;
    call.path = request.path;
    call.params.insert(request.params.begin(), request.params.end());
    if (plaintext) {
      call.caller = HttpCaller{"local", true};
    } else if (access == HttpAccess::kPublic) {
      call.caller = HttpCaller{};  // nobody in particular: the page holds no data
    } else {
      const std::string token = bearer_token(request.get_header_value("Authorization"));
      if (token.empty()) {
        return refuse(response, 401,
                      "this page needs a bearer token: send 'Authorization: Bearer <token>' with a cohort "
                      "user's token (Prometheus: authorization.credentials_file)");
      }
      std::optional<HttpCaller> caller = verify(token);
      if (!caller) return refuse(response, 401, "the bearer token is not valid here (unknown or revoked)");
      if (access == HttpAccess::kAdmin && !caller->admin)
        return refuse(response, 403,
                      fmt::format("user {} is not an admin; this page is for admins", caller->name));
      call.caller = *caller;
    }
    HttpResponse answer = handler(call);
    response.status = answer.status;
    for (const auto& [name, value] : answer.headers) response.set_header(name, value);
    response.set_content(answer.body, answer.content_type);
  });
}

Status HttpServer::start() {
  if (started_) return failed_precondition_error("the HTTP server on {} is already started", url_);
  started_ = true;
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) spdlog::error("the HTTP server on {} stopped accepting", url_);
  });
  // stop() does nothing until the server runs, so wait for that (it is quick).
  const auto deadline = std::chrono::steady_clock::now() + kHttpStartTimeout;
  while (!server_->is_running()) {
    if (std::chrono::steady_clock::now() > deadline) {
      return deadline_exceeded_error("the HTTP server on {} did not start within {} s", url_,
                                     kHttpStartTimeout.count());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return ok_status();
}

void HttpServer::stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace cohort::http
