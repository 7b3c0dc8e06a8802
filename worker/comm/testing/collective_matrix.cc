#include "worker/comm/testing/collective_matrix.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "worker/comm/testing/typed_values.h"

namespace cohort::comm::testing {
namespace {

constexpr DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64,
                                  DataType::kInt8,    DataType::kUInt8,    DataType::kInt32,   DataType::kInt64};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
// Most ops run blocking (on the calling thread); allreduce goes through the executor queue, so
// both paths are covered.
const CallOptions kBlocking{std::chrono::seconds(60), true};
const CallOptions kAsync{std::chrono::seconds(60), false};

// Contribution of rank r at index i. Small integers keep every dtype (f16, i8) exact.
double input(ReduceOp op, int r, size_t i) {
  if (op == ReduceOp::kProduct) return 1 + ((r + i) % 2);
  return (r + 1) + static_cast<double>(i % 7);
}

double expected(ReduceOp op, DataType dtype, int n, size_t i) {
  double k = static_cast<double>(i % 7);
  switch (op) {
    case ReduceOp::kSum: return n * (n + 1) / 2.0 + n * k;
    case ReduceOp::kMin: return 1 + k;
    case ReduceOp::kMax: return n + k;
    case ReduceOp::kProduct: return std::pow(2.0, (i % 2 == 0) ? n / 2 : (n + 1) / 2);
    case ReduceOp::kAvg: {
      double sum = n * (n + 1) / 2.0 + n * k;
      return is_floating(dtype) ? sum / n : std::trunc(sum / n);
    }
  }
  return 0;
}

// Payload of rank r at index i for data-movement ops: fits every dtype exactly.
double payload(int r, size_t i) { return static_cast<double>((r * 31 + i) % 100); }

bool close_enough(double got, double want, DataType dtype) {
  if (!is_floating(dtype)) return got == want;
  double tolerance = (dtype == DataType::kFloat16 || dtype == DataType::kBFloat16) ? 1e-2 : 1e-6;
  return std::fabs(got - want) <= tolerance * std::max(1.0, std::fabs(want));
}

Status mismatch(const char* op, DataType dtype, const std::string& extra, size_t count, size_t i, double got,
                double want) {
  return internal_error("{} {} {} count {}: element {} is {} but should be {}", op, data_type_name(dtype), extra,
                        count, i, got, want);
}

class Matrix {
 public:
  explicit Matrix(Communicator& comm) : comm_(comm), n_(comm.size()), me_(comm.rank()) {}

  Status run(size_t count) {
    for (DataType dtype : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        COHORT_RETURN_IF_ERROR(allreduce(count, dtype, op, /*in_place=*/(count % 2) == 0));
        COHORT_RETURN_IF_ERROR(reduce(count, dtype, op, /*root=*/(count + static_cast<size_t>(op)) % n_));
        COHORT_RETURN_IF_ERROR(reduce_scatter(count, dtype, op));
      }
      int root = static_cast<int>((count + static_cast<size_t>(dtype)) % n_);
      COHORT_RETURN_IF_ERROR(broadcast(count, dtype, root));
      COHORT_RETURN_IF_ERROR(allgather(count, dtype, /*uneven=*/false));
      COHORT_RETURN_IF_ERROR(allgather(count, dtype, /*uneven=*/true));
      COHORT_RETURN_IF_ERROR(gather(count, dtype, root, false));
      COHORT_RETURN_IF_ERROR(gather(count, dtype, root, true));
      COHORT_RETURN_IF_ERROR(scatter(count, dtype, root, false));
      COHORT_RETURN_IF_ERROR(scatter(count, dtype, root, true));
      COHORT_RETURN_IF_ERROR(alltoall(count, dtype, false));
      COHORT_RETURN_IF_ERROR(alltoall(count, dtype, true));
      COHORT_RETURN_IF_ERROR(send_recv_ring(count, dtype));
    }
    return comm_.barrier(kBlocking)->wait();
  }

