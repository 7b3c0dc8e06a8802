#pragma once

// Reading the JobSpec a worker trains, by file extension:
//   .pb                  binary-serialized cohort.v1.JobSpec (what the agent writes, COHORT_JOB_SPEC)
//   .pbtxt / .textproto  protobuf text format
//   .yaml / .yml         the YAML job files of configs/jobs (client/job_spec_yaml.h)
//
//   COHORT_ASSIGN_OR_RETURN(v1::JobSpec spec, read_job_spec_file("job.pbtxt"));
//
// Blocking file I/O. NOT_FOUND when the file cannot be read; INVALID_ARGUMENT for an unknown
// extension or content that does not parse (with the parser's message and the file's name).

#include <string>

#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::worker {

StatusOr<v1::JobSpec> read_job_spec_file(const std::string& path);

}  // namespace cohort::worker
