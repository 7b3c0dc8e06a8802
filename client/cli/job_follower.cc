#include "client/cli/job_follower.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include <fmt/format.h>

#include "client/cli/output.h"

namespace cohort::client::cli {

namespace {

// Samples per optimizer step over all ranks: the batch per rank times the ranks.
double samples_per_step(const cohort::v1::JobSpec& spec) {
  return static_cast<double>(spec.batch_size()) * std::max(1, spec.nodes()) *
         std::max(1, spec.procs_per_node());
}

// epochs x ceil(train_size / samples per step) when the spec fixes the training set size; 0 when
// it uses a whole dataset whose size only the worker knows.
int64_t estimated_total_steps(const cohort::v1::JobSpec& spec, int epochs) {
  const double per_step = samples_per_step(spec);
  if (spec.dataset().train_size() <= 0 || per_step <= 0 || epochs <= 0) return 0;
  return static_cast<int64_t>(epochs) *
         static_cast<int64_t>(std::ceil(static_cast<double>(spec.dataset().train_size()) / per_step));
}

}  // namespace

std::string format_progress(const cohort::v1::Metrics& metrics, const cohort::v1::JobSpec& spec, bool bar) {
  // The worker's counts, else what the spec implies (workers that do not report them).
  const int epochs = metrics.total_epochs() > 0 ? metrics.total_epochs() : spec.epochs();
  const int64_t total =
      metrics.total_steps() > 0 ? metrics.total_steps() : estimated_total_steps(spec, epochs);
  std::string line;
  if (bar && total > 0) {
    const double fraction =
        std::clamp(static_cast<double>(metrics.step()) / static_cast<double>(total), 0.0, 1.0);
    const int filled = static_cast<int>(std::lround(fraction * kProgressBarWidth));
    std::string cells(static_cast<size_t>(kProgressBarWidth), ' ');
    for (int i = 0; i < filled; ++i) cells[static_cast<size_t>(i)] = '=';
    if (filled > 0 && filled < kProgressBarWidth) cells[static_cast<size_t>(filled)] = '>';
    line += fmt::format("[{}] {:3.0f}%  ", cells, fraction * 100);
  }
  line += epochs > 0 ? fmt::format("epoch {}/{}", metrics.epoch() + 1, epochs)
                     : fmt::format("epoch {}", metrics.epoch() + 1);
  line += total > 0 ? fmt::format("  step {}/{}", metrics.step(), total)
                    : fmt::format("  step {}", metrics.step());
  line += fmt::format("  loss {:.4f}", metrics.loss());
  if (metrics.accuracy() > 0) line += fmt::format("  acc {:.2f}%", metrics.accuracy() * 100);
  if (metrics.samples_per_s() > 0) line += fmt::format("  {:.0f} samples/s", metrics.samples_per_s());
  // The worker's own samples per step (model-parallel ranks share one batch), else the spec's.
  const double per_step = metrics.samples_per_step() > 0 ? static_cast<double>(metrics.samples_per_step())
                                                         : samples_per_step(spec);
  if (total > 0 && metrics.samples_per_s() > 0 && per_step > 0) {
    const double seconds = static_cast<double>(std::max<int64_t>(0, total - metrics.step())) * per_step /
                           metrics.samples_per_s();
    line += "  ETA " + format_duration(static_cast<int64_t>(std::ceil(seconds)));
  }
  return line;
}

namespace {

// Prints state changes and progress for one followed job.
class ProgressPrinter {
 public:
  ProgressPrinter(const CommandContext& context, std::string job_id, cohort::v1::JobSpec spec)
      : context_(context), job_id_(std::move(job_id)), spec_(std::move(spec)) {}

