#include "worker/distributed/work.h"

#include <stdexcept>
#include <utility>

namespace cohort::distributed {

Work::Work(std::string op, std::vector<std::shared_ptr<comm::Work>> transfers, Finish finish)
    : op_(std::move(op)), transfers_(std::move(transfers)), finish_(std::move(finish)) {}

Work::~Work() {
  // The transfers may still read or write buffers this Work owns (captured by finish_): let them
  // end first. Each ends within its own deadline.
  for (const auto& transfer : transfers_) (void)transfer->wait();
}

bool Work::settle_if_done() {
  for (const auto& transfer : transfers_) {
    if (!transfer->is_completed()) return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (result_.has_value()) return true;
  Status status = ok_status();
  for (const auto& transfer : transfers_) {
    status = transfer->error();
    if (!status.ok()) break;
  }
  if (finish_) {
    try {
      status = finish_(status);
    } catch (const std::exception& e) {
      status = internal_error("{}", e.what());
    }
    finish_ = nullptr;
  }
  result_ = status.ok() ? status : status.with_context(op_);
  return true;
}

bool Work::wait(std::optional<Duration> timeout) {
  // Duration::max() would overflow a time point: without a timeout each transfer's own deadline
  // bounds the wait.
  std::optional<comm::Deadline> deadline;
  if (timeout.has_value()) deadline = comm::Deadline::after(*timeout);
  for (const auto& transfer : transfers_) {
    Status status = deadline.has_value() ? transfer->wait(deadline->remaining()) : transfer->wait();
    if (!transfer->is_completed()) {
      throw std::runtime_error(
          fmt::format("cohort distributed: {}: not finished within the wait timeout of {} ({})", op_,
                      comm::format_duration(*timeout), status.to_string()));
    }
  }
  settle_if_done();
  Status status = this->status();
  if (!status.ok()) throw std::runtime_error("cohort distributed: " + status.to_string());
  return true;
}

bool Work::is_completed() { return settle_if_done(); }

bool Work::is_success() { return settle_if_done() && status().ok(); }

std::exception_ptr Work::exception() {
  Status status = settle_if_done() ? this->status() : ok_status();
  if (status.ok()) return nullptr;
  return std::make_exception_ptr(std::runtime_error("cohort distributed: " + status.to_string()));
}

Status Work::status() {
  std::lock_guard<std::mutex> lock(mutex_);
  return result_.value_or(ok_status());
}

namespace {

class CommWorkAdapter : public comm::Work {
 public:
  explicit CommWorkAdapter(std::shared_ptr<distributed::Work> work) : work_(std::move(work)) {}

  using comm::Work::wait;
  Status wait(Duration timeout) override {
    try {
      // comm::Work::wait() passes Duration::max(): no limit beyond the call's own deadline.
      if (timeout == Duration::max()) {
        work_->wait();
      } else {
        work_->wait(timeout);
      }
    } catch (const std::exception& e) {
      if (!work_->is_completed()) return deadline_exceeded_error("{}", e.what());
    }
    return work_->status();
  }
  bool is_completed() override { return work_->is_completed(); }
  Status error() override { return work_->is_completed() ? work_->status() : ok_status(); }

 private:
  std::shared_ptr<distributed::Work> work_;
};

}  // namespace

std::shared_ptr<comm::Work> as_comm_work(std::shared_ptr<Work> work) {
  return std::make_shared<CommWorkAdapter>(std::move(work));
}

std::shared_ptr<Work> then(std::shared_ptr<Work> first, std::string op, Work::Finish finish) {
  std::vector<std::shared_ptr<comm::Work>> transfers = {as_comm_work(first)};
  return std::make_shared<Work>(std::move(op), std::move(transfers), std::move(finish));
}

std::shared_ptr<Work> finished_work(std::string op, Status status) {
  return std::make_shared<Work>(std::move(op),
                                std::vector<std::shared_ptr<comm::Work>>{comm::completed_work(status)});
}

}  // namespace cohort::distributed
