#include "worker/base/cli_flags.h"

#include <algorithm>
#include <iostream>
#include <sstream>

#include "worker/base/version.h"

namespace cohort::cli_flags {
namespace {

// Help column where option descriptions start; wide enough for "--coordinator HOST:PORT".
constexpr std::size_t kHelpColumn = 28;
// Option descriptions are wrapped to end by this column.
constexpr std::size_t kHelpWidth = 100;

// `text` with its spaces turned into newlines where a line would pass `width` (CLI11 indents what
// follows a newline to the description column).
std::string wrap(const std::string& text, std::size_t width) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  bool first_line = true;
  while (std::getline(lines, line)) {
    if (!first_line) out += '\n';
    first_line = false;
    std::istringstream words(line);
    std::string word;
    std::size_t length = 0;
    while (words >> word) {
      if (length > 0 && length + 1 + word.size() > width) {
        out += '\n';
        length = 0;
      } else if (length > 0) {
        out += ' ';
        ++length;
      }
      out += word;
      length += word.size();
    }
  }
  return out;
}

std::string lower_first(std::string text) {
  if (!text.empty() && text[0] >= 'A' && text[0] <= 'Z') text[0] = static_cast<char>(text[0] - 'A' + 'a');
  return text;
}

class CohortFormatter : public CLI::Formatter {
 public:
  CohortFormatter() {
    column_width(kHelpColumn);
    label("Usage", "usage");
    label("OPTIONS", "options");
    label("Options", "options");
    label("Positionals", "arguments");
    label("SUBCOMMAND", "COMMAND");
    label("SUBCOMMANDS", "COMMAND");
    label("Subcommands", "commands");
    label("REQUIRED", "required");
    label("Env", "env");
  }

  // Group titles in the usage line's lower case ("options:", "commands:").
  std::string make_group(std::string group, bool is_positional,
                         std::vector<const CLI::Option*> opts) const override {
    return CLI::Formatter::make_group(lower_first(group), is_positional, std::move(opts));
  }

  std::string make_option_desc(const CLI::Option* option) const override {
    return wrap(option->get_description(), kHelpWidth - kHelpColumn);
  }

  // In a list of commands, each command's first line (its summary); its own help shows the rest.
  std::string make_subcommand(const CLI::App* sub) const override {
    const std::string description = sub->get_description();
    std::ostringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true),
                             wrap(description.substr(0, description.find('\n')), kHelpWidth - kHelpColumn),
                             get_column_width());
    return out.str();
  }

  std::string make_subcommands(const CLI::App* app, CLI::AppFormatMode mode) const override {
    std::string text = CLI::Formatter::make_subcommands(app, mode);
    const std::string title = "\nSubcommands:\n";
    if (text.rfind(title, 0) == 0) text.replace(0, title.size(), "\ncommands:\n");
    return text;
  }

  std::string make_help(const CLI::App* app, std::string name, CLI::AppFormatMode mode) const override {
    if (mode == CLI::AppFormatMode::Sub) return make_expanded(app);
    std::ostringstream out;
    out << make_usage(app, name);
    const std::string description = make_description(app);
    if (!description.empty()) out << '\n' << description;
    out << make_positionals(app) << make_groups(app, mode) << make_subcommands(app, mode);
    const std::string footer = make_footer(app);
    if (!footer.empty()) out << '\n' << footer << (footer.back() == '\n' ? "" : "\n");
    return out.str();
  }
};

}  // namespace

void use_cohort_format(CLI::App* app) { app->formatter(std::make_shared<CohortFormatter>()); }

std::unique_ptr<CLI::App> make_app(const std::string& program, const std::string& description,
                                   const std::string& version) {
  auto app = std::make_unique<CLI::App>(description, program);
  use_cohort_format(app.get());
  app->set_help_flag("-h,--help", "print this help and exit");
  app->set_version_flag("--version", program + " " + (version.empty() ? kVersion : version),
                        "print the version and exit");
  return app;
}

std::string error_message(const CLI::Error& error) {
  const std::string what = error.what();
  // CLI11 names some errors after the App that threw them, so the type is asked, not get_name().
  if (dynamic_cast<const CLI::ExtrasError*>(&error) != nullptr) {
    // "The following argument was not expected: --x"
    const size_t colon = what.find(": ");
    return "unknown or unexpected argument" + std::string(what.find("arguments") != std::string::npos ? "s" : "") +
           " '" + (colon == std::string::npos ? what : what.substr(colon + 2)) + "'";
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&error) != nullptr && what.size() > 8 && what.compare(what.size() - 8, 8, " missing") == 0) {
    // "--rank: 1 required INT missing"
    return what.substr(0, what.find(':')) + " needs a value";
  }
  if (dynamic_cast<const CLI::RequiredError*>(&error) != nullptr && what.rfind(" is required") != std::string::npos) {
    return what.substr(0, what.rfind(" is required")) + " is required";
  }
  return what;
}

std::optional<int> parse(CLI::App& app, std::vector<std::string> args, std::ostream& out,
                         std::ostream& err) {
  // CLI11 consumes a reversed vector (the last argument first).
  std::reverse(args.begin(), args.end());
  try {
    app.parse(args);
  } catch (const CLI::CallForHelp&) {
    out << app.help();
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    out << app.help("", CLI::AppFormatMode::All);
    return 0;
  } catch (const CLI::CallForVersion& version) {
    out << version.what() << '\n';
    return 0;
  } catch (const CLI::ParseError& error) {
    // The innermost command that was selected names itself ("cohort submit: ...").
    std::string program = app.get_name();
    for (const CLI::App* sub = &app; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      program += " " + sub->get_name();
    }
    err << program << ": " << error_message(error) << "\nrun '" << program
        << " --help' for the options\n";
    return kExitUsage;
  }
  return std::nullopt;
}

std::optional<int> parse(CLI::App& app, int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse(app, std::move(args), std::cout, std::cerr);
}

}  // namespace cohort::cli_flags
