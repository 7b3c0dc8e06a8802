// The BLAS behind libtorch must give right answers when several threads of one process call it at
// once: the in-process rank threads of the worker library's tests do, and so does libtorch itself
// (its intra-op threads run a convolution's matrix products over the batch). Debian's serial
// OpenBLAS, built without locking, fails this: its threads share work buffers, and a CI run's
// multi_node_optimizer_test got parameters off by 4e-3 from it. deploy/install-deps.sh installs the
// threaded build, which locks. To run it against another build, add
//   --test_env=LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-serial
// to `bazel test //tests/train:blas_thread_safety_test`. The concurrent cases did not catch the
// serial build in a few seconds here (its race needs a thread preempted at the wrong
// instruction); the build check does.
#include <dlfcn.h>

#include <atomic>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "worker/base/blas_threads.h"

namespace {

int openblas_threads() {
  using GetThreads = int (*)();
  auto get = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get == nullptr ? -1 : get();
}

// One data-parallel step's products, forward and backward through autograd: a batch of 3 through
// a 2-layer MLP (the in-process tests' model: plain products, transposed ones for the weights'
// gradients, sums for the biases'), and a Fashion-MNIST-sized layer.
std::vector<at::Tensor> products(const std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> params;
  for (int i = 0; i < 4; ++i) params.push_back(in[i].detach().clone().requires_grad_(true));
  at::Tensor h = at::tanh(at::linear(in[4], params[0], params[1]));
  (at::linear(h, params[2], params[3]) - in[5]).pow(2).mean().backward();
  std::vector<at::Tensor> out;
  for (const at::Tensor& p : params) out.push_back(p.grad());
  out.push_back(at::mm(in[6], in[7]));
  return out;
}

std::vector<at::Tensor> inputs() {
  at::manual_seed(7);
  return {at::randn({16, 8}),    at::randn({16}),        at::randn({4, 16}), at::randn({4}),
          at::randn({3, 8}),     at::randn({3, 4}),      at::randn({64, 784}), at::randn({784, 256})};
}

// `rounds` rounds of `threads` new threads, each taking products() a few times; returns how many
// of the threads got a product that differs from one computed before. New threads, because
// OpenBLAS hands each calling thread its work buffers on its first call and takes them back when
// it exits, as the in-process tests' rank threads, started for every case, make it do.
int wrong_threads(int threads, int rounds) {
  const std::vector<at::Tensor> shared = inputs();
  const std::vector<at::Tensor> expected = products(shared);
  std::atomic<int> wrong{0};
  for (int round = 0; round < rounds; ++round) {
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&] {
        // Each thread its own inputs, as each rank has its own model.
        std::vector<at::Tensor> mine;
        for (const at::Tensor& x : shared) mine.push_back(x.clone());
        bool right = true;
        for (int k = 0; k < 4 && right; ++k) {
          std::vector<at::Tensor> got = products(mine);
          for (size_t i = 0; i < got.size() && right; ++i) right = at::allclose(got[i], expected[i], 1e-5, 1e-5);
        }
        if (!right) wrong.fetch_add(1);
      });
    }
    for (std::thread& w : workers) w.join();
  }
  return wrong.load();
}

TEST(BlasThreadSafetyTest, TheInstalledBlasIsOpenBlasAndTakesAThreadCount) {
  ASSERT_TRUE(cohort::set_openblas_threads(1))
      << "libblas.so.3 is not OpenBLAS: run deploy/install-deps.sh (libopenblas0-pthread), or "
         "check `update-alternatives --display libblas.so.3-x86_64-linux-gnu`";
  EXPECT_EQ(openblas_threads(), 1);
  ASSERT_TRUE(cohort::set_openblas_threads(2));
  EXPECT_EQ(openblas_threads(), 2);
  ASSERT_TRUE(cohort::set_openblas_threads(0));  // at least one thread
  EXPECT_EQ(openblas_threads(), 1);
}

TEST(BlasThreadSafetyTest, TheInstalledOpenBlasIsTheThreadedBuild) {
  // The concurrent cases below may pass by luck on the serial build (its race needs a thread
  // preempted at the wrong instruction); this one cannot.
  EXPECT_EQ(cohort::openblas_build(), cohort::OpenBlasBuild::kPthreads)
      << "libopenblas.so.0 is not the threaded OpenBLAS: run deploy/install-deps.sh, and see "
         "`update-alternatives --display libopenblas.so.0-x86_64-linux-gnu`";
  EXPECT_STREQ(cohort::blas_threads_warning(4), "");
  EXPECT_STREQ(cohort::blas_threads_warning(1), "");
}

TEST(BlasThreadSafetyTest, ConcurrentProductsAreRightWithOneBlasThreadEach) {
  at::set_num_threads(1);
  cohort::set_openblas_threads(1);
  EXPECT_EQ(wrong_threads(4, 60), 0)
      << "the BLAS gave wrong products when called from 4 threads at once; is it Debian's serial "
         "OpenBLAS (no locking)? `update-alternatives --display libblas.so.3-x86_64-linux-gnu`";
}

TEST(BlasThreadSafetyTest, ConcurrentProductsAreRightWithThreadedBlas) {
  at::set_num_threads(1);
  cohort::set_openblas_threads(2);
  EXPECT_EQ(wrong_threads(3, 40), 0) << "with 2 BLAS threads per call";
}

}  // namespace
