#include "daemon/http/http_server.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <sstream>

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

struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct ChainFree {
  void operator()(STACK_OF(X509) * chain) const { sk_X509_pop_free(chain, X509_free); }
};

std::unique_ptr<BIO, BioFree> memory_bio(const std::string& text) {
  return std::unique_ptr<BIO, BioFree>(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())));
}

// "serial 1A2B..., subject CN=...": which certificate a log line means.
std::string describe(X509* cert) {
  std::string serial = "?";
  if (BIGNUM* number = ASN1_INTEGER_to_BN(X509_get_serialNumber(cert), nullptr)) {
    if (char* hex = BN_bn2hex(number)) {
      serial = hex;
      OPENSSL_free(hex);
    }
    BN_free(number);
  }
  char subject[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), subject, sizeof(subject) - 1);
  return fmt::format("serial {}, subject {}", serial, subject);
}

}  // namespace

// A key with its certificate chain, parsed once and shared by the handshakes that use it
// (SSL_use_cert_and_key takes references of its own, so a replaced identity lives on in the
// connections that still hold it).
struct TlsIdentity {
  std::unique_ptr<X509, X509Free> leaf;
  std::unique_ptr<EVP_PKEY, KeyFree> key;
  std::unique_ptr<STACK_OF(X509), ChainFree> chain;  // what follows the leaf (the cluster CA)
  std::string description;                           // describe(leaf)
};

namespace {

// Parses a PEM private key and a PEM chain, leaf first (other PEM blocks, such as the key in a
// combined file, are skipped). `key_source` / `certificate_source` name where they came from.
StatusOr<std::shared_ptr<const TlsIdentity>> parse_identity(const std::string& key_pem,
                                                            const std::string& certificate_pem,
                                                            const std::string& key_source,
                                                            const std::string& certificate_source) {
  auto identity = std::make_shared<TlsIdentity>();
  auto certs = memory_bio(certificate_pem);
  identity->leaf.reset(PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr));
  // Every failure clears OpenSSL's error queue: this runs inside a handshake's certificate
  // callback (a reload), and a stale error there would fail that handshake.
  if (identity->leaf == nullptr) {
    ERR_clear_error();
    return invalid_argument_error("{} holds no PEM certificate", certificate_source);
  }
  identity->chain.reset(sk_X509_new_null());
  while (X509* extra = PEM_read_bio_X509(certs.get(), nullptr, nullptr, nullptr)) {
    if (sk_X509_push(identity->chain.get(), extra) == 0) {
      X509_free(extra);
      return internal_error("out of memory reading the certificate chain in {}", certificate_source);
    }
  }
  ERR_clear_error();  // the loop ends on "no start line", which is not an error here
  auto key_bio = memory_bio(key_pem);
  // No passphrase: OpenSSL's default would ask on the terminal, in a handshake on a server thread.
  pem_password_cb* no_passphrase = [](char*, int, int, void*) { return 0; };
  identity->key.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, no_passphrase, nullptr));
  if (identity->key == nullptr) {
    ERR_clear_error();
    return invalid_argument_error("{} holds no PEM private key", key_source);
  }
  if (X509_check_private_key(identity->leaf.get(), identity->key.get()) != 1) {
    ERR_clear_error();
    return invalid_argument_error("the private key in {} is not the key of the certificate in {} ({})",
                                  key_source, certificate_source, describe(identity->leaf.get()));
  }
  identity->description = describe(identity->leaf.get());
  return std::shared_ptr<const TlsIdentity>(std::move(identity));
}

// Installs the key and certificate chain and refuses TLS below 1.2.
bool setup_tls(SSL_CTX& ctx, const TlsIdentity& identity) {
  SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
  return SSL_CTX_use_cert_and_key(&ctx, identity.leaf.get(), identity.key.get(), identity.chain.get(), 1) ==
         1;
}

void refuse(httplib::Response& response, int status, const std::string& message) {
  response.status = status;
  // RFC 6750: a 401 names the scheme the client should use.
  if (status == 401) response.set_header("WWW-Authenticate", "Bearer realm=\"cohort\"");
  response.set_content(message + "\n", "text/plain; charset=utf-8");
}

}  // namespace

// The key and chain new connections get, from key_file / certificate_file, read again when they
// change. current() runs in the certificate callback (serve_current) on the server's threads,
// several handshakes at once: the look at the files and the swap happen under mu_, and each
// handshake hands its own SSL the identity of that moment (SSL_use_cert_and_key on the SSL, never
// the shared SSL_CTX, which nothing changes after create()).
// No CA is reloaded: this port asks no client certificate (callers present bearer tokens; the
// SSLServer is set up without SSL_CTX_set_verify, as before), so it verifies clients against no CA.
// The cluster CA that ends the chain in serving.pem is only sent to clients, and is read again with
// the leaf since it is in the same file. (The agent's gRPC port, which verifies callers, watches
// ca.crt itself.)
class ServingCertificate {
 public:
  ServingCertificate(std::string listen, std::string key_file, std::string certificate_file,
                     std::chrono::milliseconds interval)
      : key_file_(std::move(key_file)),
        certificate_file_(std::move(certificate_file)),
        interval_(interval),
        url_(std::move(listen)) {}

  // How log lines name the port ("https://HOST:PORT"), once it is bound; before start().
  void set_url(std::string url) {
    std::lock_guard<std::mutex> lock(mu_);
    url_ = std::move(url);
  }

  // The first read, at create(): an error fails the server's creation.
  Status load() {
    std::lock_guard<std::mutex> lock(mu_);
    seen_ = look();
    COHORT_ASSIGN_OR_RETURN(identity_, read());
    checked_ = std::chrono::steady_clock::now();
    return ok_status();
  }

