#include "worker/comm/init/init_url.h"

#include <algorithm>
#include <cctype>
#include <charconv>

namespace cohort::comm {
namespace {

constexpr std::string_view kSchemeSeparator = "://";
constexpr int kMaxPort = 65535;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

StatusOr<std::string> percent_decode(std::string_view text, std::string_view url) {
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out.push_back(text[i]);
      continue;
    }
    const int high = i + 2 < text.size() ? hex_digit(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? hex_digit(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      return invalid_argument_error(
          "init URL {:?}: bad percent-escape at {:?}; write %XX with two hex digits", url, text.substr(i, 3));
    }
    out.push_back(static_cast<char>(high * 16 + low));
    i += 2;
  }
  return out;
}

Status parse_query(std::string_view query, std::string_view url, std::map<std::string, std::string>* out) {
  while (!query.empty()) {
    const size_t amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;  // "a=1&&b=2", a trailing '&'
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return invalid_argument_error("init URL {:?}: query parameter {:?} is not name=value", url, item);
    }
    const std::string name(item.substr(0, eq));
    if (out->count(name) > 0) {
      return invalid_argument_error("init URL {:?}: query parameter {:?} is given twice", url, name);
    }
    COHORT_ASSIGN_OR_RETURN((*out)[name], percent_decode(item.substr(eq + 1), url));
  }
  return ok_status();
}

bool valid_scheme(std::string_view scheme) {
  return !scheme.empty() && std::isalpha(static_cast<unsigned char>(scheme[0])) &&
         std::all_of(scheme.begin(), scheme.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
         });
}

}  // namespace

StatusOr<InitUrl> parse_init_url(std::string_view text) {
  const size_t separator = text.find(kSchemeSeparator);
  if (separator == std::string_view::npos || !valid_scheme(text.substr(0, separator))) {
    return invalid_argument_error(
        "init URL {:?} has no scheme; write env://, tcp://host:port or file:///absolute/path", text);
  }
  InitUrl url;
  url.text = std::string(text);
  url.scheme = std::string(text.substr(0, separator));
  std::transform(url.scheme.begin(), url.scheme.end(), url.scheme.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::string_view rest = text.substr(separator + kSchemeSeparator.size());
  const size_t question = rest.find('?');
  if (question != std::string_view::npos) {
    COHORT_RETURN_IF_ERROR(parse_query(rest.substr(question + 1), text, &url.query));
    rest = rest.substr(0, question);
  }
  const size_t slash = rest.find('/');
  url.authority = std::string(rest.substr(0, slash));
  if (slash != std::string_view::npos) {
    COHORT_ASSIGN_OR_RETURN(url.path, percent_decode(rest.substr(slash), text));
  }
  return url;
}

StatusOr<HostPort> parse_host_port(std::string_view authority, std::string_view url) {
  HostPort out;
  std::string_view port_text;
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == std::string_view::npos || authority.substr(close + 1, 1) != ":") {
      return invalid_argument_error("init URL {:?}: {:?} is not [address]:port", url, authority);
    }
    out.host = std::string(authority.substr(1, close - 1));
    port_text = authority.substr(close + 2);
  } else {
    const size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos || authority.find(':') != colon) {
      return invalid_argument_error("init URL {:?}: {:?} has no port; write host:port (IPv6: [address]:port)",
                                    url, authority);
    }
    out.host = std::string(authority.substr(0, colon));
    port_text = authority.substr(colon + 1);
  }
  if (out.host.empty())
    return invalid_argument_error("init URL {:?}: the host is empty; write host:port", url);
  const char* end = port_text.data() + port_text.size();
  auto [ptr, ec] = std::from_chars(port_text.data(), end, out.port);
  if (port_text.empty() || ec != std::errc() || ptr != end || out.port < 1 || out.port > kMaxPort) {
    return invalid_argument_error("init URL {:?}: port {:?} is not a number in 1..{}", url, port_text,
                                  kMaxPort);
  }
  return out;
}

}  // namespace cohort::comm
