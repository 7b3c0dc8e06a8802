#include "worker/comm/store/key_value_table.h"

#include <charconv>

namespace cohort::comm {
namespace {

// Parses the whole of `text` as a decimal int64 (an optional '-' and digits, nothing else).
bool parse_int64(std::string_view text, int64_t* value) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end;
}

}  // namespace

void KeyValueTable::set(std::string_view key, std::string_view value) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    entries_.emplace(std::string(key), std::string(value));
    bytes_ += key.size() + value.size();
  } else {
    bytes_ = bytes_ - it->second.size() + value.size();
    it->second.assign(value);
  }
}

const std::string* KeyValueTable::find(std::string_view key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

StatusOr<int64_t> KeyValueTable::add(std::string_view key, int64_t delta) {
  int64_t current = 0;
  if (const std::string* value = find(key); value != nullptr && !parse_int64(*value, &current)) {
    return invalid_argument_error(
        "add({:?}, {}): the key holds {:?}, not a decimal integer; add() needs a key that is unset "
        "or was only ever written by add()",
        key, delta, value->substr(0, 64));
  }
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return out_of_range_error("add({:?}, {}): {} + {} overflows int64", key, delta, current, delta);
  }
  set(key, std::to_string(sum));
  return sum;
}

std::string KeyValueTable::compare_set(std::string_view key, std::string_view expected,
                                       std::string_view desired, bool* swapped) {
  const std::string* current = find(key);
  const bool matches = current == nullptr ? expected.empty() : *current == expected;
  if (swapped != nullptr) *swapped = matches;
  if (!matches) return current == nullptr ? std::string() : *current;
  set(key, desired);
  return std::string(desired);
}

bool KeyValueTable::erase(std::string_view key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return false;
  bytes_ -= it->first.size() + it->second.size();
  entries_.erase(it);
  return true;
}

std::vector<std::string> KeyValueTable::missing(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  for (const std::string& key : keys) {
    if (find(key) == nullptr) out.push_back(key);
  }
  return out;
}

bool KeyValueTable::contains_all(const std::vector<std::string>& keys) const {
  for (const std::string& key : keys) {
    if (find(key) == nullptr) return false;
  }
  return true;
}

}  // namespace cohort::comm
