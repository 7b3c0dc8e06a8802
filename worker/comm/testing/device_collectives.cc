#include "worker/comm/testing/device_collectives.h"

#include <cstring>
#include <functional>
#include <numeric>

#include "worker/comm/testing/typed_values.h"

namespace cohort::comm::testing {
namespace {

// One call of the check: its buffers' sizes and how to issue it.
struct Case {
  std::string name;
  size_t send_elements = 0;  // 0: no send buffer (in place, or p2p receive only)
  size_t recv_elements = 0;
  bool in_place = false;  // recv holds the input: send is passed as null
  std::function<Status(Communicator&, const void* send, void* recv)> run;
};

bool is_float(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 || dtype == DataType::kFloat32 ||
         dtype == DataType::kFloat64;
}

// Small integers that differ by rank, case and element.
std::vector<uint8_t> pattern(DataType dtype, size_t elements, int rank, size_t salt) {
  std::vector<uint8_t> bytes(std::max<size_t>(elements, 1) * element_size(dtype));
  for (size_t i = 0; i < elements; ++i) {
    write_value(bytes.data(), dtype, i,
                static_cast<double>((static_cast<size_t>(rank) * 7 + i * 3 + salt) % 11));
  }
  return bytes;
}

Status wait(const std::shared_ptr<Work>& work) { return work->wait(); }

std::vector<Case> cases(const Communicator& comm, DataType dtype, size_t n, bool point_to_point) {
  const int p = comm.size();
  const int me = comm.rank();
  const size_t total = n * static_cast<size_t>(p);
  std::vector<size_t> uneven(p);
  for (int r = 0; r < p; ++r) uneven[r] = n + static_cast<size_t>(r);
  const size_t uneven_total = std::accumulate(uneven.begin(), uneven.end(), size_t{0});
  // alltoallv: rank a sends n + (a + b) % 3 elements to rank b (symmetric, so counts agree).
  std::vector<size_t> pair_counts(p);
  for (int r = 0; r < p; ++r) pair_counts[r] = n + static_cast<size_t>((me + r) % 3);
  const size_t pair_total = std::accumulate(pair_counts.begin(), pair_counts.end(), size_t{0});

  std::vector<Case> list;
  auto add = [&](std::string name, size_t send, size_t recv, bool in_place,
                 std::function<Status(Communicator&, const void*, void*)> run) {
    list.push_back(Case{std::move(name), send, recv, in_place, std::move(run)});
  };
  add("allreduce sum", n, n, false, [=](Communicator& c, const void* s, void* r) {
    return wait(c.allreduce(s, r, n, dtype, ReduceOp::kSum));
  });
  add("allreduce sum in place", 0, n, true, [=](Communicator& c, const void*, void* r) {
    return wait(c.allreduce(nullptr, r, n, dtype, ReduceOp::kSum));
  });
  add("allreduce max in place", 0, n, true, [=](Communicator& c, const void*, void* r) {
    return wait(c.allreduce(r, r, n, dtype, ReduceOp::kMax));
  });
  if (is_float(dtype)) {
    add("allreduce avg", n, n, false, [=](Communicator& c, const void* s, void* r) {
      return wait(c.allreduce(s, r, n, dtype, ReduceOp::kAvg));
    });
  }
  add("reduce sum to the last rank", n, n, false, [=](Communicator& c, const void* s, void* r) {
    return wait(c.reduce(s, r, n, dtype, ReduceOp::kSum, p - 1));
  });
  add("reduce min to rank 0 in place", 0, n, true, [=](Communicator& c, const void*, void* r) {
    return wait(c.reduce(nullptr, r, n, dtype, ReduceOp::kMin, 0));
  });
  add("broadcast from the last rank", 0, n, true,
      [=](Communicator& c, const void*, void* r) { return wait(c.broadcast(r, n, dtype, p - 1)); });
  add("allgather", n, total, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.allgather(s, r, n, dtype)); });
  add("allgather in place", 0, total, true,
      [=](Communicator& c, const void*, void* r) { return wait(c.allgather(nullptr, r, n, dtype)); });
  add("allgatherv", uneven[me], uneven_total, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.allgatherv(s, r, uneven, dtype)); });
  add("gather to rank 0", n, total, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.gather(s, r, n, dtype, 0)); });
  add("gatherv to the last rank", uneven[me], uneven_total, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.gatherv(s, r, uneven, dtype, p - 1)); });
  add("scatter from rank 0", total, n, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.scatter(s, r, n, dtype, 0)); });
  add("scatterv from the last rank", uneven_total, uneven[me], false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.scatterv(s, uneven, r, dtype, p - 1)); });
  add("reduce_scatter sum", total, n, false, [=](Communicator& c, const void* s, void* r) {
    return wait(c.reduce_scatter(s, r, n, dtype, ReduceOp::kSum));
  });
  add("reduce_scatterv max", uneven_total, uneven[me], false, [=](Communicator& c, const void* s, void* r) {
    return wait(c.reduce_scatterv(s, r, uneven, dtype, ReduceOp::kMax));
  });
  add("alltoall", total, total, false,
      [=](Communicator& c, const void* s, void* r) { return wait(c.alltoall(s, r, n, dtype)); });
  add("alltoallv", pair_total, pair_total, false, [=](Communicator& c, const void* s, void* r) {
    return wait(c.alltoallv(s, pair_counts, r, pair_counts, dtype));
  });
  if (point_to_point && p > 1) {
    add("isend/irecv ring", n, n, false, [=](Communicator& c, const void* s, void* r) {
      auto received = c.irecv(r, n, dtype, (me + p - 1) % p, 5);
      auto sent = c.isend(s, n, dtype, (me + 1) % p, 5);
      Status status = sent->wait();
      Status arrival = received->wait();
      return status.ok() ? arrival : status;
    });
  }
  return list;
}