  void on_event(const cohort::v1::JobEvent& event) {
    if (context_.structured()) return;
    if (event.has_state_change()) {
      flush_pending();
      end_bar();
      const cohort::v1::StateChange& change = event.state_change();
      *context_.out << fmt::format("job {}: {}{}", job_id_, state_name(change.to()),
                                   change.reason().empty() ? "" : " (" + change.reason() + ")")
                    << (change.attempt() > 1 ? fmt::format(" [attempt {}]", change.attempt()) : "") << '\n';
      context_.out->flush();
      return;
    }
    if (!event.has_metrics()) return;
    if (context_.tty) {
      *context_.out << "\r\x1b[K" << format_progress(event.metrics(), spec_, /*bar=*/true);
      context_.out->flush();
      bar_shown_ = true;
      return;
    }
    pending_ = event.metrics();
    has_pending_ = true;
    const auto now = std::chrono::steady_clock::now();
    if (now - last_plain_ >= kPlainProgressInterval) flush_pending();
  }

  void finish() {
    flush_pending();
    end_bar();
  }

 private:
  void flush_pending() {
    if (!has_pending_ || context_.tty) return;
    *context_.out << format_progress(pending_, spec_, /*bar=*/false) << '\n';
    context_.out->flush();
    has_pending_ = false;
    last_plain_ = std::chrono::steady_clock::now();
  }
  void end_bar() {
    if (!bar_shown_) return;
    *context_.out << '\n';
    bar_shown_ = false;
  }

  const CommandContext& context_;
  const std::string job_id_;
  const cohort::v1::JobSpec spec_;
  bool bar_shown_ = false;
  bool has_pending_ = false;
  cohort::v1::Metrics pending_;
  std::chrono::steady_clock::time_point last_plain_{};
};

}  // namespace

StatusOr<cohort::v1::JobRecord> follow_job(Client& client, const std::string& job_id,
                                           const CommandContext& context) {
  COHORT_ASSIGN_OR_RETURN(cohort::v1::JobRecord job, client.get(job_id));
  ProgressPrinter printer(context, job_id, job.spec());
  int64_t last_seq = 0;
  // While the coordinator cannot be reached: when that began (the clock's epoch: it can), and the
  // next wait.
  const std::chrono::steady_clock::time_point reachable{};
  std::chrono::steady_clock::time_point unreachable_since = reachable;
  std::chrono::milliseconds backoff = kFollowInitialRetryBackoff;
  bool announced = false;
  // The stream ends by itself when the job finishes; a coordinator restart ends it early, so a
  // job that is not over yet is watched again from the last event seen.
  auto on_event = [&](const cohort::v1::JobEvent& event) {
    last_seq = std::max(last_seq, event.seq());
    printer.on_event(event);
    return true;
  };
  while (true) {
    const int64_t seq_before = last_seq;
    Status watched = client.watch(job_id, on_event, last_seq);
    StatusOr<cohort::v1::JobRecord> got = client.get(job_id);
    if (got.ok()) {
      job = std::move(got).value();
      if (is_final_state(job.state())) {
        // A stream that broke (a coordinator restart) may have missed the end itself: the events
        // after the last one seen are replayed, so the final state is printed like any other.
        if (!watched.ok()) client.watch(job_id, on_event, last_seq).ignore_error();
        break;
      }
    }
    const Status problem = !got.ok() ? got.status() : watched;
    if (problem.ok() || last_seq > seq_before) {  // reachable: a new outage starts a new window
      unreachable_since = reachable;
      backoff = kFollowInitialRetryBackoff;
    }
    if (problem.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // never spin on a stream that ends early
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    // A coordinator shutting down cancels the calls in flight (CANCELLED); this follower never
    // cancels its own calls on an error path, so that, too, means "restarting".
    const bool unreachable = problem.code() == StatusCode::kUnavailable ||
                             problem.code() == StatusCode::kDeadlineExceeded ||
                             problem.code() == StatusCode::kCancelled;
    if (unreachable_since == reachable) unreachable_since = now;
    if (!unreachable || now - unreachable_since >= kFollowReconnectWindow) {
      printer.finish();
      return problem;
    }
    if (!announced) {
      printer.finish();
      if (context.err != nullptr) {
        *context.err << "coordinator unreachable, retrying (up to " << kFollowReconnectWindow.count()
                     << " s)\n";
        context.err->flush();
      }
      announced = true;
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, kFollowMaxRetryBackoff);
  }
  printer.finish();
  return job;
}

}  // namespace cohort::client::cli
