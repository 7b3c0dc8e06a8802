#include "worker/comm/store/wire_format.h"

#include <type_traits>

namespace cohort::comm {
namespace {

template <typename T>
void append_little_endian(std::string* out, T value) {
  auto bits = static_cast<std::make_unsigned_t<T>>(value);
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

template <typename T>
T read_little_endian(std::string_view bytes) {
  std::make_unsigned_t<T> bits = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    bits |= static_cast<std::make_unsigned_t<T>>(static_cast<uint8_t>(bytes[i])) << (8 * i);
  }
  return static_cast<T>(bits);
}

}  // namespace

WireWriter& WireWriter::u8(uint8_t value) {
  bytes_.push_back(static_cast<char>(value));
  return *this;
}

WireWriter& WireWriter::u32(uint32_t value) {
  append_little_endian(&bytes_, value);
  return *this;
}

WireWriter& WireWriter::i64(int64_t value) {
  append_little_endian(&bytes_, value);
  return *this;
}

WireWriter& WireWriter::str(std::string_view value) {
  u32(static_cast<uint32_t>(value.size()));
  bytes_.append(value);
  return *this;
}

WireWriter& WireWriter::strs(const std::vector<std::string>& values) {
  u32(static_cast<uint32_t>(values.size()));
  for (const std::string& value : values) str(value);
  return *this;
}

bool WireReader::take(size_t n, std::string_view* out) {
  if (bytes_.size() - position_ < n) return false;
  *out = bytes_.substr(position_, n);
  position_ += n;
  return true;
}

bool WireReader::u8(uint8_t* value) {
  std::string_view raw;
  if (!take(1, &raw)) return false;
  *value = static_cast<uint8_t>(raw[0]);
  return true;
}

bool WireReader::u32(uint32_t* value) {
  std::string_view raw;
  if (!take(sizeof(uint32_t), &raw)) return false;
  *value = read_little_endian<uint32_t>(raw);
  return true;
}

bool WireReader::i64(int64_t* value) {
  std::string_view raw;
  if (!take(sizeof(int64_t), &raw)) return false;
  *value = read_little_endian<int64_t>(raw);
  return true;
}

bool WireReader::str(std::string* value) {
  // All-or-nothing: on a short string, rewind past the length too.
  const size_t start = position_;
  uint32_t size = 0;
  std::string_view raw;
  if (!u32(&size) || !take(size, &raw)) {
    position_ = start;
    return false;
  }
  value->assign(raw);
  return true;
}

bool WireReader::strs(std::vector<std::string>* values, uint32_t max_count) {
  const size_t start = position_;
  uint32_t count = 0;
  if (!u32(&count)) return false;
  // Each string takes at least its u32 length.
  if (count > max_count || count > (bytes_.size() - position_) / sizeof(uint32_t)) {
    position_ = start;
    return false;
  }
  std::vector<std::string> out;
  out.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    std::string value;
    if (!str(&value)) {
      position_ = start;
      return false;
    }
    out.push_back(std::move(value));
  }
  *values = std::move(out);
  return true;
}

}  // namespace cohort::comm
