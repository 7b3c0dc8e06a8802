// Fuzzes the YAML job-spec parser (client/job_spec_yaml.h), which reads every submitted job file.
// Invariants: parsing never crashes, and a spec that parses renders back (job_spec_to_yaml) to YAML
// that parses to the same message (the round trip job_spec_yaml.h promises).

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <google/protobuf/util/field_comparator.h>
#include <google/protobuf/util/message_differencer.h>

#include "client/job_spec_yaml.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto spec = cohort::client::parse_job_spec_yaml(text, "fuzz.yaml");
  if (!spec.ok()) {
    if (spec.status().message().empty()) {
      std::fprintf(stderr, "job_spec_yaml_fuzzer: an error without a message\n");
      std::abort();
    }
    return 0;
  }
  const std::string rendered = cohort::client::job_spec_to_yaml(*spec);
  const auto again = cohort::client::parse_job_spec_yaml(rendered, "rendered.yaml");
  if (!again.ok()) {
    std::fprintf(stderr, "job_spec_yaml_fuzzer: the rendered spec does not parse:\n%s\n---\n%s\n",
                 again.status().message().c_str(), rendered.c_str());
    std::abort();
  }
  // NaN is a legal double in a spec (".nan"); it compares unequal to itself, so compare it as equal.
  google::protobuf::util::DefaultFieldComparator comparator;
  comparator.set_treat_nan_as_equal(true);
  google::protobuf::util::MessageDifferencer differencer;
  differencer.set_field_comparator(&comparator);
  if (!differencer.Compare(*spec, *again)) {
    std::fprintf(stderr, "job_spec_yaml_fuzzer: the round trip changed the spec:\n%s\n---\n%s\n",
                 spec->DebugString().c_str(), again->DebugString().c_str());
    std::abort();
  }
  return 0;
}
