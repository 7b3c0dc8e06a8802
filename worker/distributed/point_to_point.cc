#include "worker/distributed/point_to_point.h"

#include <array>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "worker/distributed/tensor_staging.h"

namespace cohort::distributed {

using internal::fail;
using internal::StagedTensor;

namespace {

using Header = autograd::TensorHeader;

void check_tag(uint32_t tag, const std::string& op) {
  if (tag > kMaxTag)
    fail(op, fmt::format("tag {} exceeds the maximum {} (tags above are reserved)", tag, kMaxTag));
}

std::string describe(at::ScalarType type, at::IntArrayRef shape) { return autograd::describe_tensor(type, shape); }

std::shared_ptr<Header> header_of(const at::Tensor& t, const std::string& op) {
  StatusOr<Header> header = autograd::make_tensor_header(t.scalar_type(), t.sizes());
  if (!header.ok()) fail(op, header.status().message());
  return std::make_shared<Header>(*header);
}

// The dtype and shape a received header announces; INVALID_ARGUMENT for a malformed one.
Status parse_header(const Header& header, at::ScalarType* type, std::vector<int64_t>* shape) {
  return autograd::parse_tensor_header(header, type, shape);
}

comm::CallOptions p2p_call(const OpOptions& options) {
  comm::CallOptions call;
  call.timeout = options.timeout;
  return call;  // never blocking: the header and the data are posted together
}

OpOptions async(OpOptions options) {
  options.async_op = true;
  return options;
}

std::string send_name(int dst, uint32_t tag) { return fmt::format("send to rank {} (tag {})", dst, tag); }
std::string recv_name(int src, uint32_t tag) { return fmt::format("recv from rank {} (tag {})", src, tag); }

}  // namespace

std::shared_ptr<Work> isend(Communicator& group, const at::Tensor& tensor, int dst, uint32_t tag,
                            const OpOptions& options) {
  const std::string name = send_name(dst, tag);
  check_tag(tag, name);
  StagedTensor t(tensor, name);
  std::shared_ptr<Header> header = header_of(tensor, name);
  comm::CallOptions call = p2p_call(options);
  auto header_work =
      group.isend(header->data(), kHeaderWords, comm::DataType::kInt64, dst, tag | kHeaderTagBit, call);
  auto data_work = group.isend(t.data(), t.count(), t.dtype(), dst, tag, call);
  return internal::launch(name, async(options), {header_work, data_work},
                          [header, t](const Status& transfers) { return transfers; });
}

std::shared_ptr<Work> irecv(Communicator& group, const at::Tensor& tensor, int src, uint32_t tag,
                            const OpOptions& options) {
  const std::string name = recv_name(src, tag);
  check_tag(tag, name);
  StagedTensor t(tensor, name);
  auto header = std::make_shared<Header>();
  header->fill(0);
  comm::CallOptions call = p2p_call(options);
  auto header_work =
      group.irecv(header->data(), kHeaderWords, comm::DataType::kInt64, src, tag | kHeaderTagBit, call);
  auto data_work = group.irecv(t.data(), t.count(), t.dtype(), src, tag, call);
  return internal::launch(
      name, async(options), {header_work, data_work}, [header, t](const Status& transfers) {
        // A header that arrived explains a size mismatch better than the transport's error.
        if (autograd::is_tensor_header(*header)) {
          at::ScalarType type;
          std::vector<int64_t> shape;
          COHORT_RETURN_IF_ERROR(parse_header(*header, &type, &shape));
          const int64_t numel = c10::multiply_integers(shape);
          if (type != t.tensor().scalar_type() || numel != t.tensor().numel()) {
            return invalid_argument_error(
                "the sender sent {} but this rank posted {}: dtype and numel must match",
                describe(type, shape), describe(t.tensor().scalar_type(), t.tensor().sizes()));
          }
        }
        if (transfers.ok()) t.copy_back();
        return transfers;
      });
}

void send(Communicator& group, const at::Tensor& tensor, int dst, uint32_t tag, const OpOptions& options) {
  isend(group, tensor, dst, tag, options)->wait();
}

void recv(Communicator& group, const at::Tensor& tensor, int src, uint32_t tag, const OpOptions& options) {
  irecv(group, tensor, src, tag, options)->wait();
}

at::Tensor recv(Communicator& group, int src, uint32_t tag, at::Device device, const OpOptions& options) {
  const std::string name = recv_name(src, tag);
  check_tag(tag, name);
  Header header;
  header.fill(0);
  comm::CallOptions call = p2p_call(options);
  auto header_work =
      group.irecv(header.data(), kHeaderWords, comm::DataType::kInt64, src, tag | kHeaderTagBit, call);
  Work(name, {header_work}).wait();
  at::ScalarType type;
  std::vector<int64_t> shape;
  Status parsed = parse_header(header, &type, &shape);
  if (!parsed.ok()) fail(name, parsed.to_string());
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(type).device(device));
  StagedTensor t(out, name);
  Work(name, {group.irecv(t.data(), t.count(), t.dtype(), src, tag, call)}).wait();
  return out;
}

std::vector<std::shared_ptr<Work>> batch_isend_irecv(Communicator& group, const std::vector<P2POp>& ops,
                                                     const OpOptions& options) {
  std::vector<std::shared_ptr<Work>> works;
  for (const P2POp& op : ops) {
    works.push_back(op.kind == P2POp::Kind::kIsend ? isend(group, op.tensor, op.peer, op.tag, options)
                                                   : irecv(group, op.tensor, op.peer, op.tag, options));
  }
  return works;
}

}  // namespace cohort::distributed
