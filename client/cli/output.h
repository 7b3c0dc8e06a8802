#pragma once

// How the `cohort` commands print: protobuf records as JSON, aligned tables, job states, times,
// durations and byte counts for people, and errors in one style ("cohort: ...").

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include <google/protobuf/message.h>
#include <google/protobuf/timestamp.pb.h>

#include "client/cli/command.h"
#include "cohort/v1/job.pb.h"
#include "worker/base/status.h"

namespace cohort::client::cli {

// `message` in protobuf's JSON mapping with the .proto field names, indented, one trailing newline.
std::string to_json(const google::protobuf::Message& message);

// The same record as YAML (block style, .proto field names, strings quoted only where YAML would
// read them as something else), from its JSON text (to_json's output, or any JSON object).
std::string json_to_yaml(const std::string& json);

// Prints `json` (to_json's output, or a JSON object the command made) as the context's format asks:
// as it is for -o json, as YAML for -o yaml. Only for those two formats.
void print_structured(const CommandContext& context, const std::string& json);

// `text` as a JSON string literal, quotes included. Bytes that are not well-formed UTF-8 become
// U+FFFD, so the result is always valid JSON.
std::string json_quote(const std::string& text);

// How much of `bytes` to emit now: all of it, except a trailing UTF-8 sequence that is well formed
// so far but cut short (output streamed in chunks splits characters); hold that back and put it
// in front of the next chunk.
size_t utf8_complete_prefix(std::string_view bytes);

// Rows under a header, each column as wide as its widest cell, two spaces apart; the last column is
// not padded. Every row has the header's number of cells.
void print_table(std::ostream& out, const std::vector<std::string>& header,
                 const std::vector<std::vector<std::string>>& rows);

// "RUNNING" for cohort.v1.RUNNING.
std::string state_name(cohort::v1::JobState state);
// Whether the state is SUCCEEDED, FAILED or CANCELLED.
bool is_final_state(cohort::v1::JobState state);
// Parses "running" / "RUNNING"; INVALID_ARGUMENT listing the states otherwise.
StatusOr<cohort::v1::JobState> parse_state(const std::string& name);

// "2026-11-22 13:05:03 UTC", or "-" when unset.
std::string format_time(const google::protobuf::Timestamp& time);
// "1h02m", "3m05s", "42s".
std::string format_duration(int64_t seconds);
// "15.5 GiB".
std::string format_bytes(int64_t bytes);

// Writes "cohort: <message>" to context.err and returns kExitFailure.
int report_error(const CommandContext& context, const Status& status);
// Writes "cohort <command>: <message>" and "see `cohort <command> --help`" and returns kExitUsage.
int usage_error(const CommandContext& context, const std::string& command, const std::string& message);

}  // namespace cohort::client::cli