 private:
  std::vector<uint8_t>& buffer(int which, size_t elements, DataType dtype) {
    auto& b = buffers_[which];
    b.resize(std::max<size_t>(1, elements * element_size(dtype)));
    return b;
  }

  // Per-rank block sizes: even (ceil(count/n) each) or uneven (some ranks 0, one larger).
  std::vector<size_t> blocks(size_t count, bool uneven) const {
    size_t base = (count + n_ - 1) / n_;
    std::vector<size_t> out(n_, base);
    if (uneven) {
      for (int r = 0; r < n_; ++r) out[r] = (r % 3 == 1) ? 0 : base + r;
    }
    return out;
  }

  Status allreduce(size_t count, DataType dtype, ReduceOp op, bool in_place) {
    auto& send = buffer(0, count, dtype);
    auto& recv = buffer(1, count, dtype);
    for (size_t i = 0; i < count; ++i) write_value(send.data(), dtype, i, input(op, me_, i));
    void* out = in_place ? send.data() : recv.data();
    COHORT_RETURN_IF_ERROR(comm_.allreduce(in_place ? nullptr : send.data(), out, count, dtype, op, kAsync)->wait());
    for (size_t i = 0; i < count; ++i) {
      double got = read_value(out, dtype, i), want = expected(op, dtype, n_, i);
      if (!close_enough(got, want, dtype)) {
        return mismatch("allreduce", dtype, std::string(reduce_op_name(op)), count, i, got, want);
      }
    }
    return ok_status();
  }

  Status reduce(size_t count, DataType dtype, ReduceOp op, int root) {
    auto& send = buffer(0, count, dtype);
    auto& recv = buffer(1, count, dtype);
    for (size_t i = 0; i < count; ++i) write_value(send.data(), dtype, i, input(op, me_, i));
    COHORT_RETURN_IF_ERROR(comm_.reduce(send.data(), recv.data(), count, dtype, op, root, kBlocking)->wait());
    for (size_t i = 0; i < count; ++i) {
      // The input must survive on every rank; the result must be right at the root.
      if (read_value(send.data(), dtype, i) != input(op, me_, i)) {
        return mismatch("reduce (input clobbered)", dtype, std::string(reduce_op_name(op)), count, i,
                        read_value(send.data(), dtype, i), input(op, me_, i));
      }
      if (me_ != root) continue;
      double got = read_value(recv.data(), dtype, i), want = expected(op, dtype, n_, i);
      if (!close_enough(got, want, dtype)) {
        return mismatch("reduce", dtype, fmt::format("{} root {}", reduce_op_name(op), root), count, i, got, want);
      }
    }
    return ok_status();
  }

  Status reduce_scatter(size_t count, DataType dtype, ReduceOp op) {
    size_t block = (count + n_ - 1) / n_;
    auto& send = buffer(0, block * n_, dtype);
    auto& recv = buffer(1, block, dtype);
    for (size_t i = 0; i < block * n_; ++i) write_value(send.data(), dtype, i, input(op, me_, i));
    COHORT_RETURN_IF_ERROR(comm_.reduce_scatter(send.data(), recv.data(), block, dtype, op, kBlocking)->wait());
    for (size_t j = 0; j < block; ++j) {
      size_t i = me_ * block + j;
      double got = read_value(recv.data(), dtype, j), want = expected(op, dtype, n_, i);
      if (!close_enough(got, want, dtype)) {
        return mismatch("reduce_scatter", dtype, std::string(reduce_op_name(op)), count, i, got, want);
      }
    }
    return ok_status();
  }

  Status broadcast(size_t count, DataType dtype, int root) {
    auto& buf = buffer(0, count, dtype);
    for (size_t i = 0; i < count; ++i) write_value(buf.data(), dtype, i, me_ == root ? payload(root, i) : 0);
    COHORT_RETURN_IF_ERROR(comm_.broadcast(buf.data(), count, dtype, root, kBlocking)->wait());
    for (size_t i = 0; i < count; ++i) {
      double got = read_value(buf.data(), dtype, i);
      if (got != payload(root, i)) return mismatch("broadcast", dtype, fmt::format("root {}", root), count, i, got, payload(root, i));
    }
    return ok_status();
  }

