#include "client/job_spec_yaml.h"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <yaml-cpp/yaml.h>

namespace cohort::client {
namespace {

namespace pb = google::protobuf;

// A key closer than this (edits) to a valid one gets a "did you mean" hint.
constexpr size_t kMaxSuggestionDistance = 2;

// ---- text ------------------------------------------------------------------------------------

// Whether `text` is well-formed UTF-8 (no stray continuation bytes, overlong forms, surrogates or
// code points past U+10FFFF). Proto3 string fields hold UTF-8 only: a spec with other bytes would
// be refused later, on the wire, by an error that names neither the file nor the field (found by
// tests/fuzz/job_spec_yaml_fuzzer.cc).
bool is_valid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    const auto lead = static_cast<unsigned char>(text[i]);
    size_t length = 1;
    uint32_t code = lead;
    uint32_t smallest = 0;
    if (lead < 0x80) {
      ++i;
      continue;
    } else if ((lead & 0xE0) == 0xC0) {
      length = 2, code = lead & 0x1F, smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3, code = lead & 0x0F, smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4, code = lead & 0x07, smallest = 0x10000;
    } else {
      return false;
    }
    if (text.size() - i < length) return false;
    for (size_t k = 1; k < length; ++k) {
      const auto next = static_cast<unsigned char>(text[i + k]);
      if ((next & 0xC0) != 0x80) return false;
      code = (code << 6) | (next & 0x3F);
    }
    if (code < smallest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return false;
    i += length;
  }
  return true;
}

// ---- enum names ------------------------------------------------------------------------------

// "DatasetKind" → "DATASET_KIND_": the prefix proto style puts on an enum's values, stripped in YAML.
std::string enum_value_prefix(const pb::EnumDescriptor* type) {
  std::string prefix;
  for (char c : type->name()) {
    if (std::isupper(static_cast<unsigned char>(c)) && !prefix.empty()) prefix += '_';
    prefix += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return prefix + "_";
}

bool is_unspecified(const pb::EnumValueDescriptor* value) {
  const std::string& name = value->name();
  constexpr std::string_view kSuffix = "_UNSPECIFIED";
  return value->number() == 0 && name.size() >= kSuffix.size() &&
         name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

// The YAML spelling of an enum value: FASHION_MNIST → fashion_mnist, DATASET_KIND_X → x.
std::string yaml_enum_name(const pb::EnumValueDescriptor* value) {
  std::string name = value->name();
  const std::string prefix = enum_value_prefix(value->type());
  if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0)
    name = name.substr(prefix.size());
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name;
}

// The values a YAML file may name, in declaration order (the unspecified zero value excluded).
std::vector<std::string> yaml_enum_names(const pb::EnumDescriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->value_count(); ++i) {
    if (!is_unspecified(type->value(i))) names.push_back(yaml_enum_name(type->value(i)));
  }
  return names;
}

// ---- small helpers ---------------------------------------------------------------------------

std::string node_kind(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null:
      return "nothing (null)";
    case YAML::NodeType::Scalar:
      return fmt::format("'{}'", node.Scalar());
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a mapping";
    default:
      return "an undefined node";
  }
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> field_names(const pb::Descriptor* type) {
  std::vector<std::string> names;
  for (int i = 0; i < type->field_count(); ++i) names.push_back(type->field(i)->name());
  return names;
}

std::string child_path(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

const char* scalar_expectation(const pb::FieldDescriptor* field) {
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return "a whole number such as 3";
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return "a non-negative whole number such as 3";
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      return "a number such as 0.05";
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return "true or false";
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return "a string";
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      return "one name";
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return "a mapping";
  }
  return "a value";
}

template <typename Int>
std::optional<Int> parse_integer(const std::string& text) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  Int value{};
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) return std::nullopt;
  return value;
}

// YAML's floats: decimal/exponent forms and .inf / -.inf / .nan (any case).
std::optional<double> parse_double(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == ".inf" || lower == "+.inf") return std::numeric_limits<double>::infinity();
  if (lower == "-.inf") return -std::numeric_limits<double>::infinity();
  if (lower == ".nan") return std::numeric_limits<double>::quiet_NaN();
  if (lower.empty() || lower == "inf" || lower == "-inf" || lower == "nan" ||
      lower.find("0x") != std::string::npos)
    return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || errno == ERANGE) return std::nullopt;
  return value;
}

