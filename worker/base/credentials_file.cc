#include "worker/base/credentials_file.h"

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

namespace cohort {

StatusOr<Credentials> parse_credentials(const std::string& text, const std::string& source) {
  if (text.size() > kMaxCredentialsFileBytes) {
    return invalid_argument_error("{}: {} bytes is larger than a credentials file can be ({} bytes, "
                                  "kMaxCredentialsFileBytes); is it the right file?",
                                  source, text.size(), kMaxCredentialsFileBytes);
  }
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    return invalid_argument_error("{}:{}:{}: not YAML: {}", source, error.mark.line + 1, error.mark.column + 1,
                                  error.msg);
  }
  if (!root.IsMap()) {
    return invalid_argument_error("{}: a credentials file is a YAML mapping with keys coordinator, "
                                  "ca_certificate and token",
                                  source);
  }
  static const std::set<std::string> kKeys = {"coordinator", "ca_certificate", "token"};
  Credentials credentials;
  for (const auto& entry : root) {
    std::string key;
    try {
      key = entry.first.as<std::string>();
    } catch (const YAML::Exception&) {
      return invalid_argument_error("{}:{}: keys must be strings", source, entry.first.Mark().line + 1);
    }
    if (kKeys.count(key) == 0) {
      return invalid_argument_error("{}:{}: unknown key {:?}; a credentials file has coordinator, "
                                    "ca_certificate and token",
                                    source, entry.first.Mark().line + 1, key);
    }
    if (!entry.second.IsScalar())
      return invalid_argument_error("{}:{}: {} must be a string", source, entry.second.Mark().line + 1, key);
    const std::string value = entry.second.as<std::string>();
    if (key == "coordinator") credentials.coordinator = value;
    if (key == "ca_certificate") credentials.ca_certificate = value;
    if (key == "token") credentials.token = value;
  }
  for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"coordinator", &credentials.coordinator},
                                   {"ca_certificate", &credentials.ca_certificate},
                                   {"token", &credentials.token}}) {
    if (value->empty()) return invalid_argument_error("{}: {} is missing or empty", source, key);
  }
  return credentials;
}

std::string format_credentials(const Credentials& credentials) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "coordinator" << YAML::Value << credentials.coordinator;
  out << YAML::Key << "ca_certificate" << YAML::Value << YAML::Literal << credentials.ca_certificate;
  out << YAML::Key << "token" << YAML::Value << credentials.token;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

StatusOr<Credentials> load_credentials(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return not_found_error(
        "cannot read the credentials file {:?}; pass --credentials FILE or set {} (an admin makes one with "
        "`cohort user add NAME`; the first admin's is <data_dir>/admin.credentials on the coordinator)",
        path, kCredentialsEnv);
  }
  std::ostringstream text;
  text << in.rdbuf();
  return parse_credentials(text.str(), path);
}

std::string credentials_path(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv(kCredentialsEnv); env != nullptr && *env != '\0') return env;
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return std::string(home) + "/" + kDefaultCredentialsPath;
  return "";
}

}  // namespace cohort