  Status check_blocks(const char* op, DataType dtype, size_t count, const void* buf, const std::vector<size_t>& b) {
    size_t offset = 0;
    for (int r = 0; r < n_; ++r) {
      for (size_t j = 0; j < b[r]; ++j) {
        double got = read_value(buf, dtype, offset + j);
        if (got != payload(r, j)) return mismatch(op, dtype, fmt::format("block of rank {}", r), count, j, got, payload(r, j));
      }
      offset += b[r];
    }
    return ok_status();
  }

  Status allgather(size_t count, DataType dtype, bool uneven) {
    std::vector<size_t> b = blocks(count, uneven);
    size_t total = std::accumulate(b.begin(), b.end(), size_t{0});
    auto& send = buffer(0, b[me_], dtype);
    auto& recv = buffer(1, total, dtype);
    for (size_t j = 0; j < b[me_]; ++j) write_value(send.data(), dtype, j, payload(me_, j));
    auto work = uneven ? comm_.allgatherv(send.data(), recv.data(), b, dtype, kBlocking)
                       : comm_.allgather(send.data(), recv.data(), b[0], dtype, kBlocking);
    COHORT_RETURN_IF_ERROR(work->wait());
    return check_blocks(uneven ? "allgatherv" : "allgather", dtype, count, recv.data(), b);
  }

  Status gather(size_t count, DataType dtype, int root, bool uneven) {
    std::vector<size_t> b = blocks(count, uneven);
    size_t total = std::accumulate(b.begin(), b.end(), size_t{0});
    auto& send = buffer(0, b[me_], dtype);
    auto& recv = buffer(1, total, dtype);
    for (size_t j = 0; j < b[me_]; ++j) write_value(send.data(), dtype, j, payload(me_, j));
    auto work = uneven ? comm_.gatherv(send.data(), recv.data(), b, dtype, root, kBlocking)
                       : comm_.gather(send.data(), recv.data(), b[0], dtype, root, kBlocking);
    COHORT_RETURN_IF_ERROR(work->wait());
    if (me_ != root) return ok_status();
    return check_blocks(uneven ? "gatherv" : "gather", dtype, count, recv.data(), b);
  }

  Status scatter(size_t count, DataType dtype, int root, bool uneven) {
    std::vector<size_t> b = blocks(count, uneven);
    size_t total = std::accumulate(b.begin(), b.end(), size_t{0});
    auto& send = buffer(0, total, dtype);
    auto& recv = buffer(1, b[me_], dtype);
    if (me_ == root) {
      size_t offset = 0;
      for (int r = 0; r < n_; ++r) {
        for (size_t j = 0; j < b[r]; ++j) write_value(send.data(), dtype, offset + j, payload(r, j));
        offset += b[r];
      }
    }
    auto work = uneven ? comm_.scatterv(send.data(), b, recv.data(), dtype, root, kBlocking)
                       : comm_.scatter(send.data(), recv.data(), b[0], dtype, root, kBlocking);
    COHORT_RETURN_IF_ERROR(work->wait());
    for (size_t j = 0; j < b[me_]; ++j) {
      double got = read_value(recv.data(), dtype, j);
      if (got != payload(me_, j)) return mismatch(uneven ? "scatterv" : "scatter", dtype, "", count, j, got, payload(me_, j));
    }
    return ok_status();
  }

