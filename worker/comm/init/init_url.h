#pragma once

// InitUrl: an init method's URL taken apart — scheme://authority/path?key=value&... — as
// torch.distributed's init_method strings are:
//   env://                                   scheme "env"
//   tcp://10.0.0.1:29500?rank=1&world_size=4 scheme "tcp", authority "10.0.0.1:29500", query
//   file:///shared/job42/store?rank=0        scheme "file", path "/shared/job42/store"
//   cohort://coordinator:7070/job-17         scheme "cohort", authority, path "/job-17"

#include <map>
#include <string>
#include <string_view>

#include "worker/base/status.h"

namespace cohort::comm {

struct InitUrl {
  std::string text;                          // the URL as given, for error messages
  std::string scheme;                        // lower-cased, without "://"
  std::string authority;                     // "host:port" or ""; not decoded
  std::string path;                          // "/..." or "", percent-escapes decoded
  std::map<std::string, std::string> query;  // "?a=1&b=2" as {a: 1, b: 2}
};

// INVALID_ARGUMENT, quoting the URL, when it has no "scheme://", a malformed query (a parameter
// without '=', or given twice) or a bad percent-escape.
StatusOr<InitUrl> parse_init_url(std::string_view text);

struct HostPort {
  std::string host;  // brackets of an IPv6 literal removed
  int port = 0;
};

// "host:port" or "[v6addr]:port" with port in 1..65535. `url` is quoted in errors.
StatusOr<HostPort> parse_host_port(std::string_view authority, std::string_view url);

}  // namespace cohort::comm
