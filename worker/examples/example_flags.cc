#include "worker/examples/example_flags.h"

#include <cstdio>
#include <cstdlib>

#include "worker/base/cli_flags.h"
#include "worker/base/cpu_binding.h"

namespace cohort::examples {

std::optional<int> parse_example_flags(int argc, char** argv, const std::string& program,
                                       const std::string& description, ExampleFlags& flags, ExampleFlagSet set) {
  auto app = cli_flags::make_app(program, description);
  app->add_option("--ranks", flags.ranks, "start N local ranks (processes over a file:// store)")
      ->type_name("N")
      ->check(CLI::Range(1, 1024))
      ->capture_default_str();
  if (const char* env = std::getenv(kCpuBindEnv); env != nullptr && *env != '\0') flags.cpu_bind = env;
  app->add_option("--cpu-bind", flags.cpu_bind,
                  "--ranks' processes: core binds each to its own share of the CPUs, auto does so only "
                  "when there is a CPU per rank, none leaves them to the scheduler; COHORT_CPU_BIND too")
      ->type_name("B")
      ->check(CLI::IsMember({"none", "core", "auto"}))
      ->capture_default_str();
  app->add_option("--init", flags.init,
                  "join a job instead: env://, tcp://host:port?rank=R&world_size=N, file:///path?rank=R&world_size=N")
      ->type_name("URL");
  app->add_option("--kind", flags.kind, "communicator kind (flat, naive, hierarchical, ...)")
      ->type_name("KIND")
      ->capture_default_str();
  app->add_option("--epochs", flags.epochs, "passes over the training set")
      ->type_name("E")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app->add_option("--limit", flags.limit, "use only the first N training and test samples (0: all)")
      ->type_name("N")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  if (set.max_steps) {
    app->add_option("--max-steps", flags.max_steps, "stop after S optimizer steps in all (0: no cap)")
        ->type_name("S")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
  }
  if (set.double_buffering) {
    app->add_flag("--double-buffering", flags.double_buffering,
                  "apply each step's averaged gradient one step later, so its allreduce overlaps the next "
                  "step's forward and backward");
  }
  std::optional<int> exit = cli_flags::parse(*app, argc, argv);
  if (exit) return exit;
  // Checked before any rank starts (a bad COHORT_CPU_BIND, or core with more ranks than CPUs).
  auto bind = parse_cpu_bind(flags.cpu_bind);
  Status status = bind.status();
  if (status.ok() && flags.init.empty()) status = plan_local_ranks(*bind, flags.ranks).status();
  if (!status.ok()) {
    std::fprintf(stderr, "%s: %s\n", program.c_str(), status.message().c_str());
    return cli_flags::kExitUsage;
  }
  return std::nullopt;
}

}  // namespace cohort::examples
