#pragma once

// The byte encoding shared by the file store's log and the tcp store's protocol: fixed-width
// little-endian integers and length-prefixed strings. Explicit little-endian (not host order) so a
// store file or a connection between machines of different byte order reads the same.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cohort::comm {

// Appends encoded fields to a byte string. Not thread-safe; cheap to create per message.
class WireWriter {
 public:
  WireWriter& u8(uint8_t value);
  WireWriter& u32(uint32_t value);
  WireWriter& i64(int64_t value);
  // A u32 length followed by the bytes.
  WireWriter& str(std::string_view value);
  // A u32 count followed by each string.
  WireWriter& strs(const std::vector<std::string>& values);

  const std::string& bytes() const { return bytes_; }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

// Reads fields from a byte string it does not own. Each reader returns false (and reads nothing)
// when the remaining bytes are too few, so a truncated record or frame is detected, never
// over-read.
class WireReader {
 public:
  explicit WireReader(std::string_view bytes) : bytes_(bytes) {}

  bool u8(uint8_t* value);
  bool u32(uint32_t* value);
  bool i64(int64_t* value);
  bool str(std::string* value);
  // False also when the count exceeds `max_count`, or exceeds what the remaining bytes could hold,
  // so a forged count cannot make the reader reserve or loop beyond the input.
  bool strs(std::vector<std::string>* values, uint32_t max_count = UINT32_MAX);

  // Bytes consumed so far.
  size_t position() const { return position_; }
  bool at_end() const { return position_ == bytes_.size(); }

 private:
  bool take(size_t n, std::string_view* out);

  std::string_view bytes_;
  size_t position_ = 0;
};

}  // namespace cohort::comm
