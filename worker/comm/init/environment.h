#pragma once

// The environment as init methods see it: a lookup function instead of getenv, the seam that
// lets tests hand env://, SLURM and Open MPI variables to an init method without touching the
// process's environment (which is shared by every thread of a test).

#include <functional>
#include <map>
#include <optional>
#include <string>

namespace cohort::comm {

// Returns the value of one environment variable, or nullopt when it is unset.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;

// The process environment (getenv). Thread-safe as long as nobody calls setenv concurrently.
EnvLookup process_environment();

// A fixed set of variables: for tests, or to launch with an explicit environment.
EnvLookup environment_from(std::map<std::string, std::string> variables);

}  // namespace cohort::comm
