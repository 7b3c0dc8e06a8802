#include "worker/examples/local_ranks.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace cohort::examples {

int run_local_ranks(int argc, char** argv, int ranks, CpuBind bind) {
  // Each rank's CPUs, planned here so that the children only bind.
  auto plan = plan_local_ranks(bind, ranks);
  if (!plan.ok()) {
    std::fprintf(stderr, "run_local_ranks: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  char dir_template[] = "/tmp/cohort-example-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("run_local_ranks: mkdtemp");
    return 1;
  }
  const std::string store = std::string(dir_template) + "/store";
  std::vector<pid_t> children;
  for (int rank = 0; rank < ranks; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      // Before exec: the rank and all its threads inherit the binding.
      if (Status bound = bind_to_cpus((*plan)[rank]); !bound.ok()) {
        std::fprintf(stderr, "run_local_ranks: rank %d: %s\n", rank, bound.to_string().c_str());
        _exit(1);
      }
      std::string url = "file://" + store + "?rank=" + std::to_string(rank) + "&world_size=" + std::to_string(ranks);
      std::vector<char*> args(argv, argv + argc);
      std::string init_flag = "--init";
      args.push_back(init_flag.data());
      args.push_back(url.data());
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("run_local_ranks: execv");
      _exit(127);
    }
    if (pid < 0) {
      std::perror("run_local_ranks: fork");
      for (pid_t child : children) kill(child, SIGTERM);
      break;
    }
    children.push_back(pid);
  }
  int result = children.size() == static_cast<size_t>(ranks) ? 0 : 1;
  for (size_t done = 0; done < children.size(); ++done) {
    int status = 0;
    pid_t pid = wait(&status);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = 1;
      for (pid_t child : children) {
        if (child != pid) kill(child, SIGTERM);
      }
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_template, ignored);
  return result;
}

}  // namespace cohort::examples
