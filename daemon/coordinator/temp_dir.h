#pragma once

// TempDir: a fresh directory from mkdtemp for one test, removed with everything in it afterwards.

#include <stdlib.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace cohort::coordinator::testing {

class TempDir {
 public:
  TempDir() {
    // TEST_TMPDIR is Bazel's per-test scratch space; /tmp when run by hand.
    const char* base = std::getenv("TEST_TMPDIR");
    std::string pattern = std::string(base != nullptr ? base : "/tmp") + "/cohort-coordinator-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    path_ = pattern;
    // mkdtemp's 0700 would shut out the unprivileged user that an agent running as root (as tests
    // do in CI) runs jobs as: it must pass through a data directory to its job directory, and
    // execute test workers written here. 0711 is searchable, not listable, like cohortd's own.
    if (chmod(path_.c_str(), 0711) != 0) {
      std::perror("chmod");
      std::abort();
    }
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace cohort::coordinator::testing
