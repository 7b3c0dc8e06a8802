#pragma once

// Status / StatusOr<T>: cohort's one error model. Every fallible call in the daemon, the client,
// the config code and the communication core returns one of these; exactly one place maps them
// to grpc::Status (daemon/service/grpc_status.h) and one to C++ exceptions (worker/autograd).
//
// Error text says what failed, with which values, and what to do about it.

#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace cohort {

enum class StatusCode {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// The codes' numbers are gRPC's, so the mapping to grpc::Status is a cast.
std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "DEADLINE_EXCEEDED: allreduce ..." (or "OK").
  std::string to_string() const;

  // Returns this status with `context` prepended to the message ("context: message"); OK stays OK.
  Status with_context(std::string_view context) const;

  // Returns this status with `suffix` appended to the message; OK stays OK.
  Status with_suffix(std::string_view suffix) const {
    return ok() || suffix.empty() ? *this : Status(code_, message_ + std::string(suffix));
  }

  // Marks a status as deliberately ignored.
  void ignore_error() const {}

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }

// Constructors by code, taking fmt-style arguments: invalid_argument("bad rank {}", r).
#define COHORT_DEFINE_STATUS_FACTORY(fn, code)                              \
  template <typename... Args>                                               \
  Status fn(fmt::format_string<Args...> format, Args&&... args) {           \
    return Status(StatusCode::code, fmt::format(format, std::forward<Args>(args)...)); \
  }
COHORT_DEFINE_STATUS_FACTORY(cancelled_error, kCancelled)
COHORT_DEFINE_STATUS_FACTORY(unknown_error, kUnknown)
COHORT_DEFINE_STATUS_FACTORY(invalid_argument_error, kInvalidArgument)
COHORT_DEFINE_STATUS_FACTORY(deadline_exceeded_error, kDeadlineExceeded)
COHORT_DEFINE_STATUS_FACTORY(not_found_error, kNotFound)
COHORT_DEFINE_STATUS_FACTORY(already_exists_error, kAlreadyExists)
COHORT_DEFINE_STATUS_FACTORY(permission_denied_error, kPermissionDenied)
COHORT_DEFINE_STATUS_FACTORY(resource_exhausted_error, kResourceExhausted)
COHORT_DEFINE_STATUS_FACTORY(failed_precondition_error, kFailedPrecondition)
COHORT_DEFINE_STATUS_FACTORY(aborted_error, kAborted)
COHORT_DEFINE_STATUS_FACTORY(out_of_range_error, kOutOfRange)
COHORT_DEFINE_STATUS_FACTORY(unimplemented_error, kUnimplemented)
COHORT_DEFINE_STATUS_FACTORY(internal_error, kInternal)
COHORT_DEFINE_STATUS_FACTORY(unavailable_error, kUnavailable)
COHORT_DEFINE_STATUS_FACTORY(data_loss_error, kDataLoss)
COHORT_DEFINE_STATUS_FACTORY(unauthenticated_error, kUnauthenticated)
#undef COHORT_DEFINE_STATUS_FACTORY

// Status from errno after a failed libc call: "open(/tmp/x): No such file or directory".
Status errno_status(std::string_view call, int err);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  static_assert(!std::is_same_v<std::decay_t<T>, Status>, "StatusOr<Status> is meaningless");

  // Implicit from a value or an error, so `return value;` and `return error;` both read naturally.
  StatusOr(const T& value) : storage_(value) {}             // NOLINT(runtime/explicit)
  StatusOr(T&& value) : storage_(std::move(value)) {}       // NOLINT(runtime/explicit)
  StatusOr(Status status) : storage_(std::move(status)) {   // NOLINT(runtime/explicit)
    if (std::get<Status>(storage_).ok()) {
      storage_ = Status(StatusCode::kInternal, "StatusOr constructed from an OK status without a value");
    }
  }

  bool ok() const { return std::holds_alternative<T>(storage_); }
  Status status() const { return ok() ? Status() : std::get<Status>(storage_); }

  // Precondition: ok(). Checked: a violated precondition aborts with the error text.
  const T& value() const& { check_ok(); return std::get<T>(storage_); }
  T& value() & { check_ok(); return std::get<T>(storage_); }
  T&& value() && { check_ok(); return std::get<T>(std::move(storage_)); }
  const T& operator*() const& { return value(); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const T* operator->() const { return &value(); }
  T* operator->() { return &value(); }

  T value_or(T fallback) const& { return ok() ? std::get<T>(storage_) : std::move(fallback); }

 private:
  void check_ok() const;
  std::variant<Status, T> storage_;
};

[[noreturn]] void die_on_bad_status_access(const Status& status);

template <typename T>
void StatusOr<T>::check_ok() const {
  if (!ok()) die_on_bad_status_access(std::get<Status>(storage_));
}

}  // namespace cohort

#define COHORT_STATUS_CONCAT_INNER(a, b) a##b
#define COHORT_STATUS_CONCAT(a, b) COHORT_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is an error.
#define COHORT_RETURN_IF_ERROR(expr)                   \
  do {                                                 \
    ::cohort::Status cohort_status_ = (expr);          \
    if (!cohort_status_.ok()) return cohort_status_;   \
  } while (0)

// `COHORT_ASSIGN_OR_RETURN(auto x, f());` declares x from a StatusOr, or returns its error.
#define COHORT_ASSIGN_OR_RETURN(lhs, expr) \
  COHORT_ASSIGN_OR_RETURN_IMPL(COHORT_STATUS_CONCAT(cohort_statusor_, __LINE__), lhs, expr)
#define COHORT_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
