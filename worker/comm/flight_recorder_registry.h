#pragma once

// The process's flight recorders, dumped on demand as one Chrome trace (the Trace Event Format:
// {"traceEvents":[...]} with "ph":"X" complete events, ts/dur in microseconds), to open in
// chrome://tracing or https://ui.perfetto.dev. Each rank is a trace process (pid = its world rank),
// each communicator a pair of threads (collectives, point to point); dumps of several ranks can
// be opened together since timestamps are wall-clock.
//
// On demand:
//   - a call: dump_flight_recorders() (returns the path written);
//   - a signal: SIGUSR1 by default (kill -USR1 <pid>). Installed when the first communicator is
//     made, only if the signal's disposition is still the default (a program's own handler
//     wins); COHORT_FLIGHT_RECORDER_SIGNAL=USR2 (or a number) picks another, =off installs none;
//     install_flight_recorder_signal_handler() installs it explicitly.
//   - a timeout: when COHORT_FLIGHT_RECORDER_DIR is set, a collective that times out also writes
//     the trace there (the text dump is always in the error and the log).
// Files go to $COHORT_FLIGHT_RECORDER_DIR, else $TMPDIR, else /tmp, named
// cohort-flight-recorder-rank<R>-pid<P>-<N>.json; every dump logs the path.
//
// The signal handler only writes one byte to a pipe (async-signal-safe); a thread started with
// the handler reads the pipe and writes the dump.

#include <csignal>
#include <cstdint>
#include <memory>
#include <string>

#include "worker/base/status.h"
#include "worker/comm/flight_recorder.h"

namespace cohort::comm {

inline constexpr const char* kFlightRecorderDirEnv = "COHORT_FLIGHT_RECORDER_DIR";
inline constexpr const char* kFlightRecorderSignalEnv = "COHORT_FLIGHT_RECORDER_SIGNAL";
inline constexpr int kDefaultFlightRecorderSignal = SIGUSR1;

// Adds a communicator's recorder to the dumps while it lives (held weakly). `world_rank` is the
// trace pid, `context_id` picks the threads, `name` labels them. Thread-safe.
void register_flight_recorder(const std::shared_ptr<FlightRecorder>& recorder, int world_rank,
                              uint64_t context_id, const std::string& name);

// Every live recorder of this process as one Chrome trace JSON document. Thread-safe.
std::string flight_recorder_trace_json();

// Writes flight_recorder_trace_json() to `path` ("": a new file in the dump directory, see
// above), atomically (a temporary file renamed), logs where, and returns the path. Thread-safe.
StatusOr<std::string> dump_flight_recorders(const std::string& path = "");

// What a timed-out collective calls: dump_flight_recorders() when COHORT_FLIGHT_RECORDER_DIR is
// set (a failure is logged, never returned), else nothing. Thread-safe.
void dump_flight_recorders_on_timeout();

// Makes `signal` dump the recorders (see above). Idempotent per signal; the first call starts the
// dump thread. INVALID_ARGUMENT for a signal that cannot be caught.
Status install_flight_recorder_signal_handler(int signal = kDefaultFlightRecorderSignal);

// What communicators call once: installs the handler COHORT_FLIGHT_RECORDER_SIGNAL asks for
// (default SIGUSR1 if nothing else handles it). Problems are logged, never fatal. Thread-safe.
void install_flight_recorder_signal_from_environment();

// The signal COHORT_FLIGHT_RECORDER_SIGNAL names ("USR1", "SIGUSR2", "12"), 0 for "off"/"none"/
// "0"; INVALID_ARGUMENT for anything else. Unset or empty: kDefaultFlightRecorderSignal.
StatusOr<int> parse_flight_recorder_signal(const char* value);

}  // namespace cohort::comm