  Status alltoall(size_t count, DataType dtype, bool uneven) {
    // Rank s sends (s + d) % 3 == 0 ? 0 : base elements to rank d when uneven; value encodes (s, d).
    size_t base = (count + n_ - 1) / n_;
    auto amount = [&](int s, int d) -> size_t { return uneven ? ((s + d) % 3 == 0 ? 0 : base + d) : base; };
    std::vector<size_t> send_counts(n_), recv_counts(n_);
    for (int r = 0; r < n_; ++r) {
      send_counts[r] = amount(me_, r);
      recv_counts[r] = amount(r, me_);
    }
    auto& send = buffer(0, std::accumulate(send_counts.begin(), send_counts.end(), size_t{0}), dtype);
    auto& recv = buffer(1, std::accumulate(recv_counts.begin(), recv_counts.end(), size_t{0}), dtype);
    size_t offset = 0;
    for (int d = 0; d < n_; ++d) {
      for (size_t j = 0; j < send_counts[d]; ++j) write_value(send.data(), dtype, offset + j, payload(me_ * 3 + d, j));
      offset += send_counts[d];
    }
    auto work = uneven ? comm_.alltoallv(send.data(), send_counts, recv.data(), recv_counts, dtype, kBlocking)
                       : comm_.alltoall(send.data(), recv.data(), base, dtype, kBlocking);
    COHORT_RETURN_IF_ERROR(work->wait());
    offset = 0;
    for (int s = 0; s < n_; ++s) {
      for (size_t j = 0; j < recv_counts[s]; ++j) {
        double got = read_value(recv.data(), dtype, offset + j), want = payload(s * 3 + me_, j);
        if (got != want) return mismatch(uneven ? "alltoallv" : "alltoall", dtype, fmt::format("from rank {}", s), count, j, got, want);
      }
      offset += recv_counts[s];
    }
    return ok_status();
  }

  Status send_recv_ring(size_t count, DataType dtype) {
    if (n_ == 1) return ok_status();
    auto& send = buffer(0, count, dtype);
    auto& recv = buffer(1, count, dtype);
    for (size_t i = 0; i < count; ++i) write_value(send.data(), dtype, i, payload(me_, i));
    int next = (me_ + 1) % n_, prev = (me_ + n_ - 1) % n_;
    auto r = comm_.irecv(recv.data(), count, dtype, prev, 11);
    auto s = comm_.isend(send.data(), count, dtype, next, 11);
    COHORT_RETURN_IF_ERROR(r->wait());
    COHORT_RETURN_IF_ERROR(s->wait());
    for (size_t i = 0; i < count; ++i) {
      double got = read_value(recv.data(), dtype, i);
      if (got != payload(prev, i)) return mismatch("send/recv", dtype, fmt::format("from rank {}", prev), count, i, got, payload(prev, i));
    }
    return ok_status();
  }

  Communicator& comm_;
  const int n_;
  const int me_;
  std::vector<uint8_t> buffers_[2];
};

}  // namespace

const std::vector<size_t>& matrix_sizes() {
  static const std::vector<size_t> sizes = {0, 1, 7, 1000, (size_t{1} << 20) + 3};
  return sizes;
}

Status run_collective_matrix(Communicator& comm, const std::vector<size_t>& sizes) {
  Matrix matrix(comm);
  for (size_t count : sizes) COHORT_RETURN_IF_ERROR(matrix.run(count));
  return ok_status();
}

Status check_allreduce(Communicator& comm, size_t count) {
  int n = comm.size(), me = comm.rank();
  for (DataType dtype : {DataType::kFloat32, DataType::kInt64, DataType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      std::vector<uint8_t> buf(std::max<size_t>(1, count * element_size(dtype)));
      for (size_t i = 0; i < count; ++i) write_value(buf.data(), dtype, i, input(op, me, i));
      COHORT_RETURN_IF_ERROR(comm.allreduce(buf.data(), buf.data(), count, dtype, op, kBlocking)->wait());
      for (size_t i = 0; i < count; ++i) {
        double got = read_value(buf.data(), dtype, i), want = expected(op, dtype, n, i);
        if (!close_enough(got, want, dtype)) {
          return mismatch("allreduce", dtype, fmt::format("{} on {}", reduce_op_name(op), comm.kind()), count, i, got, want);
        }
      }
    }
  }
  return ok_status();
}

}  // namespace cohort::comm::testing
