#pragma once

// cohort's one flag library: CLI11 (Debian's libcli11-dev, header-only) with the shape every cohort
// binary shares: a help page that reads "usage: ...", then the description, the arguments and options
// (each with its default and its environment variable), then the footer (examples); `--version`
// printing "<program> <version>"; errors printed as "<program>: <what is wrong>" with a pointer to
// --help; exit status 2 for any command line that cannot be run (0 after --help/--version).
// Environment fallbacks are CLI11's: `option->envname("COHORT_X")` (a flag on the line wins).
// Name an option's value with `->type_name("HOST:PORT")` (option_text would hide the env variable);
// descriptions are wrapped; a subcommand's description is listed by its first line only (its own
// --help prints all of it), so write "summary\n\nmore text".
//
//   auto app = cohort::cli_flags::make_app("cohortd", "cohortd runs on every node of a cluster.");
//   std::string config;
//   app->add_option("--config", config, "read settings from a YAML file")->envname("COHORTD_CONFIG");
//   app->footer("examples:\n  cohortd --config /etc/cohort/cohortd.yaml");
//   if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return *exit;
//   ... run with `config` ...
//
// The header includes <CLI/CLI.hpp>; depend on //worker/base:cli_flags (which carries
// //third_party:cli11) to use CLI11 directly.

#include <CLI/CLI.hpp>

#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace cohort::cli_flags {

// Exit status of a command line that cannot be run (as getopt-based tools use).
inline constexpr int kExitUsage = 2;

// An App named `program` with cohort's help formatter, -h/--help, --version ("<program> 0.1.0", or
// `version` when given) and `description` printed under the usage line.
std::unique_ptr<CLI::App> make_app(const std::string& program, const std::string& description,
                                   const std::string& version = "");

// Gives `app` (and the subcommands added to it afterwards) cohort's help formatter. make_app does
// this; call it for an App made another way.
void use_cohort_format(CLI::App* app);

// Parses `args` (without argv[0]) into `app`. std::nullopt: parsed, go on. Otherwise the exit status,
// with the output already written: 0 after --help (to `out`) or --version (to `out`); kExitUsage
// after "<program>: <error>\nrun '<program> --help' for the options\n" (to `err`).
std::optional<int> parse(CLI::App& app, std::vector<std::string> args, std::ostream& out,
                         std::ostream& err);
// The same over main's argv, writing to std::cout / std::cerr.
std::optional<int> parse(CLI::App& app, int argc, const char* const* argv);

// The message of a CLI11 parse error in cohort's words ("unknown option '--x'", "--rank needs a
// value", ...); CLI11's own text for the rest.
std::string error_message(const CLI::Error& error);

}  // namespace cohort::cli_flags
