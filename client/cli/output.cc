#include "client/cli/output.h"

#include <algorithm>
#include <cctype>
#include <ctime>

#include <fmt/format.h>
#include <google/protobuf/util/json_util.h>
#include <yaml-cpp/yaml.h>

namespace cohort::client::cli {

std::string to_json(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  // Zero counts (free_slots: 0, attempt numbers) are information, not noise.
  options.always_print_primitive_fields = true;
  std::string json;
  auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return fmt::format("{{\"error\": {}}}\n", json_quote(std::string(status.message())));
  if (json.empty() || json.back() != '\n') json += '\n';
  return json;
}

namespace {

// Whether a plain (unquoted) YAML scalar `text` would read back as something other than a string.
bool needs_quotes(const std::string& text) {
  if (text.empty()) return true;
  try {
    YAML::Node node = YAML::Load(text);
    if (!node.IsScalar() || node.Scalar() != text) return true;
    // Booleans, nulls and numbers in any of YAML's spellings.
    bool b = false;
    double d = 0;
    if (YAML::convert<bool>::decode(node, b) || YAML::convert<double>::decode(node, d)) return true;
    if (text == "~" || text == "null" || text == "Null" || text == "NULL") return true;
  } catch (const YAML::Exception&) {
    return true;
  }
  return text.front() == ' ' || text.back() == ' ' || text.find('\n') != std::string::npos;
}

void emit_yaml(YAML::Emitter& out, const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      out << YAML::BeginMap;
      for (const auto& entry : node) {
        out << YAML::Key << entry.first.Scalar() << YAML::Value;
        emit_yaml(out, entry.second);
      }
      out << YAML::EndMap;
      break;
    case YAML::NodeType::Sequence:
      out << YAML::BeginSeq;
      for (const auto& item : node) emit_yaml(out, item);
      out << YAML::EndSeq;
      break;
    case YAML::NodeType::Scalar:
      // A quoted JSON scalar (tag "!") is a string: keep it one. Numbers and booleans stay plain.
      if (node.Tag() == "!" && needs_quotes(node.Scalar())) {
        out << YAML::DoubleQuoted << node.Scalar();
      } else {
        out << node.Scalar();
      }
      break;
    default:
      out << YAML::Null;
  }
}

}  // namespace

std::string json_to_yaml(const std::string& json) {
  YAML::Node root;
  try {
    root = YAML::Load(json);  // JSON is YAML
  } catch (const YAML::Exception& e) {
    return fmt::format("error: {}\n", json_quote(e.what()));
  }
  YAML::Emitter out;
  out.SetIndent(2);
  emit_yaml(out, root);
  std::string text = out.c_str();
  if (text.empty() || text.back() != '\n') text += '\n';
  return text;
}

void print_structured(const CommandContext& context, const std::string& json) {
  *context.out << (context.format == OutputFormat::kYaml ? json_to_yaml(json) : json);
}

namespace {

// The length of the well-formed UTF-8 sequence at the start of `bytes` (1 to 4); 0 when it is not
// well formed; -1 when it is a well-formed start that `bytes` cuts short.
int utf8_sequence_length(std::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the allowed range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong
    if (lead == 0xED) high = 0x9F;  // surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong
    if (lead == 0xF4) high = 0x8F;  // beyond U+10FFFF
  } else {
    return 0;
  }
  for (size_t i = 1; i < static_cast<size_t>(length); ++i) {
    if (i >= bytes.size()) return -1;
    const unsigned char lo = i == 1 ? low : 0x80, hi = i == 1 ? high : 0xBF;
    if (byte(i) < lo || byte(i) > hi) return 0;
  }
  return length;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view bytes) {
  // A sequence is at most 4 bytes: only a lead byte among the last 3 can start a cut one.
  const size_t first = bytes.size() > 3 ? bytes.size() - 3 : 0;
  for (size_t i = bytes.size(); i > first; --i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i - 1]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    return utf8_sequence_length(bytes.substr(i - 1)) == -1 ? i - 1 : bytes.size();
  }
  return bytes.size();
}

std::string json_quote(const std::string& text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x80) {
      // JSON must be valid UTF-8: copy well-formed sequences, U+FFFD for each stray byte.
      const int length = utf8_sequence_length(std::string_view(text).substr(i));
      if (length > 0) {
        out.append(text, i, static_cast<size_t>(length));
        i += static_cast<size_t>(length);
      } else {
        out += "\\ufffd";
        ++i;
      }
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += fmt::format("\\u{:04x}", c);
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  return out + "\"";
}

void print_table(std::ostream& out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths(header.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (size_t i = 0; i < row.size() && i < widths.size(); ++i)
      widths[i] = std::max(widths[i], row[i].size());
  };
  measure(header);
  for (const auto& row : rows) measure(row);
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      if (i + 1 < row.size()) {
        line += row[i] + std::string(widths[i] - row[i].size() + 2, ' ');
      } else {
        line += row[i];
      }
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
}

std::string state_name(cohort::v1::JobState state) { return cohort::v1::JobState_Name(state); }

bool is_final_state(cohort::v1::JobState state) {
  return state == cohort::v1::SUCCEEDED || state == cohort::v1::FAILED || state == cohort::v1::CANCELLED;
}

StatusOr<cohort::v1::JobState> parse_state(const std::string& name) {
  std::string upper = name;
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) { return std::toupper(c); });
  cohort::v1::JobState state;
  if (upper != "JOB_STATE_UNSPECIFIED" && cohort::v1::JobState_Parse(upper, &state)) return state;
  return invalid_argument_error(
      "unknown job state '{}'; use pending, placed, running, succeeded, failed or cancelled", name);
}

std::string format_time(const google::protobuf::Timestamp& time) {
  if (time.seconds() == 0 && time.nanos() == 0) return "-";
  const std::time_t seconds = static_cast<std::time_t>(time.seconds());
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char buffer[64];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return buffer;
}

std::string format_duration(int64_t seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds >= 3600) return fmt::format("{}h{:02}m", seconds / 3600, (seconds % 3600) / 60);
  if (seconds >= 60) return fmt::format("{}m{:02}s", seconds / 60, seconds % 60);
  return fmt::format("{}s", seconds);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

int report_error(const CommandContext& context, const Status& status) {
  // Who-may-do-what refusals name their kind, so a user tells "who are you?" (UNAUTHENTICATED:
  // credentials missing, wrong or revoked) from "not yours" (PERMISSION_DENIED).
  const bool access = status.code() == StatusCode::kUnauthenticated || status.code() == StatusCode::kPermissionDenied;
  *context.err << "cohort: " << (access ? std::string(status_code_name(status.code())) + ": " : "")
               << status.message() << '\n';
  return kExitFailure;
}

int usage_error(const CommandContext& context, const std::string& command, const std::string& message) {
  *context.err << "cohort " << command << ": " << message << "\nsee `cohort " << command << " --help`\n";
  return kExitUsage;
}

}  // namespace cohort::client::cli
