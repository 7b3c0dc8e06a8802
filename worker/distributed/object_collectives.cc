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

template <typename T>
T value_or_throw(StatusOr<T> result, const std::string& op) {
  if (!result.ok()) fail(op, result.status().to_string());
  return std::move(result).value();
}

void check_root(const Communicator& group, int root, const std::string& op) {
  if (root < 0 || root >= group.size()) {
    fail(op, fmt::format("rank {} is not in the group (0..{})", root, group.size() - 1));
  }
}

}  // namespace

void broadcast_object_list(Communicator& group, std::vector<c10::IValue>& object_list, int src) {
  const std::string name = fmt::format("broadcast_object_list from rank {}", src);
  check_root(group, src, name);
  std::string bytes = group.rank() == src ? pickle_list(object_list) : std::string();
  bytes = value_or_throw(group.bcast_obj(bytes, src), name);
  if (group.rank() != src) object_list = unpickle_list(bytes);
}

void all_gather_object(Communicator& group, std::vector<c10::IValue>& object_list, const c10::IValue& obj) {
  const std::string name = "all_gather_object";
  std::vector<std::string> all = value_or_throw(group.allgather_obj(pickle(obj)), name);
  object_list.clear();
  for (const std::string& bytes : all) object_list.push_back(unpickle(bytes));
}

void gather_object(Communicator& group, const c10::IValue& obj, std::vector<c10::IValue>* object_gather_list,
                   int dst) {
  const std::string name = fmt::format("gather_object to rank {}", dst);
  check_root(group, dst, name);
  std::vector<std::string> all = value_or_throw(group.gather_obj(pickle(obj), dst), name);
  if (group.rank() != dst) return;
  if (object_gather_list == nullptr) fail(name, "object_gather_list is null on the destination rank");
  object_gather_list->clear();
  for (const std::string& bytes : all) object_gather_list->push_back(unpickle(bytes));
}

void scatter_object_list(Communicator& group, std::vector<c10::IValue>& output_list,
                         const std::vector<c10::IValue>& input_list, int src) {
  const std::string name = fmt::format("scatter_object_list from rank {}", src);
  check_root(group, src, name);
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
  comm::CallOptions blocking;
  blocking.blocking = true;
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

void send_obj(Communicator& group, const c10::IValue& obj, int dest, uint32_t tag) {
  std::string bytes = pickle(obj);
  at::Tensor data = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::copy(bytes.begin(), bytes.end(), static_cast<char*>(data.data_ptr()));
  send(group, data, dest, tag);
}

c10::IValue recv_obj(Communicator& group, int source, uint32_t tag) {
  at::Tensor data = recv(group, source, tag);
  const char* begin = static_cast<const char*>(data.data_ptr());
  return unpickle(std::string(begin, begin + data.numel()));
}

}  // namespace cohort::distributed
