// cohort-store: a standalone TcpStore server, for launchers that want the bootstrap store outside
// rank 0 (so rank 0 can restart without taking the store down).
//
//   cohort-store --listen 0.0.0.0:29500 &
//   MASTER_ADDR=host MASTER_PORT=29500 COHORT_STORE=external cohort-worker --init env:// ...
//   cohort-worker --init "tcp://host:29500?rank=R&world_size=N&store=external"
//   cohort-store --version
//
// main only parses flags; the server is worker/comm/store/tcp_store_server.h.

#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "worker/base/cli_flags.h"
#include "worker/comm/store/tcp_store_auth.h"
#include "worker/comm/store/tcp_store_server.h"

namespace {

constexpr const char* kDescription = R"(Serves a cohort TcpStore (the key-value store ranks bootstrap through) until SIGTERM or SIGINT.
Ranks then use tcp://HOST:PORT?...&store=external, or env:// with COHORT_STORE=external.
When COHORT_JOB_SECRET is set, clients must prove they hold the same secret (set it on every
rank); without it any client that reaches the address is served (a warning is logged).)";

constexpr const char* kFooter = R"(example:
  cohort-store --listen 0.0.0.0:29500 &
  cohort-worker --init "tcp://host:29500?rank=R&world_size=N&store=external")";

constexpr const char* kDefaultListen = "0.0.0.0:29500";

bool split_host_port(const std::string& text, std::string* host, int* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos) return false;
  *host = text.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  char* end = nullptr;
  long value = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (end == text.c_str() + colon + 1 || *end != '\0' || value < 0 || value > 65535) return false;
  *port = static_cast<int>(value);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen = kDefaultListen;
  auto app = cohort::cli_flags::make_app("cohort-store", kDescription);
  app->footer(kFooter);
  app->add_option("--listen", listen, "address to listen on (port 0 picks a free one, printed on startup)")
      ->type_name("HOST:PORT")
      ->capture_default_str();
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
  cohort::comm::TcpStoreServerOptions options;
  if (const char* secret = std::getenv(cohort::comm::kJobSecretEnvironmentVariable)) options.service.secret = secret;
  if (!split_host_port(listen, &options.host, &options.port)) {
    std::fprintf(stderr,
                 "cohort-store: --listen %s is not HOST:PORT (e.g. 0.0.0.0:29500)\nrun 'cohort-store --help' for "
                 "the options\n",
                 listen.c_str());
    return cohort::cli_flags::kExitUsage;
  }
  // Block the stop signals before the server starts its thread, then wait for one here.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, nullptr);
  auto server = cohort::comm::TcpStoreServer::start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "cohort-store: %s\n", server.status().to_string().c_str());
    return 1;
  }
  std::printf("cohort-store listening on %s:%d\n", options.host.c_str(), (*server)->port());
  std::fflush(stdout);
  int signal_number = 0;
  sigwait(&stop, &signal_number);
  std::printf("cohort-store: %s, stopping\n", strsignal(signal_number));
  (*server)->stop();
  return 0;
}
