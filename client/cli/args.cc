#include "client/cli/args.h"

#include <cerrno>
#include <cstdlib>

namespace cohort::client::cli {

StatusOr<Args> Args::parse(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs) {
  Args parsed;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      parsed.positional_.push_back(arg);
      continue;
    }
    if (arg == "--") {
      parsed.positional_.insert(parsed.positional_.end(), args.begin() + static_cast<long>(i) + 1,
                                args.end());
      break;
    }
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const FlagSpec* spec = nullptr;
    for (const FlagSpec& candidate : specs) {
      if (candidate.name == name || (!candidate.short_name.empty() && candidate.short_name == name))
        spec = &candidate;
    }
    if (spec == nullptr) return invalid_argument_error("unknown option '{}'", name);
    parsed.given_.insert(spec->name);
    if (!spec->takes_value) {
      if (eq != std::string::npos) return invalid_argument_error("option {} takes no value", spec->name);
      continue;
    }
    if (eq != std::string::npos) {
      parsed.values_[spec->name] = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      parsed.values_[spec->name] = args[++i];
    } else {
      return invalid_argument_error("option {} needs a value", spec->name);
    }
  }
  return parsed;
}

std::string Args::value(const std::string& name, const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second;
}

StatusOr<int> Args::int_value(const std::string& name, int fallback, int min, int max) const {
  auto it = values_.find(name);
  if (it == values_.end()) return fallback;
  errno = 0;
  char* end = nullptr;
  const long value = std::strtol(it->second.c_str(), &end, 10);
  if (it->second.empty() || *end != '\0' || errno != 0 || value < min || value > max) {
    return invalid_argument_error("{} '{}' is not a number in {}..{}", name, it->second, min, max);
  }
  return static_cast<int>(value);
}

}  // namespace cohort::client::cli
