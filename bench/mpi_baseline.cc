// mpi_baseline: OpenMPI's MPI_Allreduce in cohort-bench's table format — the peer cohort-bench is
// measured against. Built only for that comparison; never linked into cohort.
//
//   mpirun --oversubscribe -np 4 bazel-bin/bench/mpi_baseline -b 8 -e 64M -f 4 --check

#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_table.h"

namespace {

constexpr int kDefaultIters = 20;
constexpr int kDefaultWarmup = 5;

struct Options {
  size_t begin = 8, end = 64u << 20, factor = 4;
  int iters = kDefaultIters, warmup = kDefaultWarmup;
  bool check = false;
};

bool parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "-b" && cohort::bench::parse_size(next(), &o->begin)) continue;
    if (a == "-e" && cohort::bench::parse_size(next(), &o->end)) continue;
    if (a == "-f") { o->factor = std::strtoul(next().c_str(), nullptr, 10); continue; }
    if (a == "-n" || a == "--iters") { o->iters = std::atoi(next().c_str()); continue; }
    if (a == "-w" || a == "--warmup") { o->warmup = std::atoi(next().c_str()); continue; }
    if (a == "-c" || a == "--check") { o->check = true; continue; }
    std::fprintf(stderr, "mpi_baseline: unknown or incomplete argument '%s'\n"
                         "usage: mpirun -np N mpi_baseline [-b SIZE] [-e SIZE] [-f FACTOR] [-n ITERS] [-w WARMUP] [--check]\n",
                 a.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  Options o;
  if (!parse(argc, argv, &o)) {
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) cohort::bench::print_header(stdout, "mpi_baseline: MPI_Allreduce (OpenMPI), " + std::to_string(size) + " ranks");
  for (size_t bytes : cohort::bench::size_sweep(o.begin, o.end, o.factor, sizeof(float))) {
    size_t count = bytes / sizeof(float);
    std::vector<float> send(count), recv(count);
    for (size_t i = 0; i < count; ++i) send[i] = static_cast<float>((rank + 1) + i % 7);
    for (int w = 0; w < o.warmup; ++w) MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    int iters = cohort::bench::iterations_for(bytes, o.iters);
    for (int it = 0; it < iters; ++it) MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double mine = (MPI_Wtime() - start) / iters * 1e6, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    long wrong = -1;
    if (o.check) {
      long local = 0;
      for (size_t i = 0; i < count; ++i) {
        float want = static_cast<float>(size * (size + 1) / 2 + size * (i % 7));
        if (recv[i] != want) ++local;
      }
      MPI_Allreduce(&local, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
    if (rank == 0) {
      cohort::bench::TableRow row{bytes, count, "float", "sum", -1, slowest, wrong};
      cohort::bench::print_row(stdout, row, "allreduce", size);
    }
  }
  MPI_Finalize();
  return 0;
}
