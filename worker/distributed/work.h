#pragma once

// Work: the handle torch.distributed returns for `async_op=True` (c10d's Work), over one or more
// communicator operations (worker/comm/work.h) of a tensor-level call. Finishing a call may need a
// step on this rank after the transfers (copying a contiguous staging buffer back into a
// non-contiguous tensor, unpacking a flat buffer into a list, checking a received header): that
// step runs exactly once, on the first thread that observes the transfers done (wait(),
// is_completed(), exception()).
//
//   auto work = cohort::distributed::all_reduce(*comm, grad, ReduceOp::kSum, {.async_op = true});
//   ... compute ...
//   work->wait();              // throws std::runtime_error naming the call if it failed
//
// Thread-safety: every method may be called from any thread. Ownership: the Work owns the buffers
// its transfers read and write (staging copies, headers); its destructor waits for transfers
// still in flight (they finish within their own deadline), so dropping an unwaited Work never
// frees memory a transfer still uses. The caller's tensors are written only by that finishing step
// when they were staged; contiguous tensors are written in place by the transfer itself.

#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "worker/base/status.h"
#include "worker/comm/deadline.h"
#include "worker/comm/work.h"

namespace cohort::distributed {

using comm::Duration;

class Work {
 public:
  // Runs once every transfer completed, with the first failure among them (or OK); returns the
  // call's result. It copies results out of staging buffers only when given OK, and may replace a
  // transport error with a clearer one (a received header that does not match the posted tensor).
  using Finish = std::function<Status(const Status& transfers)>;

  // `op` names the call in errors ("all_reduce", "recv from rank 1 (tag 3)"). An exception thrown
  // by `finish` fails the Work with its text.
  Work(std::string op, std::vector<std::shared_ptr<comm::Work>> transfers, Finish finish = {});
  ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Blocks until the call finished, or `timeout` passed (default: no limit beyond the call's own
  // deadline, which always ends it). Returns true on success; throws std::runtime_error naming the
  // call when it failed, or when `timeout` ran out first (the call then goes on and fails on its
  // own deadline if it never completes). As torch's Work.wait(timeout).
  bool wait(std::optional<Duration> timeout = std::nullopt);

  // Non-blocking: true once the call finished, successfully or not.
  bool is_completed();
  // Non-blocking: true once the call finished successfully.
  bool is_success();
  // Non-blocking: the failure as an exception (std::runtime_error), null while pending or after
  // success. As torch's Work.exception().
  std::exception_ptr exception();
  // Non-blocking: the failure as a Status; OK while pending or after success.
  Status status();

  const std::string& op() const { return op_; }

 private:
  // Runs finish_ once every transfer completed; returns whether the Work is settled.
  bool settle_if_done();

  const std::string op_;
  const std::vector<std::shared_ptr<comm::Work>> transfers_;
  std::mutex mutex_;
  Finish finish_;  // cleared once run
  std::optional<Status> result_;
};

// A Work that already finished with `status` (a call with nothing to transfer).
std::shared_ptr<Work> finished_work(std::string op, Status status = ok_status());

// A Work that completes when `first` does and then runs `finish` with its result (torch's
// future.then(): a communication hook decompressing a bucket after its allreduce).
std::shared_ptr<Work> then(std::shared_ptr<Work> first, std::string op, Work::Finish finish);

// `work` as a communicator Work (worker/comm/work.h), for code that waits on those: wait()
// settles `work` and returns its Status instead of throwing.
std::shared_ptr<comm::Work> as_comm_work(std::shared_ptr<Work> work);

}  // namespace cohort::distributed
