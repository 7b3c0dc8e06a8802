// cohort completion bash

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"
#include "worker/base/version.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Prints a bash completion script for cohort: it completes commands, their options, -o formats,\n"
    "--state values, job files, and job ids (asking the coordinator with `cohort list -o json`, with the\n"
    "--coordinator and --credentials already on the line; quietly, and at most every few seconds).\n"
    "The script is made from the command definitions, so it always matches this binary.";

constexpr const char* kFooter = R"(examples:
  source <(cohort completion bash)                    # this shell
  cohort completion bash > ~/.local/share/bash-completion/completions/cohort
)";

// Long and short names of an option ("--follow", "-f").
std::vector<std::string> option_names(const CLI::Option* option) {
  std::vector<std::string> names;
  for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
  for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  return names;
}

std::string join(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& word : words) text += (text.empty() ? "" : " ") + word;
  return text;
}

// The option names of `app` that take no value and those that do.
void collect_options(const CLI::App* app, std::vector<std::string>* flags, std::vector<std::string>* valued) {
  for (const CLI::Option* option : app->get_options()) {
    if (option->get_positional() && option->get_lnames().empty() && option->get_snames().empty()) continue;
    for (const std::string& name : option_names(option)) (option->get_items_expected_max() == 0 ? flags : valued)->push_back(name);
  }
}

std::string bash_script(const CLI::App* root) {
  std::vector<std::string> global_flags, global_valued;
  collect_options(root, &global_flags, &global_valued);
  std::vector<std::string> commands, valued_all = global_valued;
  std::string per_command;  // case arms: the options and words each command completes
  for (const CLI::App* sub : root->get_subcommands([](const CLI::App*) { return true; })) {
    commands.push_back(sub->get_name());
    std::vector<std::string> flags, valued;
    collect_options(sub, &flags, &valued);
    valued_all.insert(valued_all.end(), valued.begin(), valued.end());
    std::vector<std::string> words;  // nested commands (user add, node token)
    std::string positional = "none";
    for (const CLI::App* nested : sub->get_subcommands([](const CLI::App*) { return true; })) {
      words.push_back(nested->get_name());
      collect_options(nested, &flags, &valued);
      valued_all.insert(valued_all.end(), valued.begin(), valued.end());
    }
    for (const CLI::Option* option : sub->get_options()) {
      if (!option->get_positional()) continue;
      if (option->get_name() == "JOB") positional = "job";
      if (option->get_name() == "JOB.yaml") positional = "file";
    }
    std::sort(flags.begin(), flags.end());
    flags.erase(std::unique(flags.begin(), flags.end()), flags.end());
    flags.insert(flags.end(), valued.begin(), valued.end());
    per_command += fmt::format("    {}) options=\"{}\"; words=\"{}\"; positional={} ;;\n", sub->get_name(),
                               join(flags), join(words), positional);
  }
  std::sort(valued_all.begin(), valued_all.end());
  valued_all.erase(std::unique(valued_all.begin(), valued_all.end()), valued_all.end());
  std::string valued_pattern;
  for (const std::string& name : valued_all) valued_pattern += (valued_pattern.empty() ? "" : "|") + name;

  return fmt::format(R"SCRIPT(# bash completion for cohort, from `cohort completion bash` ({version}).
#   source <(cohort completion bash)

# Sets _cohort_ids to the job ids: `cohort list -o json` against the coordinator and credentials on
# the line, quietly (stderr dropped, 5 s at most), remembered for 5 s.
_cohort_job_ids() {{
  local -a args=()
  local i
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      --coordinator|--credentials) args+=("${{COMP_WORDS[i]}}" "${{COMP_WORDS[i+1]-}}"); ((i++)) ;;
      --coordinator=*|--credentials=*) args+=("${{COMP_WORDS[i]}}") ;;
    esac
  done
  local key="${{args[*]}}"
  if [[ -z "${{_cohort_ids_time-}}" || "$key" != "${{_cohort_ids_key-}}" ||
        $((SECONDS - _cohort_ids_time)) -ge 5 ]]; then
    _cohort_ids=$(timeout 5 "${{COMP_WORDS[0]}}" "${{args[@]}}" list -o json 2>/dev/null |
      sed -n 's/^ *"id": "\([^"]*\)",\{{0,1\}}$/\1/p')
    _cohort_ids_key="$key"
    _cohort_ids_time=$SECONDS
  fi
}}

_cohort() {{
  # Safe under `set -u` too: every expansion that may be unset has a default.
  local cur="${{COMP_WORDS[COMP_CWORD]-}}" prev="${{COMP_WORDS[COMP_CWORD-1]-}}"
  local global_options="{global}"
  local command="" nested="" i
  COMPREPLY=()
  for ((i = 1; i < COMP_CWORD; i++)); do
    case "${{COMP_WORDS[i]}}" in
      {valued}) ((i++)) ;;
      -*) ;;
      *) if [[ -z "$command" ]]; then command="${{COMP_WORDS[i]}}"; elif [[ -z "$nested" ]]; then nested="${{COMP_WORDS[i]}}"; fi ;;
    esac
  done
  case "$prev" in
    -o|--output) COMPREPLY=($(compgen -W "human wide json yaml csv" -- "$cur")); return ;;
    --state) COMPREPLY=($(compgen -W "pending placed running succeeded failed cancelled" -- "$cur")); return ;;
    --credentials|--data-dir|--worker) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- "$cur")); return ;;
    {valued}) return ;;
  esac
  if [[ -z "$command" ]]; then
    if [[ "$cur" == -* ]]; then
      COMPREPLY=($(compgen -W "$global_options" -- "$cur"))
    else
      COMPREPLY=($(compgen -W "{commands}" -- "$cur"))
    fi
    return
  fi
  local options="" words="" positional=none
  case "$command" in
{per_command}  esac
  if [[ "$cur" == -* ]]; then
    COMPREPLY=($(compgen -W "$options $global_options" -- "$cur"))
  elif [[ -n "$words" && -z "$nested" ]]; then
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
  elif [[ "$positional" == job ]]; then
    _cohort_job_ids
    COMPREPLY=($(compgen -W "${{_cohort_ids-}}" -- "$cur"))
  elif [[ "$positional" == file ]]; then
    compopt -o filenames 2>/dev/null
    COMPREPLY=($(compgen -f -X '!*.y*ml' -- "$cur") $(compgen -d -- "$cur"))
  fi
}}

complete -F _cohort cohort
)SCRIPT",
                     fmt::arg("version", kVersion), fmt::arg("global", join(global_flags) + " " + join(global_valued)),
                     fmt::arg("valued", valued_pattern), fmt::arg("commands", join(commands)),
                     fmt::arg("per_command", per_command));
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  app->require_subcommand(1);
  CLI::App* bash = app->add_subcommand("bash", "the script for bash (bash-completion not required)");
  return [app, bash](const CommandContext& context) {
    if (!bash->parsed()) return usage_error(context, "completion", "name a shell: cohort completion bash");
    *context.out << bash_script(app->get_parent());
    return kExitOk;
  };
}

}  // namespace

const Command kCompletionCommand = {"completion", "print a shell completion script (bash)", define};

}  // namespace cohort::client::commands
