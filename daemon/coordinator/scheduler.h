#pragma once

// Scheduler: gang placement of queued jobs onto free node capacity.
//
// A job asks for `nodes` distinct nodes, each with `procs_per_node` free slots (and
// procs_per_node × gpus_per_proc free GPUs). It is placed whole or not at all: a partially placed
// gang would hold slots while waiting for the rest, and two such gangs can deadlock each other.
//
// The queue is strictly FIFO by submission order: when the job at the head does not fit, nothing
// behind it is placed, even a job that would fit. This head-of-line blocking is deliberate — with
// backfilling, a stream of small jobs could starve a large gang job forever, and without run-time
// estimates backfilling cannot be made safe. The cost is idle slots while the head waits; the
// head's `blocked_reason` says what it waits for.
//
// Among nodes that fit, a job takes the ones with the fewest free slots (best fit, ties by node id):
// leaving large holes free for later large jobs, and making placement deterministic for tests.
//
// Not thread-safe: the Coordinator serializes every call. Non-blocking.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "daemon/coordinator/placement.h"
#include "worker/base/status.h"

namespace cohort::coordinator {

// What one job needs.
struct SlotRequest {
  int nodes = 1;           // distinct nodes
  int procs_per_node = 1;  // slots on each
  int gpus_per_proc = 0;   // GPUs per slot (0: CPU only)
};

// Free capacity of one node, as the registry reports it.
struct NodeCapacity {
  std::string node_id;
  std::string address;
  int free_slots = 0;
  std::vector<int> free_gpus;  // ascending
};

struct ScheduledJob {
  std::string job_id;
  Placement placement;
};

struct ScheduleResult {
  std::vector<ScheduledJob> placed;  // in queue order; removed from the queue
  std::string blocked_job_id;        // the head job that did not fit (empty if the queue drained)
  std::string blocked_reason;        // what it waits for, for the job's record
};

class Scheduler {
 public:
  // Appends a job. `seq` orders the queue (the job's submission number), so a restarted attempt
  // re-enters at its original position, ahead of jobs submitted after it. INVALID_ARGUMENT for a
  // request with non-positive counts; ALREADY_EXISTS if the job is queued.
  Status enqueue(const std::string& job_id, int64_t seq, SlotRequest request);

  // Drops a queued job (cancelled). Returns whether it was queued.
  bool remove(const std::string& job_id);

  // Places jobs from the head of the queue onto `nodes` until one does not fit or the queue is
  // empty. Capacity taken by a placed job is not offered to the ones after it. The caller reserves
  // what the placements say.
  ScheduleResult schedule(std::vector<NodeCapacity> nodes);

  bool contains(const std::string& job_id) const { return seq_of_.count(job_id) != 0; }
  size_t size() const { return queue_.size(); }
  // Queued job ids, head first.
  std::vector<std::string> queued() const;

 private:
  struct Entry {
    std::string job_id;
    SlotRequest request;
  };

  std::map<int64_t, Entry> queue_;         // by seq: head first
  std::map<std::string, int64_t> seq_of_;  // job id → seq
};

}  // namespace cohort::coordinator