// YAML 1.1's booleans, as yaml-cpp reads them.
std::optional<bool> parse_bool(const std::string& text) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "true" || lower == "yes" || lower == "on" || lower == "y") return true;
  if (lower == "false" || lower == "no" || lower == "off" || lower == "n") return false;
  return std::nullopt;
}

// ---- reading ---------------------------------------------------------------------------------

// Walks a YAML tree alongside a message's descriptor, setting fields through reflection and
// collecting every problem with its place in the file.
class Reader {
 public:
  explicit Reader(std::string_view file_name) : file_name_(file_name) {}

  void read_message(const YAML::Node& node, pb::Message* message, const std::string& path);

  template <typename... Args>
  void error(const YAML::Mark& mark, const std::string& path, fmt::format_string<Args...> format,
             Args&&... args) {
    std::string text = fmt::format(format, std::forward<Args>(args)...);
    std::string where = file_name_;
    if (!mark.is_null()) where += fmt::format(":{}:{}", mark.line + 1, mark.column + 1);
    problems_.push_back(path.empty() ? fmt::format("{}: {}", where, text)
                                     : fmt::format("{}: {}: {}", where, path, text));
  }

  Status status() const {
    if (problems_.empty()) return ok_status();
    return invalid_argument_error("{}", fmt::join(problems_, "\n"));
  }

  // One field's value into `message` (a scalar, a list, a mapping, as the field takes).
  void read_field(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                  const pb::FieldDescriptor* field, const std::string& path);

 private:
  void read_map(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                const pb::FieldDescriptor* field, const std::string& path);
  // One scalar into a singular field (index < 0) or appended to a repeated one.
  void read_scalar(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                   const pb::FieldDescriptor* field, const std::string& path);
  void unknown_key(const YAML::Node& key, const pb::Descriptor* type, const std::string& path);

  std::string file_name_;
  std::vector<std::string> problems_;
};

// The mark of `node`, or `fallback` for nodes yaml-cpp does not place (an empty value after a key).
YAML::Mark mark_of(const YAML::Node& node, const YAML::Mark& fallback) {
  const YAML::Mark mark = node.Mark();
  return mark.is_null() ? fallback : mark;
}

void Reader::unknown_key(const YAML::Node& key, const pb::Descriptor* type, const std::string& path) {
  const std::string name = key.Scalar();
  const std::vector<std::string> valid = field_names(type);
  std::string hint;
  size_t best = kMaxSuggestionDistance + 1;
  for (const std::string& candidate : valid) {
    const size_t distance = edit_distance(name, candidate);
    if (distance < best) {
      best = distance;
      hint = fmt::format(" (did you mean '{}'?)", candidate);
    }
  }
  error(key.Mark(), path, "unknown key '{}'{}; the keys of {} are: {}", name, hint,
        path.empty() ? std::string("a job spec") : "'" + path + "'", fmt::join(valid, ", "));
}

void Reader::read_message(const YAML::Node& node, pb::Message* message, const std::string& path) {
  const pb::Descriptor* type = message->GetDescriptor();
  if (node.IsNull()) return;  // `checkpoint:` with nothing under it: the message at its defaults
  if (!node.IsMap()) {
    error(node.Mark(), path, "{} is not a mapping; expected keys such as {}", node_kind(node),
          fmt::join(field_names(type), ", "));
    return;
  }
  // Field name → where it was first given, to report duplicates and oneof conflicts.
  std::map<std::string, YAML::Mark> seen;
  std::map<const pb::OneofDescriptor*, std::string> oneof_member;
  for (auto it = node.begin(); it != node.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      error(key.Mark(), path, "a key is {}; keys are field names such as {}", node_kind(key),
            fmt::join(field_names(type), ", "));
      continue;
    }
    const std::string name = key.Scalar();
    const pb::FieldDescriptor* field = type->FindFieldByName(name);
    if (field == nullptr) {
      unknown_key(key, type, path);
      continue;
    }
    const std::string field_path = child_path(path, name);
    if (auto [first, inserted] = seen.emplace(name, key.Mark()); !inserted) {
      error(key.Mark(), field_path, "is given twice (first on line {}); keep one", first->second.line + 1);
      continue;
    }
    if (const pb::OneofDescriptor* oneof = field->real_containing_oneof(); oneof != nullptr) {
      auto [other, inserted] = oneof_member.emplace(oneof, name);
      if (!inserted) {
        error(key.Mark(), field_path,
              "{} and {} are both set, but a spec takes only one of them (oneof {}); remove one",
              other->second, name, oneof->name());
        continue;
      }
    }
    read_field(value, mark_of(value, key.Mark()), message, field, field_path);
  }
}

