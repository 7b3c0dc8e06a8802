// mpi_baseline: OpenMPI's collectives in cohort-bench's table format — the peer cohort-bench is
// measured against (bench/compare_mpi.sh runs both). Built only for that comparison; never
// linked into cohort.
//
//   mpirun --allow-run-as-root --oversubscribe -np 4 bazel-bin/bench/mpi_baseline -b 8 -e 64M -f 4 --check
//   mpirun ... mpi_baseline --op reduce_scatter --sizes 8,1K,64K,1M,16M,64M --check
//
// float32 SUM only, root 0. Each op moves what cohort-bench's same-named op moves at the same row
// size (bench_table.h's op_counts): broadcast → MPI_Bcast, allgather → MPI_Allgather,
// reduce_scatter → MPI_Reduce_scatter_block, allreduce → MPI_Allreduce, pingpong → MPI_Send /
// MPI_Recv between ranks 0 and 1 (time: half the round trip). Inputs and the --check
// reference are cohort-bench's: rank r's element i is (r + 1) + i % 7.

// The C API only: OpenMPI's deprecated C++ bindings need libmpi_cxx and trip -Wcast-function-type.
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_table.h"
#include "bench/sweep_flags.h"
#include "worker/base/cli_flags.h"

namespace {

constexpr int kRoot = 0;

constexpr const char* kDescription =
    "OpenMPI's collectives in cohort-bench's table format (float32 SUM, root 0), run under mpirun:\n"
    "  mpirun -np N mpi_baseline [options]";

struct Options : cohort::bench::SweepOptions {
  std::string op = "allreduce";
  bool check = false;
};

// Parses the command line (CLI11, worker/base/cli_flags.h) into `o`. std::nullopt: go on;
// otherwise the exit status (help, version, or a usage error already printed).
std::optional<int> parse_command_line(int argc, char** argv, Options* o) {
  auto app = cohort::cli_flags::make_app("mpi_baseline", kDescription);
  app->add_option("--op", o->op, "allreduce, broadcast, allgather, reduce_scatter, pingpong")
      ->type_name("OP")
      ->check(CLI::IsMember({"allreduce", "broadcast", "allgather", "reduce_scatter", "pingpong"}))
      ->capture_default_str();
  cohort::bench::SweepFlags sweep(app.get(), o);
  app->add_flag("-c,--check", o->check, "verify every result against a reference; #wrong counts bad elements");
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, argc, argv)) return exit;
  std::string error = sweep.finish();
  if (error.empty() && (o->begin == 0 || o->end < o->begin)) error = "need 0 < -b <= -e";
  if (error.empty()) return std::nullopt;
  std::fprintf(stderr, "mpi_baseline: %s\nrun 'mpi_baseline --help' for the options\n", error.c_str());
  return cohort::cli_flags::kExitUsage;
}

float input(int rank, size_t i) { return static_cast<float>((rank + 1) + i % 7); }

// The summed element i over `size` ranks.
float reduced(int size, size_t i) { return static_cast<float>(size * (size + 1) / 2 + size * (i % 7)); }

class MpiRank {
 public:
  MpiRank(const Options& o, int rank, int size) : o_(o), rank_(rank), size_(size) {}

