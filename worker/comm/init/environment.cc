#include "worker/comm/init/environment.h"

#include <cstdlib>
#include <memory>

namespace cohort::comm {

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

EnvLookup environment_from(std::map<std::string, std::string> variables) {
  // Shared so copies of the lookup (InitOptions is copied freely) share one map.
  auto shared = std::make_shared<const std::map<std::string, std::string>>(std::move(variables));
  return [shared](const std::string& name) -> std::optional<std::string> {
    auto it = shared->find(name);
    if (it == shared->end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace cohort::comm