void Reader::read_field(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                        const pb::FieldDescriptor* field, const std::string& path) {
  const pb::Reflection* reflection = message->GetReflection();
  const bool is_message = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
  if (field->is_map()) return read_map(value, mark, message, field, path);
  if (!field->is_repeated()) {
    if (is_message) {
      // Mutable even when null, so `data_parallel:` alone still selects the oneof member.
      read_message(value, reflection->MutableMessage(message, field), path);
    } else if (!value.IsNull()) {
      read_scalar(value, mark, message, field, path);
    }
    return;
  }
  if (value.IsNull()) return;  // `rank_in:` / `rank_in: null`: empty
  if (value.IsSequence()) {
    for (size_t i = 0; i < value.size(); ++i) {
      const YAML::Node element = value[i];
      const std::string element_path = fmt::format("{}[{}]", path, i);
      if (is_message) {
        read_message(element, reflection->AddMessage(message, field), element_path);
      } else if (element.IsNull()) {
        error(mark_of(element, mark), element_path, "is null; expected {}", scalar_expectation(field));
      } else {
        read_scalar(element, mark_of(element, mark), message, field, element_path);
      }
    }
    return;
  }
  if (is_message) {
    error(mark, path, "{} is not a list; expected a list of mappings (one per entry, '- key: value')",
          node_kind(value));
    return;
  }
  read_scalar(value, mark, message, field, path);  // a single value stands for a one-element list
}

// A proto map (`env`) is a YAML mapping of scalar keys to scalar values; a key given twice is an
// error rather than a silent last-one-wins.
void Reader::read_map(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                      const pb::FieldDescriptor* field, const std::string& path) {
  if (value.IsNull()) return;
  if (!value.IsMap()) {
    error(mark, path, "{} is not a mapping; write one `NAME: value` per line under {}", node_kind(value),
          field->name());
    return;
  }
  const pb::FieldDescriptor* key_field = field->message_type()->map_key();
  const pb::FieldDescriptor* value_field = field->message_type()->map_value();
  std::map<std::string, YAML::Mark> seen;
  for (auto it = value.begin(); it != value.end(); ++it) {
    const YAML::Node key = it->first;
    const YAML::Node item = it->second;
    if (!key.IsScalar()) {
      error(mark_of(key, mark), path, "a key is {}; keys are names", node_kind(key));
      continue;
    }
    const std::string entry_path = fmt::format("{}.{}", path, key.Scalar());
    if (auto [first, inserted] = seen.emplace(key.Scalar(), key.Mark()); !inserted) {
      error(key.Mark(), entry_path, "is given twice (first on line {}); keep one", first->second.line + 1);
      continue;
    }
    if (item.IsNull()) {
      error(mark_of(item, key.Mark()), entry_path, "has no value; write `{}: \"\"` for an empty one", key.Scalar());
      continue;
    }
    pb::Message* entry = message->GetReflection()->AddMessage(message, field);
    read_scalar(key, mark_of(key, mark), entry, key_field, entry_path);
    read_scalar(item, mark_of(item, key.Mark()), entry, value_field, entry_path);
  }
}

