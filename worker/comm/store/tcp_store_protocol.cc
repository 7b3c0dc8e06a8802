#include "worker/comm/store/tcp_store_protocol.h"

#include "worker/comm/store/wire_format.h"

namespace cohort::comm {

std::string tcp_store_frame(std::string_view body) {
  std::string frame = WireWriter().u32(static_cast<uint32_t>(body.size())).take();
  frame.append(body);
  return frame;
}

StatusOr<uint32_t> tcp_store_frame_length(std::string_view header, uint32_t max_bytes) {
  uint32_t length = 0;
  if (!WireReader(header).u32(&length)) return invalid_argument_error("short frame header");
  if (length > max_bytes) {
    return invalid_argument_error(
        "frame of {} bytes exceeds the {} byte limit (kTcpStoreMaxFrameBytes, or "
        "kTcpStoreMaxHandshakeFrameBytes before the handshake; is the peer a cohort tcp store?)",
        length, max_bytes);
  }
  return length;
}

}  // namespace cohort::comm
