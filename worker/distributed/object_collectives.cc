#include "worker/distributed/object_collectives.h"

#include <numeric>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include "worker/distributed/point_to_point.h"
#include "worker/distributed/tensor_staging.h"

namespace cohort::distributed {

using internal::fail;

namespace {

std::string pickle(const c10::IValue& value) {
  std::vector<char> bytes = torch::jit::pickle_save(value);
  return std::string(bytes.begin(), bytes.end());
}

c10::IValue unpickle(const std::string& bytes) {
  return torch::jit::pickle_load(std::vector<char>(bytes.begin(), bytes.end()));
}

// A list travels as one pickled tuple, so its elements may have different types.
std::string pickle_list(const std::vector<c10::IValue>& list) {
  return pickle(c10::ivalue::Tuple::create(std::vector<c10::IValue>(list)));
}

std::vector<c10::IValue> unpickle_list(const std::string& bytes) {
  c10::IValue value = unpickle(bytes);
  const auto& elements = value.toTupleRef().elements();
  return std::vector<c10::IValue>(elements.begin(), elements.end());
}

// The communicator options of one object call: blocking, bounded by options.timeout. The object
// calls chain two transfers (lengths, then bytes) whose second needs the first's result on this
// thread, so they cannot return a pending Work; async_op is refused rather than ignored.
comm::CallOptions object_call(const OpOptions& options, const std::string& op) {
  if (options.async_op) {
    fail(op,
         "object collectives are blocking, as torch.distributed's; async_op is not supported "
         "(use the tensor calls for async_op)");
  }
  comm::CallOptions call;
  call.timeout = options.timeout;
  call.blocking = true;
  return call;
}

void check(const Status& status, const std::string& op) {
  if (!status.ok()) fail(op, status.to_string());
}

// Splits `all` into pieces of `counts` bytes.
std::vector<std::string> split_bytes(const std::string& all, const std::vector<size_t>& counts) {
  std::vector<std::string> out;
  size_t offset = 0;
  for (size_t count : counts) {
    out.push_back(all.substr(offset, count));
    offset += count;
  }
  return out;
}

void check_root(const Communicator& group, int root, const std::string& op) {
  if (root < 0 || root >= group.size()) {
    fail(op, fmt::format("rank {} is not in the group (0..{})", root, group.size() - 1));
  }
}

}  // namespace

// The object transfers are those of Communicator::bcast_obj / allgather_obj / gather_obj (length,
// then bytes), with this call's timeout.
void broadcast_object_list(Communicator& group, std::vector<c10::IValue>& object_list, int src,
                           const OpOptions& options) {
  const std::string name = fmt::format("broadcast_object_list from rank {}", src);
  check_root(group, src, name);
  const comm::CallOptions call = object_call(options, name);
  const bool is_src = group.rank() == src;
  std::string bytes = is_src ? pickle_list(object_list) : std::string();
  int64_t length = static_cast<int64_t>(bytes.size());
  check(group.broadcast(&length, 1, comm::DataType::kInt64, src, call)->wait(), name);
  bytes.resize(static_cast<size_t>(length));
  check(group.broadcast(bytes.data(), bytes.size(), comm::DataType::kUInt8, src, call)->wait(), name);
  if (!is_src) object_list = unpickle_list(bytes);
}

void all_gather_object(Communicator& group, std::vector<c10::IValue>& object_list, const c10::IValue& obj,
                       const OpOptions& options) {
  const std::string name = "all_gather_object";
  const comm::CallOptions call = object_call(options, name);
  const std::string bytes = pickle(obj);
  int64_t length = static_cast<int64_t>(bytes.size());
  std::vector<int64_t> lengths(group.size());
  check(group.allgather(&length, lengths.data(), 1, comm::DataType::kInt64, call)->wait(), name);
  std::vector<size_t> counts(lengths.begin(), lengths.end());
  std::string received(std::accumulate(counts.begin(), counts.end(), size_t{0}), '\0');
  check(group.allgatherv(bytes.data(), received.data(), counts, comm::DataType::kUInt8, call)->wait(), name);
  std::vector<std::string> all = split_bytes(received, counts);
  object_list.clear();
  for (const std::string& bytes : all) object_list.push_back(unpickle(bytes));
}

void gather_object(Communicator& group, const c10::IValue& obj, std::vector<c10::IValue>* object_gather_list,
                   int dst, const OpOptions& options) {
  const std::string name = fmt::format("gather_object to rank {}", dst);
  check_root(group, dst, name);
  const comm::CallOptions call = object_call(options, name);
  const bool is_dst = group.rank() == dst;
  const std::string bytes = pickle(obj);
  int64_t length = static_cast<int64_t>(bytes.size());
  std::vector<int64_t> lengths(group.size());
  check(group.gather(&length, lengths.data(), 1, comm::DataType::kInt64, dst, call)->wait(), name);
  std::vector<size_t> counts(group.size(), 0);
  if (is_dst) {
    counts.assign(lengths.begin(), lengths.end());
  } else {
    counts[group.rank()] = bytes.size();  // off dst only this rank's count matters
  }
  std::string received(is_dst ? std::accumulate(counts.begin(), counts.end(), size_t{0}) : 0, '\0');
  check(group.gatherv(bytes.data(), received.data(), counts, comm::DataType::kUInt8, dst, call)->wait(),
        name);
  if (!is_dst) return;
  std::vector<std::string> all = split_bytes(received, counts);
  if (object_gather_list == nullptr) fail(name, "object_gather_list is null on the destination rank");
  object_gather_list->clear();
  for (const std::string& bytes : all) object_gather_list->push_back(unpickle(bytes));
}

void scatter_object_list(Communicator& group, std::vector<c10::IValue>& output_list,
                         const std::vector<c10::IValue>& input_list, int src, const OpOptions& options) {
  const std::string name = fmt::format("scatter_object_list from rank {}", src);
  check_root(group, src, name);
  const comm::CallOptions blocking = object_call(options, name);
  const bool is_src = group.rank() == src;
  if (is_src && static_cast<int>(input_list.size()) != group.size()) {
    fail(name, fmt::format("input_list has {} objects; it needs one per rank ({})", input_list.size(),
                           group.size()));
  }
  // Lengths first (scatter), then the bytes (scatterv), as Communicator::gather_obj does.
  std::vector<int64_t> lengths(group.size(), 0);
  std::string all;
  if (is_src) {
    for (int r = 0; r < group.size(); ++r) {
      std::string bytes = pickle(input_list[r]);
      lengths[r] = static_cast<int64_t>(bytes.size());
      all += bytes;
    }
  }
  int64_t length = 0;
  Status status = group.scatter(lengths.data(), &length, 1, comm::DataType::kInt64, src, blocking)->wait();
  if (!status.ok()) fail(name, status.to_string());
  std::vector<size_t> counts(group.size(), 0);
  if (is_src) {
    counts.assign(lengths.begin(), lengths.end());
  } else {
    counts[group.rank()] = static_cast<size_t>(length);  // off src only this rank's count matters
  }
  std::string mine(static_cast<size_t>(length), '\0');
  status = group.scatterv(all.data(), counts, mine.data(), comm::DataType::kUInt8, src, blocking)->wait();
  if (!status.ok()) fail(name, status.to_string());
  output_list.assign(1, unpickle(mine));
}

void send_obj(Communicator& group, const c10::IValue& obj, int dest, uint32_t tag, const OpOptions& options) {
  object_call(options, fmt::format("send_obj to rank {} (tag {})", dest, tag));
  std::string bytes = pickle(obj);
  at::Tensor data = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), static_cast<char*>(data.data_ptr()));
  send(group, data, dest, tag, options);
}

c10::IValue recv_obj(Communicator& group, int source, uint32_t tag, const OpOptions& options) {
  object_call(options, fmt::format("recv_obj from rank {} (tag {})", source, tag));
  at::Tensor data = recv(group, source, tag, at::kCPU, options);
  const char* begin = static_cast<const char*>(data.data_ptr());
  return unpickle(std::string(begin, begin + data.numel()));
}

}  // namespace cohort::distributed