  std::shared_ptr<const TlsIdentity> current() {
    std::lock_guard<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (now - checked_ >= interval_) {
      checked_ = now;
      reload_if_changed_locked();
    }
    return identity_;
  }

  // SSL_CTX_set_cert_cb's callback: 1 to go on with the handshake, 0 to fail it.
  static int serve_current(SSL* ssl, void* self) {
    std::shared_ptr<const TlsIdentity> identity = static_cast<ServingCertificate*>(self)->current();
    return SSL_use_cert_and_key(ssl, identity->leaf.get(), identity->key.get(), identity->chain.get(), 1) == 1
               ? 1
               : 0;
  }

 private:
  // What stat says of one file; a change in any field means it was replaced or rewritten.
  struct FileState {
    bool exists = false;
    dev_t device = 0;
    ino_t inode = 0;
    off_t size = 0;
    int64_t mtime_ns = 0;
    bool operator==(const FileState& other) const {
      return exists == other.exists && device == other.device && inode == other.inode && size == other.size &&
             mtime_ns == other.mtime_ns;
    }
  };
  static FileState state_of(const std::string& path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) return FileState{};
    return FileState{true, info.st_dev, info.st_ino, info.st_size,
                     static_cast<int64_t>(info.st_mtim.tv_sec) * 1000000000 + info.st_mtim.tv_nsec};
  }
  std::pair<FileState, FileState> look() const { return {state_of(key_file_), state_of(certificate_file_)}; }

  StatusOr<std::shared_ptr<const TlsIdentity>> read() const {
    COHORT_ASSIGN_OR_RETURN(std::string key_pem, read_text(key_file_));
    COHORT_ASSIGN_OR_RETURN(std::string certificate_pem, read_text(certificate_file_));
    return parse_identity(key_pem, certificate_pem, key_file_, certificate_file_);
  }
  static StatusOr<std::string> read_text(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found_error("cannot read {}: {}", path, std::strerror(errno));
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Files that stat the same as last time are not read again; files that changed and do not load
  // are logged once (until they change again) and leave the previous identity in use. A renewal
  // that renames a separate key and certificate one after the other may show a mismatched pair
  // for a moment: that is one warning, then the next change loads. (serving.pem holds both.)
  void reload_if_changed_locked() {
    std::pair<FileState, FileState> now = look();
    if (now == seen_) return;
    seen_ = now;
    StatusOr<std::shared_ptr<const TlsIdentity>> replaced = read();
    if (!replaced.ok()) {
      spdlog::warn(
          "the HTTPS port {} cannot use the changed key {} and certificate {}: {}. It keeps serving the "
          "certificate it had ({}) and reads the files again when they change; they must hold a PEM key and "
          "its certificate chain, leaf first",
          url_, key_file_, certificate_file_, replaced.status().message(), identity_->description);
      return;
    }
    if ((*replaced)->description != identity_->description) {
      spdlog::info("the HTTPS port {} serves the certificate from {} to new connections: {} (was {})", url_,
                   certificate_file_, (*replaced)->description, identity_->description);
    }
    identity_ = std::move(*replaced);
  }

  const std::string key_file_;
  const std::string certificate_file_;
  const std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::string url_;                                // guarded by mu_
  std::pair<FileState, FileState> seen_;           // guarded by mu_
  std::chrono::steady_clock::time_point checked_;  // guarded by mu_
  std::shared_ptr<const TlsIdentity> identity_;    // guarded by mu_; never null after load()
};

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
  const bool from_files = !options.key_file.empty() || !options.certificate_file.empty();
  if (!options.plaintext && ((from_files ? options.key_file.empty() || options.certificate_file.empty()
                                         : options.key_pem.empty() || options.certificate_pem.empty()) ||
                             !options.verify_token)) {
    return invalid_argument_error(
        "the HTTPS server on {} needs a key, a certificate (both in memory or both as files) and a token "
        "verifier (a daemon bug)",
        options.listen);
  }

  std::unique_ptr<HttpServer> server(new HttpServer(std::move(options)));
  const HttpServerOptions& opts = server->options_;
  if (opts.plaintext) {
    server->server_ = std::make_unique<httplib::Server>();
  } else {
    std::shared_ptr<const TlsIdentity> identity;
    if (from_files) {
      server->certificate_ = std::make_unique<ServingCertificate>(
          opts.listen, opts.key_file, opts.certificate_file, opts.certificate_check_interval);
      Status loaded = server->certificate_->load();
      if (!loaded.ok()) {
        return invalid_argument_error("the HTTPS server on {} cannot use its key and certificate: {}",
                                      opts.listen, loaded.message());
      }
      identity = server->certificate_->current();
    } else {
      StatusOr<std::shared_ptr<const TlsIdentity>> parsed =
          parse_identity(opts.key_pem, opts.certificate_pem, "the daemon's key", "the daemon's certificate");
      if (!parsed.ok()) {
        return invalid_argument_error("the HTTPS server on {} cannot use its key and certificate: {}",
                                      opts.listen, parsed.status().message());
      }
      identity = std::move(*parsed);
    }
    ServingCertificate* reloading = server->certificate_.get();
    auto tls = std::make_unique<httplib::SSLServer>([&identity, reloading](SSL_CTX& ctx) {
      if (!setup_tls(ctx, *identity)) return false;
      // Each handshake takes the certificate of the moment (a renewal replaces the files); the
      // context's own pair above is what a handshake would fall back on, and is never changed.
      if (reloading != nullptr) SSL_CTX_set_cert_cb(&ctx, &ServingCertificate::serve_current, reloading);
      return true;
    });
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
  if (server->certificate_ != nullptr) server->certificate_->set_url(server->url_);
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
