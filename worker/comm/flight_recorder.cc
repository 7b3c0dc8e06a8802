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

void FlightRecorder::begin_write(ExclusiveSlot& slot) {
  slot.version.store(slot.version.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // The odd version is visible before any field this write changes.
  std::atomic_thread_fence(std::memory_order_release);
}

void FlightRecorder::end_write(ExclusiveSlot& slot) {
  slot.version.store(slot.version.load(std::memory_order_relaxed) + 1, std::memory_order_release);
}

uint64_t FlightRecorder::start_exclusive(uint64_t sequence, const OpInfo& info, Clock::time_point at) {
  const uint64_t id = exclusive_next_++;
  if (capacity_ == 0) return id;
  ExclusiveSlot& slot = exclusive_[id % capacity_];
  const bool evicted_failure = slot.failed.load(std::memory_order_relaxed);
  constexpr auto relaxed = std::memory_order_relaxed;
  begin_write(slot);
  slot.id.store(id + 1, relaxed);
  slot.sequence.store(sequence, relaxed);
  slot.op.store(info.op, relaxed);
  slot.count_label.store(info.count_label, relaxed);
  slot.count.store(info.count, relaxed);
  slot.dtype.store(info.dtype, relaxed);
  slot.reduce_op.store(info.reduce_op, relaxed);
  slot.root.store(info.root, relaxed);
  slot.start.store(at.time_since_epoch().count(), relaxed);
  slot.ended.store(false, relaxed);
  slot.failed.store(false, relaxed);
  end_write(slot);
  if (evicted_failure) {
    // The error of the operation this slot held is out of the window now.
    std::lock_guard<RingLock> lock(lock_);
    const uint64_t oldest = id + 1 - capacity_;
    exclusive_errors_.erase(std::remove_if(exclusive_errors_.begin(), exclusive_errors_.end(),
                                           [&](const auto& e) { return e.first < oldest; }),
                            exclusive_errors_.end());
  }
  return id;
}

void FlightRecorder::finish_exclusive(uint64_t id, const Status& status, Clock::time_point at) {
  if (capacity_ == 0) return;
  ExclusiveSlot& slot = exclusive_[id % capacity_];
  if (slot.id.load(std::memory_order_relaxed) != id + 1) return;  // fell out of the window
  if (!status.ok()) {
    // Before the flag, so a reader that sees `failed` finds the status.
    std::lock_guard<RingLock> lock(lock_);
    exclusive_errors_.emplace_back(id, status);
  }
  begin_write(slot);
  slot.end.store(at.time_since_epoch().count(), std::memory_order_relaxed);
  slot.ended.store(true, std::memory_order_relaxed);
  slot.failed.store(!status.ok(), std::memory_order_relaxed);
  end_write(slot);
}

std::optional<std::pair<uint64_t, FlightRecord>> FlightRecorder::read_exclusive(
    const ExclusiveSlot& slot) const {
  constexpr auto relaxed = std::memory_order_relaxed;
  for (int attempt = 0;; ++attempt) {
    const uint64_t before = slot.version.load(std::memory_order_acquire);
    if (before % 2 == 0) {
      const uint64_t id = slot.id.load(relaxed);
      FlightRecord record;
      record.sequence = slot.sequence.load(relaxed);
      record.info.op = slot.op.load(relaxed);
      record.info.count_label = slot.count_label.load(relaxed);
      record.info.count = slot.count.load(relaxed);
      record.info.dtype = slot.dtype.load(relaxed);
      record.info.reduce_op = slot.reduce_op.load(relaxed);
      record.info.root = slot.root.load(relaxed);
      record.start = Clock::time_point(Clock::duration(slot.start.load(relaxed)));
      const bool ended = slot.ended.load(relaxed);
      const int64_t end = slot.end.load(relaxed);
      const bool failed = slot.failed.load(relaxed);
      // The loads above happen before the second look at the version.
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.version.load(relaxed) == before) {
        if (id == 0) return std::nullopt;
        if (ended) record.end = Clock::time_point(Clock::duration(end));
        if (failed) {
          std::lock_guard<RingLock> lock(lock_);
          // An error evicted between the two reads is named as such.
          record.status = internal_error(
              "failed; its error left the flight recorder (capacity {}) while this dump was made; a larger "
              "flight_recorder_size keeps more",
              capacity_);
          for (const auto& [failed_id, status] : exclusive_errors_) {
            if (failed_id == id - 1) record.status = status;
          }
        }
        return std::make_pair(id - 1, std::move(record));
      }
    }
    // Caught mid-write: the writer is inside for a few stores.
    if (attempt >= 64) std::this_thread::yield();
  }
}

size_t FlightRecorder::exclusive_errors_kept() const {
  std::lock_guard<RingLock> lock(lock_);
  return exclusive_errors_.size();
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::vector<FlightRecord> records;
  {
    std::lock_guard<RingLock> lock(lock_);
    records.reserve(ring_.size() + capacity_);
    if (!ring_.empty()) {  // else nothing yet, or a capacity of 0
      // Until the ring is full, slots are in id order from 0; after, the oldest is the next to reuse.
      const size_t first = ring_.size() < capacity_ ? 0 : next_id_ % capacity_;
      for (size_t i = 0; i < ring_.size(); ++i) records.push_back(ring_[(first + i) % ring_.size()].record);
    }
  }
  std::vector<std::pair<uint64_t, FlightRecord>> exclusive;
  for (size_t i = 0; i < capacity_; ++i) {
    if (auto entry = read_exclusive(exclusive_[i])) exclusive.push_back(std::move(*entry));
  }
  std::sort(exclusive.begin(), exclusive.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  // Both lanes are in start order; merge them by start time (the lane's own order on ties).
  std::vector<FlightRecord> merged;
  merged.reserve(records.size() + exclusive.size());
  size_t e = 0;
  for (FlightRecord& r : records) {
    while (e < exclusive.size() && exclusive[e].second.start <= r.start) {
      merged.push_back(std::move(exclusive[e++].second));
    }
    merged.push_back(std::move(r));
  }
  for (; e < exclusive.size(); ++e) merged.push_back(std::move(exclusive[e].second));
  return merged;
}

std::string FlightRecorder::dump() const {
  const std::vector<FlightRecord> records = snapshot();
  std::string out;
  auto now = Clock::now();
  for (const FlightRecord& r : records) {
    // Never negative: a collective's times come from its communicator's counter clock, which
    // may be a few microseconds off steady_clock (tsc_clock.h).
    auto elapsed =
        std::max(std::chrono::microseconds(0),
                 std::chrono::duration_cast<std::chrono::microseconds>(r.end.value_or(now) - r.start));
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
