// cohort-bench: collective benchmarks over cohort's communicators, in nccl-tests' conventions.
//
//   cohort-bench -np 4 -b 8 -e 64M -f 4 --op allreduce --check
//   cohort-bench -np 2 --kind hierarchical --op allgather -b 1K -e 16M
//   UCX_TLS=sm,cma cohort-bench -np 2 --op pingpong -b 8 -e 16M   (send/recv latency, one way)
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. cohort-bench --init env://   (any launcher)
//   cohort-bench -np 2 --device cuda --kind pure_nccl      (a --config=cuda build, one GPU per rank)
//
// With -np N it starts N local ranks itself (processes over UCX, bootstrapped through a file
// store in a temporary directory) and rank 0 prints the table. Each row is the slowest rank's
// average time per call; busbw uses nccl-tests' factors (bench_table.h).
//
// --device cuda (CUDA build only) puts the buffers in GPU memory, rank r on GPU r mod the device
// count: pure_nccl runs every op through NCCL; the host kinds stage every op through pinned host
// memory around their host path.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench_table.h"
#include "bench/sweep_flags.h"
#include "worker/base/cli_flags.h"
#include "worker/base/cpu_binding.h"
#include "worker/base/logging.h"
#include "worker/comm/bootstrap.h"
#include "worker/comm/testing/typed_values.h"
#include "worker/comm/transport/nccl/device_memory.h"

#if COHORT_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

using cohort::Status;
using cohort::StatusOr;
using cohort::ok_status;
using cohort::bench::BenchOp;
using namespace cohort::comm;  // NOLINT(build/namespaces): a benchmark main

constexpr const char* kChildEnv = "COHORT_BENCH_CHILD";

constexpr const char* kDescription = R"(Measures cohort's collectives like nccl-tests: one row per message size with the time per call,
algorithm bandwidth and bus bandwidth, and with --check the number of wrong elements.)";

constexpr const char* kFooter = R"(-np N is accepted for --np N (as mpirun spells it). Sizes take K, M and G suffixes (powers of 1024).

examples:
  cohort-bench -np 4 -b 8 -e 64M -f 4 --op allreduce --check
  cohort-bench -np 2 --kind hierarchical --op allgather -b 1K -e 16M
  RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. cohort-bench --init env://)";

struct Options : cohort::bench::SweepOptions {
  int np = 1;
  std::string init;
  std::string op = "allreduce";
  std::string kind = "flat";
  std::string algo = "auto";
  std::string dtype = "f32";
  std::string redop = "sum";
  int root = 0;
  bool check = false;
  std::string device = "cpu";
  int timeout_s = 300;
  std::string cpu_bind = "none";  // -np's ranks: none, core or auto (worker/base/cpu_binding.h)
};

bool validate(Options* o, std::string* error);

