#pragma once

// The options every call of the tensor-level API takes (torch.distributed's `async_op`, and a
// per-call timeout as c10d's ProcessGroup options give).

#include <optional>

#include "worker/comm/deadline.h"

namespace cohort::distributed {

struct OpOptions {
  bool async_op = false;                  // return at once with a pending Work; else block and throw
  std::optional<comm::Duration> timeout;  // this call's limit; unset: the communicator's timeout
};

}  // namespace cohort::distributed
