#pragma once

// FakeRendezvousJournal: a RendezvousJournal in memory for unit tests of Rendezvous and KvStore. It
// applies each write to a RendezvousState (what a coordinator taking over would read back), counts
// the writes, and fails every write while `fail` is set.

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "daemon/coordinator/rendezvous_journal.h"

namespace cohort::coordinator::testing {

class FakeRendezvousJournal final : public RendezvousJournal {
 public:
  Status write_progress(const RendezvousProgress& progress) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++writes_;
    if (fail_) return failed_precondition_error("journal write refused (test)");
    state_.progress = progress;
    return ok_status();
  }

  Status write_key(const std::string& key, const std::optional<std::string>& value,
                   const AnsweredRequest& answered, const std::vector<std::string>& forget) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++writes_;
    if (fail_) return failed_precondition_error("journal write refused (test)");
    if (value.has_value()) {
      state_.data[key] = *value;
    } else {
      state_.data.erase(key);
    }
    for (const std::string& id : forget) {
      state_.answered.erase(std::remove_if(state_.answered.begin(), state_.answered.end(),
                                           [&](const AnsweredRequest& a) { return a.id == id; }),
                            state_.answered.end());
    }
    if (!answered.id.empty()) state_.answered.push_back(answered);
    return ok_status();
  }

  void set_fail(bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = fail;
  }
  int writes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  RendezvousState state() const {
    std::lock_guard<std::mutex> lock(mu_);
    return state_;
  }

 private:
  mutable std::mutex mu_;
  bool fail_ = false;
  int writes_ = 0;  // tried, failed ones included
  RendezvousState state_;
};

}  // namespace cohort::coordinator::testing
