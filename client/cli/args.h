#pragma once

// Command-line arguments of one `cohort` command: flags (`--name VALUE`, `--name=VALUE`, `-n VALUE`,
// switches without a value) and positional arguments, in any order. Unknown flags are errors that
// name the flag, so a typo never turns into a positional argument.

#include <map>
#include <set>
#include <string>
#include <vector>

#include "worker/base/status.h"

namespace cohort::client::cli {

struct FlagSpec {
  std::string name;        // "--rank"
  std::string short_name;  // "-r", or empty
  bool takes_value = false;
};

class Args {
 public:
  // Splits `args` by `specs`. INVALID_ARGUMENT naming an unknown flag or a flag missing its value.
  static StatusOr<Args> parse(const std::vector<std::string>& args, const std::vector<FlagSpec>& specs);

  // Whether the flag (by its long name) was given.
  bool has(const std::string& name) const { return given_.count(name) != 0; }
  // The flag's last value, or `fallback`.
  std::string value(const std::string& name, const std::string& fallback = "") const;
  // The flag's value as an integer in [min, max]; `fallback` when absent. INVALID_ARGUMENT otherwise.
  StatusOr<int> int_value(const std::string& name, int fallback, int min, int max) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::set<std::string> given_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> positional_;
};

}  // namespace cohort::client::cli