void Reader::read_scalar(const YAML::Node& value, const YAML::Mark& mark, pb::Message* message,
                         const pb::FieldDescriptor* field, const std::string& path) {
  const pb::Reflection* reflection = message->GetReflection();
  const bool repeated = field->is_repeated();
  if (!value.IsScalar()) {
    std::string expected = scalar_expectation(field);
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_ENUM) {
      expected = fmt::format("one of {}", fmt::join(yaml_enum_names(field->enum_type()), ", "));
    }
    error(mark, path, "{} is not a single value; expected {}{}", node_kind(value), expected,
          repeated ? " or a list of them" : "");
    return;
  }
  const std::string& text = value.Scalar();
  auto wrong_type = [&] { error(mark, path, "'{}' is not {}", text, scalar_expectation(field)); };

  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      const auto parsed = parse_integer<int64_t>(text);
      if (!parsed) return wrong_type();
      if (*parsed < std::numeric_limits<int32_t>::min() || *parsed > std::numeric_limits<int32_t>::max()) {
        return error(mark, path, "'{}' is out of range; expected a 32-bit whole number ({} .. {})", text,
                     std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max());
      }
      const auto v = static_cast<int32_t>(*parsed);
      return repeated ? reflection->AddInt32(message, field, v) : reflection->SetInt32(message, field, v);
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      const auto parsed = parse_integer<int64_t>(text);
      if (!parsed) {
        if (parse_integer<uint64_t>(text)) {
          return error(mark, path, "'{}' is out of range; expected a 64-bit whole number", text);
        }
        return wrong_type();
      }
      return repeated ? reflection->AddInt64(message, field, *parsed)
                      : reflection->SetInt64(message, field, *parsed);
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32:
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      if (!text.empty() && text.front() == '-' && parse_integer<int64_t>(text)) {
        return error(mark, path, "'{}' is negative; expected {}", text, scalar_expectation(field));
      }
      const auto parsed = parse_integer<uint64_t>(text);
      if (!parsed) return wrong_type();
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT32) {
        if (*parsed > std::numeric_limits<uint32_t>::max()) {
          return error(mark, path, "'{}' is out of range; expected at most {}", text,
                       std::numeric_limits<uint32_t>::max());
        }
        const auto v = static_cast<uint32_t>(*parsed);
        return repeated ? reflection->AddUInt32(message, field, v) : reflection->SetUInt32(message, field, v);
      }
      return repeated ? reflection->AddUInt64(message, field, *parsed)
                      : reflection->SetUInt64(message, field, *parsed);
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const auto parsed = parse_double(text);
      if (!parsed) return wrong_type();
      if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_FLOAT) {
        const auto v = static_cast<float>(*parsed);
        return repeated ? reflection->AddFloat(message, field, v) : reflection->SetFloat(message, field, v);
      }
      return repeated ? reflection->AddDouble(message, field, *parsed)
                      : reflection->SetDouble(message, field, *parsed);
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      const auto parsed = parse_bool(text);
      if (!parsed) return wrong_type();
      return repeated ? reflection->AddBool(message, field, *parsed)
                      : reflection->SetBool(message, field, *parsed);
    }
    case pb::FieldDescriptor::CPPTYPE_STRING:
      if (field->type() == pb::FieldDescriptor::TYPE_STRING && !is_valid_utf8(text)) {
        return error(mark, path, "the value is not valid UTF-8; write the file in UTF-8");
      }
      return repeated ? reflection->AddString(message, field, text)
                      : reflection->SetString(message, field, text);
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor* type = field->enum_type();
      for (int i = 0; i < type->value_count(); ++i) {
        const pb::EnumValueDescriptor* candidate = type->value(i);
        if (!is_unspecified(candidate) && yaml_enum_name(candidate) == text) {
          return repeated ? reflection->AddEnum(message, field, candidate)
                          : reflection->SetEnum(message, field, candidate);
        }
      }
      return error(mark, path, "'{}' is not one of {}", text, fmt::join(yaml_enum_names(type), ", "));
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      break;  // handled by read_field
  }
}

// ---- writing ---------------------------------------------------------------------------------

// Shortest text that reads back to the same double, in YAML's spelling of the special values.
std::string yaml_double(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  return fmt::format("{}", value);
}

bool is_null_like(const std::string& text) {
  return text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL";
}

