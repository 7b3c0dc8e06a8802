#include "worker/examples/example_flags.h"

#include "worker/base/cli_flags.h"

namespace cohort::examples {

std::optional<int> parse_example_flags(int argc, char** argv, const std::string& program,
                                       const std::string& description, ExampleFlags& flags, ExampleFlagSet set) {
  auto app = cli_flags::make_app(program, description);
  app->add_option("--ranks", flags.ranks, "start N local ranks (processes over a file:// store)")
      ->type_name("N")
      ->check(CLI::Range(1, 1024))
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
  return cli_flags::parse(*app, argc, argv);
}

}  // namespace cohort::examples