// Parses the command line (CLI11, worker/base/cli_flags.h) into `o`. std::nullopt: go on;
// otherwise the exit status (help, version, or a usage error already printed).
std::optional<int> parse_command_line(int argc, char** argv, Options* o) {
  auto app = cohort::cli_flags::make_app("cohort-bench", kDescription);
  app->footer(kFooter);
  app->add_option("--np", o->np, "start N local ranks (processes over UCX)")
      ->type_name("N")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app->add_option("--init", o->init, "join an existing job instead: env://, tcp://host:port, file:///path")
      ->type_name("URL");
  app->add_option("--op", o->op, "allreduce, broadcast, reduce, allgather, reduce_scatter, alltoall; pingpong: "
                  "send/recv between ranks 0 and 1, time = half the round trip (with --algo shm: a "
                  "broadcast each way over the shared-memory segment instead)")
      ->type_name("OP")
      ->check(CLI::IsMember({"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "pingpong"}))
      ->capture_default_str();
  app->add_option("--kind", o->kind,
                  "communicator: naive, flat, hierarchical, two_dimensional, single_node, pure_nccl")
      ->type_name("KIND")
      ->capture_default_str();
  app->add_option("--algo", o->algo,
                  "force an algorithm: ring, rhd, recursive_doubling, binomial, pairwise, linear; or a path: shm "
                  "(intra-node shared memory), ucx (the transport); COHORT_ALGO in the environment too")
      ->type_name("ALGO")
      ->capture_default_str();
  app->add_option("--dtype", o->dtype, "f16 bf16 f32 f64 i8 u8 i32 i64")->type_name("T")->capture_default_str();
  app->add_option("--redop", o->redop, "sum prod min max avg")->type_name("OP")->capture_default_str();
  cohort::bench::SweepFlags sweep(app.get(), o);
  app->add_option("--root", o->root, "root of broadcast / reduce")->type_name("R")->capture_default_str();
  app->add_flag("-c,--check", o->check, "verify every result against a reference; #wrong counts bad elements");
  app->add_option("--device", o->device, "cpu, or cuda: buffers in GPU memory (needs a --config=cuda build)")
      ->type_name("D")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  app->add_option("--timeout", o->timeout_s, "per-operation timeout")
      ->type_name("SECONDS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  if (const char* env = std::getenv(cohort::kCpuBindEnv); env != nullptr && *env != '\0') o->cpu_bind = env;
  app->add_option("--cpu-bind", o->cpu_bind,
                  "-np's ranks: core binds each to its own share of the CPUs (faster small messages, "
                  "slower large ones when another process shares a core), auto does so only when "
                  "there is a CPU per rank (mpirun's default), none leaves them to the scheduler; "
                  "COHORT_CPU_BIND in the environment too")
      ->type_name("B")
      ->check(CLI::IsMember({"none", "core", "auto"}))
      ->capture_default_str();
  // mpirun's spelling: "-np N" (CLI11's short options are one letter).
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(std::strcmp(argv[i], "-np") == 0 ? "--np" : argv[i]);
  if (std::optional<int> exit = cohort::cli_flags::parse(*app, args, std::cout, std::cerr)) return exit;
  std::string error = sweep.finish();
  if (error.empty()) validate(o, &error);
  if (error.empty()) return std::nullopt;
  std::cerr << "cohort-bench: " << error << "\nrun 'cohort-bench --help' for the options\n";
  return cohort::cli_flags::kExitUsage;
}

// The checks across options; false with `*error` set.
bool validate(Options* o, std::string* error) {
  static const std::vector<std::string> ops = {"allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall", "pingpong"};
  if (std::find(ops.begin(), ops.end(), o->op) == ops.end()) { *error = "unknown --op '" + o->op + "'"; return false; }
  if (o->np < 1) { *error = "-np must be at least 1"; return false; }
  if (o->op == "pingpong" && o->np == 1 && o->init.empty()) { *error = "--op pingpong needs 2 ranks (-np 2)"; return false; }
  if (o->begin == 0 || o->end < o->begin) { *error = "need 0 < -b <= -e"; return false; }
  std::vector<size_t> ignored;
  if (!o->sizes.empty() && !cohort::bench::parse_size_list(o->sizes, 1, &ignored)) {
    *error = "--sizes '" + o->sizes + "' is not a comma-separated list of sizes such as 8,1K,64K,1M";
    return false;
  }
  if (o->device != "cpu" && o->device != "cuda") { *error = "--device must be cpu or cuda"; return false; }
  // Checked before any rank starts: -np 4 --cpu-bind core on 2 CPUs names both counts.
  auto bind = cohort::parse_cpu_bind(o->cpu_bind);
  if (!bind.ok()) { *error = bind.status().message(); return false; }
  if (o->init.empty()) {
    auto plan = cohort::plan_local_ranks(*bind, o->np);
    if (!plan.ok()) { *error = plan.status().message(); return false; }
  }
  return true;
}

// One benchmark rank: sweeps the sizes, rank 0 prints.
class BenchRank {
 public:
  BenchRank(Communicator& comm, const Options& o, DataType dtype, ReduceOp redop)
      : comm_(comm),
        o_(o),
        op_(cohort::bench::bench_op(o.op)),
        dtype_(dtype),
        redop_(redop),
        n_(comm.size()),
        me_(comm.rank()) {}

  Status run() {
    size_t esize = element_size(dtype_);
    if (me_ == 0) {
      cohort::bench::print_header(stdout, "cohort-bench: " + o_.op + " on " + std::to_string(n_) + " ranks, " +
                                              comm_.kind() + " communicator, algorithm " + o_.algo);
    }
    // Ops whose buffers hold one block per rank need counts divisible by the rank count.
    size_t unit = esize * cohort::bench::block_multiple(o_.op, n_);
    std::vector<size_t> sizes = cohort::bench::size_sweep(o_.begin, o_.end, o_.factor, unit);
    if (!o_.sizes.empty() && !cohort::bench::parse_size_list(o_.sizes, unit, &sizes)) {
      return cohort::invalid_argument_error("--sizes '{}' is not a list of sizes such as 8,1K,64K", o_.sizes);
    }
    for (size_t bytes : sizes) COHORT_RETURN_IF_ERROR(run_size(bytes / esize));
    return ok_status();
  }

 private:

  double input(size_t i) const {
    if (redop_ == ReduceOp::kProduct) return 1 + ((me_ + i) % 2);
    return (me_ + 1) + static_cast<double>(i % 7);
  }

  double reduced(size_t i) const {
    double k = static_cast<double>(i % 7);
    switch (redop_) {
      case ReduceOp::kSum: return n_ * (n_ + 1) / 2.0 + n_ * k;
      case ReduceOp::kMin: return 1 + k;
      case ReduceOp::kMax: return n_ + k;
      case ReduceOp::kProduct: return std::pow(2.0, (i % 2 == 0) ? n_ / 2 : (n_ + 1) / 2);
      case ReduceOp::kAvg: {
        double sum = n_ * (n_ + 1) / 2.0 + n_ * k;
        return is_floating(dtype_) ? sum / n_ : std::trunc(sum / n_);
      }
    }
    return 0;
  }

  void fill(size_t count) {
    for (size_t i = 0; i < count; ++i) testing::write_value(send_.data(), dtype_, i, input(i));
  }

  // One operation, finished. pingpong: rank 0 sends `count` elements to rank 1, which receives
  // them and sends them back (the other ranks idle): MPI's and UCX's point-to-point latency test.
  Status run_once(size_t count) {
    if (op_ != BenchOp::kPingpong) return issue(count)->wait();
    if (n_ < 2) return cohort::invalid_argument_error("--op pingpong needs at least 2 ranks, not {}", n_);
    CallOptions call{std::chrono::seconds(o_.timeout_s), true};
    if (o_.algo == "shm") {
      // Point to point has no shared-memory path: what one would cost is measured as a broadcast
      // from rank 0 and one back from rank 1 over the segment (one copy in, one copy out and one
      // flag each way; every rank takes part, so run it with -np 2).
      COHORT_RETURN_IF_ERROR(comm_.broadcast(recv_.data(), count, dtype_, 0, call)->wait());
      return comm_.broadcast(recv_.data(), count, dtype_, 1, call)->wait();
    }
    if (me_ == 0) {
      COHORT_RETURN_IF_ERROR(comm_.send(send_.data(), count, dtype_, 1, 0, call));
      return comm_.recv(recv_.data(), count, dtype_, 1, 0, call);
    }
    if (me_ == 1) {
      COHORT_RETURN_IF_ERROR(comm_.recv(recv_.data(), count, dtype_, 0, 0, call));
      return comm_.send(recv_.data(), count, dtype_, 0, 0, call);
    }
    return ok_status();
  }

  std::shared_ptr<Work> issue(size_t count) {
    CallOptions call{std::chrono::seconds(o_.timeout_s), true};
    void* s = send_.data();
    void* r = recv_.data();
#if COHORT_CUDA
    if (device_) {
      s = device_send_;
      r = device_recv_;
      // pure_nccl runs every op as NCCL calls; the host kinds stage through pinned host memory.
    }
#endif
    switch (op_) {
      case BenchOp::kAllreduce: return comm_.allreduce(s, r, count, dtype_, redop_, call);
      case BenchOp::kBroadcast: return comm_.broadcast(r, count, dtype_, o_.root, call);
      case BenchOp::kReduce: return comm_.reduce(s, r, count, dtype_, redop_, o_.root, call);
      case BenchOp::kAllgather: return comm_.allgather(s, r, counts_.send, dtype_, call);
      case BenchOp::kReduceScatter: return comm_.reduce_scatter(s, r, counts_.recv, dtype_, redop_, call);
      default: return comm_.alltoall(s, r, count / n_, dtype_, call);
    }
  }

  long count_wrong(size_t count) {
    long wrong = 0;
    auto bad = [&](double got, double want) {
      double tol = is_floating(dtype_) ? 1e-2 * std::max(1.0, std::fabs(want)) : 0;
      return std::fabs(got - want) > tol;
    };
    if (o_.op == "allreduce" || (o_.op == "reduce" && me_ == o_.root)) {
      for (size_t i = 0; i < count; ++i) wrong += bad(testing::read_value(recv_.data(), dtype_, i), reduced(i));
    } else if (o_.op == "reduce_scatter") {
      size_t block = count / n_;
      for (size_t j = 0; j < block; ++j) wrong += bad(testing::read_value(recv_.data(), dtype_, j), reduced(me_ * block + j));
    } else if (o_.op == "pingpong") {
      // Rank 0's input went to rank 1 and back: both hold it.
      if (me_ > 1) return 0;
      for (size_t i = 0; i < count; ++i) wrong += bad(testing::read_value(recv_.data(), dtype_, i), 1 + double(i % 7));
    } else if (o_.op == "broadcast") {
      // The root broadcasts its input(i) computed with me_ == root.
      for (size_t i = 0; i < count; ++i) {
        double want = (o_.root + 1) + static_cast<double>(i % 7);
        wrong += bad(testing::read_value(recv_.data(), dtype_, i), want);
      }
    } else if (o_.op == "allgather") {
      size_t block = count / n_ > 0 ? count / n_ : 1;
      for (int r = 0; r < n_; ++r) {
        for (size_t j = 0; j < block; ++j) wrong += bad(testing::read_value(recv_.data(), dtype_, r * block + j), (r + 1) + double(j % 7));
      }
    } else if (o_.op == "alltoall") {
      size_t block = count / n_;
      for (int r = 0; r < n_; ++r) {
        for (size_t j = 0; j < block; ++j) wrong += bad(testing::read_value(recv_.data(), dtype_, r * block + j), (r + 1) + double((me_ * block + j) % 7));
      }
    }
    return wrong;
  }

  Status run_size(size_t count) {
    size_t esize = element_size(dtype_);
    counts_ = cohort::bench::op_counts(o_.op, count, n_);
    size_t recv_count = op_ == BenchOp::kAllgather ? counts_.recv : count;
    send_.assign(count * esize, 0);
    recv_.assign(recv_count * esize, 0);
    fill(count);
    if (o_.op == "broadcast" && me_ == o_.root) std::memcpy(recv_.data(), send_.data(), count * esize);
    COHORT_RETURN_IF_ERROR(upload());
    for (int w = 0; w < o_.warmup; ++w) COHORT_RETURN_IF_ERROR(run_once(count));
    COHORT_RETURN_IF_ERROR(comm_.barrier({std::chrono::seconds(o_.timeout_s), true})->wait());
    int iters = cohort::bench::iterations_for(count * esize, o_.iters);
    auto start = Clock::now();
    for (int it = 0; it < iters; ++it) COHORT_RETURN_IF_ERROR(run_once(count));
    double mine = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / iters;
    if (o_.op == "pingpong") mine /= 2;  // one way: half the round trip (osu_latency's convention)
    COHORT_ASSIGN_OR_RETURN(double slowest, comm_.allreduce_obj(mine, ReduceOp::kMax));
    long wrong = -1;
    if (o_.check) {
      // A fresh run from fresh inputs (reduce ops change the buffers in place).
      fill(count);
      if (o_.op == "broadcast") {
        if (me_ == o_.root) std::memcpy(recv_.data(), send_.data(), count * esize);
        else std::fill(recv_.begin(), recv_.end(), 0);
      }
      COHORT_RETURN_IF_ERROR(upload());
      if (o_.op == "pingpong") {
        std::fill(recv_.begin(), recv_.end(), 0);
        // Over the segment the round trip runs in place on recv_ (see run_once).
        if (o_.algo == "shm" && me_ == 0) std::memcpy(recv_.data(), send_.data(), count * esize);
      }
      COHORT_RETURN_IF_ERROR(run_once(count));
      COHORT_RETURN_IF_ERROR(download());
      COHORT_ASSIGN_OR_RETURN(double total, comm_.allreduce_obj(static_cast<double>(count_wrong(count))));
      wrong = static_cast<long>(total);
    }
    if (me_ == 0) {
      cohort::bench::TableRow row{count * esize, count, std::string(data_type_name(dtype_)),
                                  std::string(reduce_op_name(redop_)), o_.op == "broadcast" || o_.op == "reduce" ? o_.root : -1,
                                  slowest, wrong};
      cohort::bench::print_row(stdout, row, o_.op, n_);
    }
    return ok_status();
  }

  // --device cuda: the host vectors are mirrors of device buffers of the same sizes.
  Status upload() {
#if COHORT_CUDA
    if (!device_) return ok_status();
    auto realloc = [](void** ptr, size_t* capacity, size_t bytes) -> Status {
      if (*capacity >= bytes && *ptr != nullptr) return ok_status();
      if (*ptr != nullptr) cudaFree(*ptr);
      *ptr = nullptr;
      *capacity = 0;
      if (cudaMalloc(ptr, bytes == 0 ? 1 : bytes) != cudaSuccess) {
        return cohort::resource_exhausted_error("cudaMalloc of {} bytes failed", bytes);
      }
      *capacity = bytes;
      return ok_status();
    };
    COHORT_RETURN_IF_ERROR(realloc(&device_send_, &send_capacity_, send_.size()));
    COHORT_RETURN_IF_ERROR(realloc(&device_recv_, &recv_capacity_, recv_.size()));
    COHORT_RETURN_IF_ERROR(copy_to_device(device_send_, send_.data(), send_.size()));
    return copy_to_device(device_recv_, recv_.data(), recv_.size());
#else
    return ok_status();
#endif
  }
  Status download() {
#if COHORT_CUDA
    if (device_) return copy_to_host(recv_.data(), device_recv_, recv_.size());
#endif
    return ok_status();
  }

  Communicator& comm_;
  const Options& o_;
  const cohort::bench::BenchOp op_;
  const DataType dtype_;
  const ReduceOp redop_;
  const int n_, me_;
  cohort::bench::OpCounts counts_;  // this size's (run_size)
  std::vector<uint8_t> send_, recv_;
#if COHORT_CUDA
 public:
  ~BenchRank() {
    if (device_send_ != nullptr) cudaFree(device_send_);
    if (device_recv_ != nullptr) cudaFree(device_recv_);
  }

 private:
  const bool device_ = o_.device == "cuda";
  void* device_send_ = nullptr;
  void* device_recv_ = nullptr;
  size_t send_capacity_ = 0, recv_capacity_ = 0;
#endif
};

int run_rank(const Options& o) {
  auto dtype = parse_data_type(o.dtype);
  auto redop = parse_reduce_op(o.redop);
  auto algo = parse_algorithm(o.algo);
  for (const Status& s : {dtype.status(), redop.status(), algo.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "cohort-bench: %s\n", s.message().c_str());
      return 2;
    }
  }
  if (o.device == "cuda") {
    if (!cuda_build()) {
      std::fprintf(stderr,
                   "cohort-bench: --device cuda needs a CUDA build: bazel build --config=cuda //bench:cohort-bench\n");
      return 2;
    }
    int devices = cuda_device_count();
    if (devices == 0) {
      std::fprintf(stderr, "cohort-bench: --device cuda but no CUDA device is visible\n");
      return 1;
    }
#if COHORT_CUDA
    // One GPU per local rank (LOCAL_RANK from the launcher, or -np's rank).
    const char* local_rank = std::getenv("LOCAL_RANK");
    int device = (local_rank != nullptr ? std::atoi(local_rank) : 0) % devices;
    if (cudaSetDevice(device) != cudaSuccess) {
      std::fprintf(stderr, "cohort-bench: cudaSetDevice(%d) failed\n", device);
      return 1;
    }
#endif
  }
  CommunicatorOptions comm_options;
  comm_options.algorithm = *algo;
  comm_options.timeout = std::chrono::seconds(o.timeout_s);
  auto comm = create_communicator(o.kind, InitOptions::from_url(o.init), comm_options);
  if (!comm.ok()) {
    std::fprintf(stderr, "cohort-bench: %s\n", comm.status().to_string().c_str());
    return 1;
  }
  Status status = BenchRank(**comm, o, *dtype, *redop).run();
  if (!status.ok()) {
    std::fprintf(stderr, "cohort-bench rank %d: %s\n", (*comm)->rank(), status.to_string().c_str());
    return 1;
  }
  return 0;
}

// -np N: re-executes this binary N times as ranks bootstrapped through a file store.
int spawn_local_ranks(int argc, char** argv, const Options& o) {
  // Each rank's CPUs, planned here so that the children only bind (validate checked the plan).
  auto plan = cohort::plan_local_ranks(*cohort::parse_cpu_bind(o.cpu_bind), o.np);
  if (!plan.ok()) {
    std::fprintf(stderr, "cohort-bench: %s\n", plan.status().to_string().c_str());
    return 1;
  }
  const std::vector<std::vector<int>>& cpus = *plan;
  char dir_template[] = "/tmp/cohort-bench-XXXXXX";
  if (mkdtemp(dir_template) == nullptr) {
    std::perror("cohort-bench: mkdtemp");
    return 1;
  }
  std::string store = std::string(dir_template) + "/store";
  std::vector<pid_t> children;
  for (int rank = 0; rank < o.np; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      std::string url = "file://" + store + "?rank=" + std::to_string(rank) + "&world_size=" + std::to_string(o.np);
      setenv(kChildEnv, "1", 1);
      // Local ranks: picks each rank's GPU under --device cuda (see run_rank).
      setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
      // Before exec: the rank and all its threads inherit it.
      if (Status bound = cohort::bind_to_cpus(cpus[rank]); !bound.ok()) {
        std::fprintf(stderr, "cohort-bench rank %d: %s\n", rank, bound.to_string().c_str());
        _exit(1);
      }
      std::vector<char*> args(argv, argv + argc);
      std::string init_flag = "--init";
      args.push_back(init_flag.data());
      args.push_back(url.data());
      args.push_back(nullptr);
      execv("/proc/self/exe", args.data());
      std::perror("cohort-bench: execv");
      _exit(127);
    }
    children.push_back(pid);
  }
  int result = 0;
  for (size_t done = 0; done < children.size(); ++done) {
    int status = 0;
    pid_t pid = wait(&status);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && result == 0) {
      result = 1;
      // One rank failed: the others would only time out; stop them now.
      for (pid_t child : children) {
        if (child != pid) kill(child, SIGTERM);
      }
    }
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_template, ignored);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (std::optional<int> exit = parse_command_line(argc, argv, &o)) return *exit;
  if (cohort::Status logging = cohort::init_logging("cohort-bench"); !logging.ok()) {
    std::fprintf(stderr, "cohort-bench: %s\n", logging.message().c_str());
    return 2;
  }
  if (o.device == "cuda" && !cuda_build()) {
    std::fprintf(stderr, "cohort-bench: --device cuda needs a CUDA build: bazel build --config=cuda //bench:cohort-bench\n");
    return 2;
  }
  if (std::getenv(kChildEnv) == nullptr && o.init.empty()) return spawn_local_ranks(argc, argv, o);
  return run_rank(o);
}
