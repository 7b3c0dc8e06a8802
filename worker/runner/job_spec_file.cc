#include "worker/runner/job_spec_file.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include "client/job_spec_yaml.h"

namespace cohort::worker {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

StatusOr<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found_error("job spec {}: cannot open the file", path);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return data_loss_error("job spec {}: read failed", path);
  return contents.str();
}

// Collects the text parser's first error with its position.
class TextErrors : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = fmt::format("line {} column {}: {}", line + 1, column + 1, message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

}  // namespace

StatusOr<v1::JobSpec> read_job_spec_file(const std::string& path) {
  if (ends_with(path, ".yaml") || ends_with(path, ".yml")) return client::load_job_spec_file(path);
  const bool binary = ends_with(path, ".pb");
  const bool text = ends_with(path, ".pbtxt") || ends_with(path, ".textproto");
  if (!binary && !text) {
    return invalid_argument_error(
        "job spec {}: unknown extension; use .pb (binary), .pbtxt / .textproto (text "
        "format) or .yaml / .yml",
        path);
  }
  COHORT_ASSIGN_OR_RETURN(std::string contents, read_file(path));
  v1::JobSpec spec;
  if (binary) {
    if (!spec.ParseFromString(contents)) {
      return invalid_argument_error("job spec {}: not a binary-serialized cohort.v1.JobSpec", path);
    }
    return spec;
  }
  google::protobuf::TextFormat::Parser parser;
  TextErrors errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(contents, &spec)) {
    return invalid_argument_error("job spec {}: {}", path,
                                  errors.first().empty() ? "text format parse error" : errors.first());
  }
  return spec;
}

}  // namespace cohort::worker
