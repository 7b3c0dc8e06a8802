#include "worker/comm/flight_recorder.h"

namespace cohort::comm {

std::string OpInfo::detail() const {
  std::string out;
  if (dtype >= 0) {
    out = fmt::format("{} x {}{}", data_type_name(static_cast<DataType>(dtype)), count, count_label);
  }
  if (reduce_op >= 0) out += fmt::format(", {}", reduce_op_name(static_cast<ReduceOp>(reduce_op)));
  if (root >= 0) out += fmt::format(", root {}", root);
  return out;
}

uint64_t FlightRecorder::start(uint64_t sequence, const OpInfo& info) {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t id = next_id_++;
  entries_.push_back({id, FlightRecord{sequence, info, Clock::now(), std::nullopt, {}}});
  if (entries_.size() > capacity_) entries_.pop_front();
  return id;
}

void FlightRecorder::finish(uint64_t id, const Status& status) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (entries_.empty() || id < entries_.front().id) return;
  Entry& entry = entries_[id - entries_.front().id];
  entry.record.end = Clock::now();
  entry.record.status = status;
}

std::string FlightRecorder::dump() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  auto now = Clock::now();
  for (const Entry& entry : entries_) {
    const FlightRecord& r = entry.record;
    auto elapsed = std::chrono::duration_cast<std::chrono::microseconds>(r.end.value_or(now) - r.start);
    std::string took = elapsed.count() >= 1000 ? fmt::format("{:.1f} ms", elapsed.count() / 1000.0)
                                               : fmt::format("{} us", elapsed.count());
    std::string outcome = !r.end ? "RUNNING for " + took
                                 : (r.status.ok() ? "OK" : r.status.to_string()) + " after " + took;
    out += fmt::format("  #{} {} {}: {}\n", r.sequence, r.info.op, r.info.detail(), outcome);
  }
  return out;
}

}  // namespace cohort::comm
