#pragma once

// Test helper: comparisons that throw (rank threads and forked ranks turn exceptions into
// failures naming the rank), with both tensors in the message.

#include <sstream>
#include <stdexcept>
#include <string>

#include <ATen/ATen.h>

namespace cohort::distributed::testing {

inline std::string text_of(const at::Tensor& t) {
  std::ostringstream out;
  out << t;
  return out.str();
}

inline void expect_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!got.defined() || got.sizes() != want.sizes() || got.scalar_type() != want.scalar_type() ||
      !at::equal(got, want)) {
    throw std::runtime_error(what + ": got\n" + (got.defined() ? text_of(got) : "undefined") +
                             "\nexpected\n" + text_of(want));
  }
}

// Runs `call`, which must throw; returns the message (throws when it did not).
template <typename Call>
std::string error_of(Call&& call, const std::string& what) {
  try {
    call();
  } catch (const std::exception& e) {
    return e.what();
  }
  throw std::runtime_error(what + ": expected an error, the call succeeded");
}

inline void expect_contains(const std::string& text, const std::string& part, const std::string& what) {
  if (text.find(part) == std::string::npos) {
    throw std::runtime_error(what + ": '" + text + "' does not contain '" + part + "'");
  }
}

}  // namespace cohort::distributed::testing
