// Fuzzes the store's byte encoding (wire_format.h) and the tcp store's framing
// (tcp_store_protocol.h): the file store's log and every tcp store frame are read with them.
//
// The input is read as a stream of fields; each field's kind is chosen by the byte before it.
// Invariants (the readers' documented contract):
//   - a read that fails consumes nothing (all-or-nothing, so a truncated record is detected);
//   - a read that succeeds consumed exactly the bytes WireWriter writes for the value read back;
//   - a frame length is accepted exactly when it is within kTcpStoreMaxFrameBytes, and
//     tcp_store_frame's header reads back as its body's length.

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "worker/comm/store/tcp_store_protocol.h"
#include "worker/comm/store/wire_format.h"

namespace {

using cohort::comm::WireReader;
using cohort::comm::WireWriter;

void check(bool condition, const char* what) {
  if (condition) return;
  std::fprintf(stderr, "wire_format_fuzzer: invariant broken: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);

  // Framing.
  if (size >= cohort::comm::kTcpStoreFrameHeaderBytes) {
    uint32_t raw = 0;
    check(WireReader(input).u32(&raw), "a 4-byte header did not read as a u32");
    const auto length = cohort::comm::tcp_store_frame_length(input);
    check(length.ok() == (raw <= cohort::comm::kTcpStoreMaxFrameBytes), "frame length accepted wrongly");
    if (length.ok()) check(*length == raw, "frame length differs from its header");
  } else {
    check(!cohort::comm::tcp_store_frame_length(input).ok(), "a short header was accepted");
  }
  const std::string frame = cohort::comm::tcp_store_frame(input);
  const auto framed = cohort::comm::tcp_store_frame_length(frame);
  if (size <= cohort::comm::kTcpStoreMaxFrameBytes) check(framed.ok() && *framed == size, "frame round trip");

  // Fields.
  WireReader reader(input);
  while (!reader.at_end()) {
    uint8_t kind = 0;
    check(reader.u8(&kind), "u8 failed with bytes left");
    const size_t start = reader.position();
    WireWriter expected;
    bool ok = false;
    switch (kind % 5) {
      case 0: {
        uint8_t value = 0;
        if ((ok = reader.u8(&value))) expected.u8(value);
        break;
      }
      case 1: {
        uint32_t value = 0;
        if ((ok = reader.u32(&value))) expected.u32(value);
        break;
      }
      case 2: {
        int64_t value = 0;
        if ((ok = reader.i64(&value))) expected.i64(value);
        break;
      }
      case 3: {
        std::string value;
        if ((ok = reader.str(&value))) expected.str(value);
        break;
      }
      default: {
        std::vector<std::string> values;
        // The kind byte's high bits pick a count limit, so the max_count refusal is reached too.
        const uint32_t max_count = kind >= 128 ? kind % 8 : UINT32_MAX;
        if ((ok = reader.strs(&values, max_count))) {
          check(values.size() <= max_count, "strs returned more than max_count");
          expected.strs(values);
        }
        break;
      }
    }
    if (!ok) {
      check(reader.position() == start, "a failed read consumed bytes");
      break;
    }
    check(input.substr(start, reader.position() - start) == expected.bytes(),
          "the bytes read differ from the value written back");
  }
  return 0;
}
