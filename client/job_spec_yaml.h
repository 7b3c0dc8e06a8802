#pragma once

// Job specs in YAML ⇄ cohort.v1.JobSpec. The YAML keys are exactly the proto field names
// (snake_case); the mapping is driven by the protobuf descriptors, so a field added to job.proto is
// readable and writable here without a parser change.
//
//   name: fashion
//   nodes: 1
//   procs_per_node: 2
//   dataset: {kind: fashion_mnist}
//   data_parallel:
//     graph:
//       layers:
//         - {type: linear, in_features: 784, out_features: 10}
//   loss: cross_entropy
//   optimizer: {kind: momentum, lr: 0.05, momentum: 0.9}
//   batch_size: 64
//   epochs: 1
//
// Conventions:
//   - enums are written lowercase without their type prefix (dataset.kind: fashion_mnist | idx_dir |
//     synthetic; optimizer.kind: sgd | momentum | adam; schedule.kind: constant | step | cosine); the
//     `*_UNSPECIFIED` zero values are not accepted — leaving the key out means unspecified;
//   - a repeated scalar field (rank_in, rank_out, input_shape) takes a list, a single value, or null
//     (ChainerMN's `rank_in=None`), so `rank_out: 1` reads as [1];
//   - null for any other field leaves it unset;
//   - at most one member of a oneof (data_parallel / model_parallel; graph / torchscript_file).
//
// Every problem in the file is reported, one per line, each naming the file, line and column, the
// field path and the value, and what to do:
//   job.yaml:12:5: optimizer.kind: 'sgdd' is not one of sgd, momentum, adam
//
// These are structural checks only; what the values mean (counts, shapes, wiring) is checked by
// cohort::coordinator::validate_job_spec and cohort::graph::validate_model.

#include <string>
#include <string_view>
#include <vector>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::client {

// One `cohort submit JOB.yaml --set PATH=VALUE`: a field of the file replaced (or added) before the
// file is read, which is what makes sweeps and job arrays one loop over a single file:
//   optimizer.lr=0.01   epochs=3   dataset.kind=synthetic   env.SEED=7   rank_out=[1, 2]
//   data_parallel.graph.layers.0.out_features=256   (a number indexes a list of mappings)
// PATH is a dotted field path from JobSpec, with proto field names; VALUE is typed by the field it
// names, exactly as in the file (a list in YAML's [a, b] form for a repeated field).
struct JobSpecOverride {
  std::vector<std::string> path;  // {"optimizer", "lr"}
  std::string value;              // "0.01"
  std::string text;               // "optimizer.lr=0.01", for messages
};

// Parses "PATH=VALUE" and checks it against JobSpec's fields without any file: the path must name a
// field (or a list entry's, or a map's key) that takes a value, and VALUE must be what that field
// takes. INVALID_ARGUMENT naming the path and the value otherwise ("--set optimizer.lr=abc:
// optimizer.lr: 'abc' is not a number such as 0.05"). Thread-safe.
StatusOr<JobSpecOverride> parse_job_spec_override(const std::string& text);

// Parses YAML text into a JobSpec, after applying `overrides` (parse_job_spec_override's, in order;
// a later one wins) to the YAML tree. `file_name` only labels errors. INVALID_ARGUMENT listing every
// problem (one per line) when the text is not YAML or does not map onto JobSpec, or an override
// indexes a list entry the file does not have. Thread-safe.
StatusOr<cohort::v1::JobSpec> parse_job_spec_yaml(std::string_view text, std::string_view file_name,
                                                  const std::vector<JobSpecOverride>& overrides = {});

// Reads and parses a YAML job file. NOT_FOUND naming the path when it cannot be read; otherwise as
// parse_job_spec_yaml, with errors labelled by `path`.
StatusOr<cohort::v1::JobSpec> load_job_spec_file(const std::string& path,
                                                 const std::vector<JobSpecOverride>& overrides = {});

// Renders a spec back to YAML that parse_job_spec_yaml reads to an equal message. Fields at their
// defaults are left out.
std::string job_spec_to_yaml(const cohort::v1::JobSpec& spec);

}  // namespace cohort::client