void write_scalar(YAML::Emitter& out, const pb::Message& message, const pb::FieldDescriptor* field,
                  int index) {
  const pb::Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      out << (rep ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      out << (rep ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      out << (rep ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      out << (rep ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      out << yaml_double(rep ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      out << yaml_double(rep ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      out << ((rep ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field)) ? "true"
                                                                                             : "false");
      break;
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      const std::string& text =
          rep ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
      // A string field reads any scalar as text, so only null-looking strings, and strings with a
      // control character (a plain scalar loses a trailing \r; the fuzzer found it), need quotes
      // to come back; double quotes escape the control characters.
      const bool control = std::any_of(text.begin(), text.end(), [](char c) {
        const auto u = static_cast<unsigned char>(c);
        return u < 0x20 || u == 0x7f;
      });
      if (is_null_like(text) || control) out << YAML::DoubleQuoted;
      out << text;
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM:
      out << yaml_enum_name(rep ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
}

bool has_message_field_set(const pb::Message& message) {
  std::vector<const pb::FieldDescriptor*> fields;
  message.GetReflection()->ListFields(message, &fields);
  return std::any_of(fields.begin(), fields.end(), [](const pb::FieldDescriptor* f) {
    return f->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
  });
}

void write_message(YAML::Emitter& out, const pb::Message& message, bool top_level = false) {
  const pb::Reflection* r = message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  r->ListFields(message, &fields);
  // Messages of scalars only (a layer, the optimizer's schedule) read best on one line.
  out << (top_level || has_message_field_set(message) ? YAML::Block : YAML::Flow) << YAML::BeginMap;
  for (const pb::FieldDescriptor* field : fields) {
    out << YAML::Key << field->name() << YAML::Value;
    const bool is_message = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_map()) {
      // Sorted, so the same spec always prints the same (a proto map has no order).
      std::map<std::string, std::string> entries;
      const pb::FieldDescriptor* key_field = field->message_type()->map_key();
      const pb::FieldDescriptor* value_field = field->message_type()->map_value();
      for (int i = 0; i < r->FieldSize(message, field); ++i) {
        const pb::Message& entry = r->GetRepeatedMessage(message, field, i);
        entries[entry.GetReflection()->GetString(entry, key_field)] =
            entry.GetReflection()->GetString(entry, value_field);
      }
      out << YAML::Block << YAML::BeginMap;
      for (const auto& [key, value] : entries) {
        out << YAML::Key << key << YAML::Value;
        if (is_null_like(value)) out << YAML::DoubleQuoted;
        out << value;
      }
      out << YAML::EndMap;
      continue;
    }
    if (!field->is_repeated()) {
      if (is_message) {
        write_message(out, r->GetMessage(message, field));
      } else {
        write_scalar(out, message, field, -1);
      }
      continue;
    }
    out << (is_message ? YAML::Block : YAML::Flow) << YAML::BeginSeq;
    for (int i = 0; i < r->FieldSize(message, field); ++i) {
      if (is_message) {
        write_message(out, r->GetRepeatedMessage(message, field, i));
      } else {
        write_scalar(out, message, field, i);
      }
    }
    out << YAML::EndSeq;
  }
  out << YAML::EndMap;
}

// ---- --set overrides --------------------------------------------------------------------------

bool is_index(const std::string& text) {
  return !text.empty() && text.size() <= 6 && std::all_of(text.begin(), text.end(), [](unsigned char c) {
    return std::isdigit(c) != 0;
  });
}

// " (did you mean 'lr'?)" for a near miss among `type`'s fields, else "".
std::string field_hint(const std::string& name, const pb::Descriptor* type) {
  std::string hint;
  size_t best = kMaxSuggestionDistance + 1;
  for (const std::string& candidate : field_names(type)) {
    const size_t distance = edit_distance(name, candidate);
    if (distance < best) {
      best = distance;
      hint = fmt::format(" (did you mean '{}'?)", candidate);
    }
  }
  return hint;
}

// The value of an override as a YAML node: a list's text is YAML ([1, 2]); any other value is the
// text itself, a plain string scalar (so "a: b" or "#1" stay strings for string fields).
StatusOr<YAML::Node> override_value_node(const JobSpecOverride& override_, bool repeated) {
  if (!repeated) return YAML::Node(override_.value);
  try {
    return YAML::Load(override_.value);
  } catch (const YAML::Exception& e) {
    return invalid_argument_error("--set {}: the value is not YAML ({}); write a list as [a, b]", override_.text,
                                  e.msg);
  }
}

}  // namespace

StatusOr<JobSpecOverride> parse_job_spec_override(const std::string& text) {
  const size_t eq = text.find('=');
  if (eq == std::string::npos || eq == 0) {
    return invalid_argument_error("--set '{}': write PATH=VALUE with a field path, e.g. --set optimizer.lr=0.01",
                                  text);
  }
  JobSpecOverride result;
  result.text = text;
  result.value = text.substr(eq + 1);
  const std::string path_text = text.substr(0, eq);
  for (size_t start = 0;;) {
    const size_t dot = path_text.find('.', start);
    result.path.push_back(path_text.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (result.path.back().empty()) {
      return invalid_argument_error("--set {}: '{}' has an empty part; write names joined by dots, e.g. optimizer.lr",
                                    text, path_text);
    }
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // Walk JobSpec's descriptors to the field the path names; check VALUE on a scratch message.
  const pb::Descriptor* type = cohort::v1::JobSpec::descriptor();
  std::string walked;
  for (size_t i = 0; i < result.path.size(); ++i) {
    const std::string& name = result.path[i];
    const bool last = i + 1 == result.path.size();
    const pb::FieldDescriptor* field = type->FindFieldByName(name);
    if (field == nullptr) {
      return invalid_argument_error("--set {}: {} has no field '{}'{}; its fields are: {}", text,
                                    walked.empty() ? std::string("a job spec") : "'" + walked + "'", name,
                                    field_hint(name, type), fmt::join(field_names(type), ", "));
    }
    walked = child_path(walked, name);
    const bool is_message = field->cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE;
    std::unique_ptr<pb::Message> scratch(pb::MessageFactory::generated_factory()->GetPrototype(type)->New());
    Reader reader("--set " + text);
    if (field->is_map()) {
      if (i + 2 != result.path.size()) {
        return invalid_argument_error("--set {}: {} is a map; name one key: {}.KEY=VALUE", text, walked, walked);
      }
      YAML::Node map_node(YAML::NodeType::Map);
      map_node[result.path[i + 1]] = result.value;
      reader.read_field(map_node, YAML::Mark::null_mark(), scratch.get(), field, walked);
      COHORT_RETURN_IF_ERROR(reader.status());
      return result;
    }
    if (is_message && field->is_repeated()) {
      if (i + 2 >= result.path.size() || !is_index(result.path[i + 1])) {
        return invalid_argument_error(
            "--set {}: {} is a list of mappings; name an entry and its field: {}.0.{}=VALUE", text, walked, walked,
            field->message_type()->field_count() > 0 ? field->message_type()->field(0)->name() : "FIELD");
      }
      walked += "." + result.path[++i];
      type = field->message_type();
      continue;
    }
    if (is_message) {
      if (last) {
        return invalid_argument_error("--set {}: {} is a mapping, not a value; set one of its fields: {}", text,
                                      walked, fmt::join(field_names(field->message_type()), ", "));
      }
      type = field->message_type();
      continue;
    }
    if (!last) {
      return invalid_argument_error("--set {}: {} is a value and has no field '{}'", text, walked,
                                    result.path[i + 1]);
    }
    COHORT_ASSIGN_OR_RETURN(YAML::Node value, override_value_node(result, field->is_repeated()));
    reader.read_field(value, YAML::Mark::null_mark(), scratch.get(), field, walked);
    COHORT_RETURN_IF_ERROR(reader.status());
  }
  return result;
}

namespace {

// Puts `override_` into the YAML tree `root`, making the mappings on its path that the file lacks.
Status apply_override(YAML::Node root, const JobSpecOverride& override_, std::string_view file_name) {
  YAML::Node node;
  node.reset(root);  // Node assignment would copy values; reset rebinds
  const pb::Descriptor* type = cohort::v1::JobSpec::descriptor();
  std::string walked;
  for (size_t i = 0; i < override_.path.size(); ++i) {
    const std::string& name = override_.path[i];
    if (!node.IsMap()) {
      return invalid_argument_error("{}: --set {}: {} is {} in the file, not a mapping", file_name, override_.text,
                                    walked.empty() ? std::string("the spec") : walked, node_kind(node));
    }
    walked = child_path(walked, name);
    const bool last = i + 1 == override_.path.size();
    const pb::FieldDescriptor* field = type == nullptr ? nullptr : type->FindFieldByName(name);
    if (last) {
      const bool repeated = field != nullptr && field->is_repeated();
      COHORT_ASSIGN_OR_RETURN(YAML::Node value, override_value_node(override_, repeated));
      node[name] = value;
      return ok_status();
    }
    if (field != nullptr && field->is_repeated() && !field->is_map()) {
      // A list of mappings and an index (parse_job_spec_override checked the form).
      const size_t index = static_cast<size_t>(std::stoul(override_.path[++i]));
      YAML::Node list = node[name];
      if (!list.IsSequence() || index >= list.size()) {
        return invalid_argument_error("{}: --set {}: the file's {} has {} entries, so there is no entry {}", file_name,
                                      override_.text, walked, list.IsSequence() ? list.size() : 0, index);
      }
      walked += "." + override_.path[i];
      node.reset(list[index]);
      type = field->message_type();
      continue;
    }
    YAML::Node child = node[name];
    if (!child.IsDefined() || child.IsNull()) {
      node[name] = YAML::Node(YAML::NodeType::Map);
      child = node[name];
    }
    node.reset(child);
    type = field != nullptr && !field->is_map() ? field->message_type() : nullptr;
  }
  return ok_status();
}

}  // namespace

StatusOr<cohort::v1::JobSpec> parse_job_spec_yaml(std::string_view text, std::string_view file_name,
                                                  const std::vector<JobSpecOverride>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return invalid_argument_error(
        "{}:{}:{}: YAML syntax error: {}; fix the file's indentation, quoting or brackets", file_name,
        e.mark.line + 1, e.mark.column + 1, e.msg);
  }
  Reader reader(file_name);
  cohort::v1::JobSpec spec;
  if (!root.IsDefined() || root.IsNull()) {
    return invalid_argument_error("{}: the file holds no job spec; write a mapping with keys such as {}",
                                  file_name, fmt::join(field_names(cohort::v1::JobSpec::descriptor()), ", "));
  }
  for (const JobSpecOverride& override_ : overrides) {
    try {
      COHORT_RETURN_IF_ERROR(apply_override(root, override_, file_name));
    } catch (const YAML::Exception& e) {
      return invalid_argument_error("{}: --set {}: {}", file_name, override_.text, e.msg);
    }
  }
  try {
    reader.read_message(root, &spec, "");
  } catch (const YAML::Exception& e) {
    // Malformed trees yaml-cpp only notices while they are walked.
    reader.error(e.mark, "", "YAML error: {}", e.msg);
  }
  COHORT_RETURN_IF_ERROR(reader.status());
  return spec;
}

StatusOr<cohort::v1::JobSpec> load_job_spec_file(const std::string& path,
                                                 const std::vector<JobSpecOverride>& overrides) {
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return not_found_error("cannot read job spec file {}: {}; check the path", path, std::strerror(errno));
  }
  if (S_ISDIR(info.st_mode)) {
    return invalid_argument_error("job spec file {} is a directory; give the path of a .yaml file", path);
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    return not_found_error("cannot read job spec file {}: {}; check the path and its permissions", path,
                           std::strerror(errno));
  }
  std::ostringstream text;
  text << file.rdbuf();
  return parse_job_spec_yaml(text.str(), path, overrides);
}

std::string job_spec_to_yaml(const cohort::v1::JobSpec& spec) {
  YAML::Emitter out;
  out.SetIndent(2);
  write_message(out, spec, /*top_level=*/true);
  return std::string(out.c_str()) + "\n";
}

}  // namespace cohort::client