// Where send and receive buffers of one run live.
enum class Placement { kSpace, kSendOnHost, kRecvOnHost };

const char* placement_name(Placement placement) {
  switch (placement) {
    case Placement::kSpace:
      return "";
    case Placement::kSendOnHost:
      return " (send buffer on the host)";
    case Placement::kRecvOnHost:
      return " (receive buffer on the host)";
  }
  return "";
}

// The first differing element of two equally sized buffers, or "".
std::string first_difference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                             DataType dtype, size_t elements) {
  if (std::memcmp(got.data(), want.data(), elements * element_size(dtype)) == 0) return "";
  for (size_t i = 0; i < elements; ++i) {
    if (std::memcmp(got.data() + i * element_size(dtype), want.data() + i * element_size(dtype),
                    element_size(dtype)) != 0) {
      return fmt::format("element {} is {}, expected {}", i, read_value(got.data(), dtype, i),
                         read_value(want.data(), dtype, i));
    }
  }
  return "";
}

}  // namespace

void* HostSpace::allocate(size_t bytes) {
  blocks_.push_back(std::make_unique<std::vector<uint8_t>>(std::max<size_t>(bytes, 1)));
  return blocks_.back()->data();
}

Status HostSpace::upload(void* to, const void* host, size_t bytes) {
  if (bytes > 0) std::memcpy(to, host, bytes);
  return ok_status();
}

Status HostSpace::download(void* host, const void* from, size_t bytes) {
  if (bytes > 0) std::memcpy(host, from, bytes);
  return ok_status();
}

Status check_every_collective(Communicator& comm, BufferSpace& space, DataType dtype,
                              const CheckOptions& options) {
  const size_t esize = element_size(dtype);
  HostSpace host_space;
  std::vector<Case> list = cases(comm, dtype, options.count, options.point_to_point);
  for (size_t k = 0; k < list.size(); ++k) {
    const Case& c = list[k];
    const std::vector<uint8_t> send_input = pattern(dtype, c.send_elements, comm.rank(), k);
    const std::vector<uint8_t> recv_input = pattern(dtype, c.recv_elements, comm.rank(), k + 100);
    const size_t send_bytes = c.send_elements * esize;
    const size_t recv_bytes = c.recv_elements * esize;

    // The reference: host buffers.
    std::vector<uint8_t> want_send = send_input;
    std::vector<uint8_t> want = recv_input;
    COHORT_RETURN_IF_ERROR(c.run(comm, c.in_place ? nullptr : want_send.data(), want.data())
                               .with_context(fmt::format("{} on host buffers", c.name)));

    std::vector<Placement> placements = {Placement::kSpace};
    if (options.mixed && !c.in_place && c.send_elements > 0) {
      placements.push_back(Placement::kSendOnHost);
      placements.push_back(Placement::kRecvOnHost);
    }
    for (Placement placement : placements) {
      const std::string what = fmt::format("{} on {} buffers{}, rank {} of {}", c.name, space.name(),
                                           placement_name(placement), comm.rank(), comm.size());
      BufferSpace& send_space = placement == Placement::kSendOnHost ? host_space : space;
      BufferSpace& recv_space = placement == Placement::kRecvOnHost ? host_space : space;
      void* send = c.in_place ? nullptr : send_space.allocate(send_bytes);
      void* recv = recv_space.allocate(recv_bytes);
      if (send != nullptr) COHORT_RETURN_IF_ERROR(send_space.upload(send, send_input.data(), send_bytes));
      COHORT_RETURN_IF_ERROR(recv_space.upload(recv, recv_input.data(), recv_bytes));
      COHORT_RETURN_IF_ERROR(c.run(comm, send, recv).with_context(what));
      std::vector<uint8_t> got(std::max<size_t>(recv_bytes, 1));
      COHORT_RETURN_IF_ERROR(recv_space.download(got.data(), recv, recv_bytes));
      std::string diff = first_difference(got, want, dtype, c.recv_elements);
      if (!diff.empty()) return internal_error("{}: receive buffer {}", what, diff);
      if (send != nullptr) {
        std::vector<uint8_t> after(std::max<size_t>(send_bytes, 1));
        COHORT_RETURN_IF_ERROR(send_space.download(after.data(), send, send_bytes));
        diff = first_difference(after, send_input, dtype, c.send_elements);
        if (!diff.empty()) return internal_error("{}: the send buffer changed: {}", what, diff);
      }
    }
  }
  return ok_status();
}

}  // namespace cohort::comm::testing