  void run_size(size_t count) {
    counts_ = cohort::bench::op_counts(o_.op, count, size_);
    send_.assign(counts_.send, 0);
    recv_.assign(counts_.recv, 0);
    fill();
    for (int w = 0; w < o_.warmup; ++w) issue();
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    int iters = cohort::bench::iterations_for(count * sizeof(float), o_.iters);
    for (int it = 0; it < iters; ++it) issue();
    double mine = (MPI_Wtime() - start) / iters * 1e6, slowest = 0;
    if (o_.op == "pingpong") mine /= 2;  // one way, as cohort-bench's
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long wrong = -1;
    if (o_.check) {
      fill();
      if ((o_.op == "broadcast" && rank_ != kRoot) || o_.op == "pingpong") std::fill(recv_.begin(), recv_.end(), 0.0f);
      issue();
      long local = count_wrong();
      MPI_Allreduce(&local, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank_ == 0) {
      cohort::bench::TableRow row{
          count * sizeof(float), count, "float", "sum", o_.op == "broadcast" ? kRoot : -1, slowest, wrong};
      cohort::bench::print_row(stdout, row, o_.op, size_);
    }
  }

 private:
  void fill() {
    for (size_t i = 0; i < counts_.send; ++i) send_[i] = input(rank_, i);
    // Broadcast runs in place on recv_, as cohort-bench's does: the root's holds its input.
    if (o_.op == "broadcast" && rank_ == kRoot)
      std::memcpy(recv_.data(), send_.data(), counts_.send * sizeof(float));
  }

  void issue() {
    using cohort::bench::BenchOp;
    const int send = static_cast<int>(counts_.send), recv = static_cast<int>(counts_.recv);
    if (op_ == BenchOp::kAllreduce) {
      MPI_Allreduce(send_.data(), recv_.data(), send, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (op_ == BenchOp::kBroadcast) {
      MPI_Bcast(recv_.data(), recv, MPI_FLOAT, kRoot, MPI_COMM_WORLD);
    } else if (op_ == BenchOp::kAllgather) {
      MPI_Allgather(send_.data(), send, MPI_FLOAT, recv_.data(), send, MPI_FLOAT, MPI_COMM_WORLD);
    } else if (op_ == BenchOp::kPingpong) {
      // Rank 0 sends to rank 1, which sends it back; other ranks idle.
      if (rank_ == 0) {
        MPI_Send(send_.data(), send, MPI_FLOAT, 1, 0, MPI_COMM_WORLD);
        MPI_Recv(recv_.data(), recv, MPI_FLOAT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else if (rank_ == 1) {
        MPI_Recv(recv_.data(), recv, MPI_FLOAT, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(recv_.data(), recv, MPI_FLOAT, 0, 0, MPI_COMM_WORLD);
      }
    } else {
      MPI_Reduce_scatter_block(send_.data(), recv_.data(), recv, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
  }

  long count_wrong() const {
    long wrong = 0;
    for (size_t j = 0; j < counts_.recv; ++j) {
      float want = 0;
      if (o_.op == "allreduce")
        want = reduced(size_, j);
      else if (o_.op == "broadcast")
        want = input(kRoot, j);
      else if (o_.op == "pingpong")
        want = rank_ > 1 ? 0.0f : input(0, j);  // rank 0's input, there and back
      else if (o_.op == "allgather")
        want = input(static_cast<int>(j / counts_.send), j % counts_.send);
      else
        want = reduced(size_, rank_ * counts_.recv + j);
      wrong += recv_[j] != want;
    }
    return wrong;
  }

  const Options& o_;
  const cohort::bench::BenchOp op_ = cohort::bench::bench_op(o_.op);  // resolved once (bench_table.h)
  const int rank_, size_;
  cohort::bench::OpCounts counts_;
  std::vector<float> send_, recv_;
};

}  // namespace

int main(int argc, char** argv) {
  // Parsed before MPI_Init, so --help and a usage error need no MPI runtime.
  Options o;
  if (std::optional<int> exit = parse_command_line(argc, argv, &o)) return *exit;
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (o.op == "pingpong" && size < 2) {
    if (rank == 0) std::fprintf(stderr, "mpi_baseline: --op pingpong needs at least 2 ranks (mpirun -np 2)\n");
    MPI_Finalize();
    return 2;
  }
  size_t unit = sizeof(float) * cohort::bench::block_multiple(o.op, size);
  std::vector<size_t> sizes = cohort::bench::size_sweep(o.begin, o.end, o.factor, unit);
  if (!o.sizes.empty() && !cohort::bench::parse_size_list(o.sizes, unit, &sizes)) {
    if (rank == 0)
      std::fprintf(stderr, "mpi_baseline: --sizes '%s' is not a list such as 8,1K,64K\n", o.sizes.c_str());
    MPI_Finalize();
    return 2;
  }
  static const char* const kCalls[][2] = {{"allreduce", "MPI_Allreduce"},
                                          {"broadcast", "MPI_Bcast"},
                                          {"allgather", "MPI_Allgather"},
                                          {"reduce_scatter", "MPI_Reduce_scatter_block"},
                                          {"pingpong", "MPI_Send/MPI_Recv"}};
  std::string call;
  for (const auto& c : kCalls) {
    if (o.op == c[0]) call = c[1];
  }
  if (rank == 0) {
    cohort::bench::print_header(
        stdout, "mpi_baseline: " + o.op + " (" + call + ", OpenMPI) on " + std::to_string(size) + " ranks");
  }
  MpiRank bench(o, rank, size);
  for (size_t bytes : sizes) bench.run_size(bytes / sizeof(float));
  MPI_Finalize();
  return 0;
}
