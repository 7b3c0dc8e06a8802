#include "worker/comm/flight_recorder.h"

#include <algorithm>
#include <chrono>

namespace cohort::comm {

std::string OpInfo::detail() const {
  std::string out;
  if (dtype >= 0) {
    out = fmt::format("{} x {}{}", data_type_name(static_cast<DataType>(dtype)), count, count_label);
  }
  if (reduce_op >= 0) out += fmt::format(", {}", reduce_op_name(static_cast<ReduceOp>(reduce_op)));
  if (root >= 0) out += fmt::format(", root {}", root);
  if (peer >= 0) out += fmt::format(", peer {}, tag {}", peer, tag);
  return out;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
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
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20)
          out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
        else
          out += c;
    }
  }
  return out + "\"";
}

uint64_t FlightRecorder::start(uint64_t sequence, const OpInfo& info, Clock::time_point at) {
  std::lock_guard<RingLock> lock(lock_);
  uint64_t id = next_id_++;
  if (capacity_ == 0) return id;
  Entry entry{id, FlightRecord{sequence, info, at, std::nullopt, {}}};
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(entry));  // id == ring_.size() - 1 while the ring fills
  } else {
    ring_[id % capacity_] = std::move(entry);
  }
  return id;
}

void FlightRecorder::finish(uint64_t id, const Status& status, Clock::time_point at) {
  std::lock_guard<RingLock> lock(lock_);
  if (capacity_ == 0) return;
  const size_t slot = id % capacity_;
  if (slot >= ring_.size() || ring_[slot].id != id) return;  // fell out of the window
  FlightRecord& record = ring_[slot].record;
  record.end = at;
  // The slot's status is OK from start(): an OK outcome copies nothing.
  if (!status.ok()) record.status = status;
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::vector<FlightRecord> records;
  std::lock_guard<RingLock> lock(lock_);
  if (ring_.empty()) return records;  // nothing yet, or a capacity of 0
  records.reserve(ring_.size());
  // Until the ring is full, slots are in id order from 0; after, the oldest is the next to reuse.
  const size_t first = ring_.size() < capacity_ ? 0 : next_id_ % capacity_;
  for (size_t i = 0; i < ring_.size(); ++i) records.push_back(ring_[(first + i) % ring_.size()].record);
  return records;
}

std::string FlightRecorder::dump() const {
  const std::vector<FlightRecord> records = snapshot();
  std::string out;
  auto now = Clock::now();
  for (const FlightRecord& r : records) {
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

namespace cohort::comm {

void FlightRecorder::append_chrome_trace_events(int pid, int64_t tid, std::string* out) const {
  // Steady-clock records onto the wall clock: one offset for the whole dump.
  const auto steady_now = Clock::now();
  const auto wall_now = std::chrono::system_clock::now();
  auto wall_us = [&](Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               (wall_now - std::chrono::duration_cast<std::chrono::system_clock::duration>(steady_now - t))
                   .time_since_epoch())
        .count();
  };
  for (const FlightRecord& r : snapshot()) {
    const int64_t start = wall_us(r.start);
    const int64_t duration = std::max<int64_t>(wall_us(r.end.value_or(steady_now)) - start, 0);
    const bool p2p = r.info.is_point_to_point();
    const std::string state = !r.end ? "running" : (r.status.ok() ? "ok" : r.status.to_string());
    *out += fmt::format(
        "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{},\"dur\":{},\"pid\":{},\"tid\":{},"
        "\"args\":{{\"sequence\":{},\"detail\":{},\"state\":{}}}}},\n",
        json_string(r.info.op), p2p ? "p2p" : "collective", start, duration, pid, p2p ? tid + 1 : tid,
        r.sequence, json_string(r.info.detail()), json_string(state));
  }
}

}  // namespace cohort::comm
