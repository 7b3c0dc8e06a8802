// The object collectives and send_obj / recv_obj with ranks as threads over the loopback
// transport: values of several types (strings, ints, doubles, tensors, lists, dicts) round-trip
// through torch's pickler.

#include "worker/distributed/object_collectives.h"

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <gtest/gtest.h>

#include "worker/autograd/testing/autograd_ranks.h"
#include "worker/distributed/testing/expect_tensor.h"

namespace cohort::distributed {
namespace {

using autograd::testing::run_autograd_ranks;
using testing::expect_equal;
using namespace std::chrono_literals;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error(what);
}

// The object rank `rank` contributes: a tuple of its rank, a string, a tensor and a dict.
c10::IValue object_of(int rank) {
  c10::Dict<std::string, double> dict;
  dict.insert("lr", 0.1 * (rank + 1));
  return c10::ivalue::Tuple::create({c10::IValue(int64_t{rank}), c10::IValue("rank " + std::to_string(rank)),
                                     c10::IValue(at::full({rank + 1}, rank * 1.5)), c10::IValue(dict)});
}

void expect_object(const c10::IValue& got, int rank, const std::string& what) {
  expect(got.isTuple(), what + ": not a tuple");
  const auto& e = got.toTupleRef().elements();
  expect(e.size() == 4, what + ": not 4 elements");
  expect(e[0].toInt() == rank, what + ": wrong rank " + std::to_string(e[0].toInt()));
  expect(e[1].toStringRef() == "rank " + std::to_string(rank), what + ": wrong string " + e[1].toStringRef());
  expect_equal(e[2].toTensor(), at::full({rank + 1}, rank * 1.5), what + ": tensor");
  auto dict = c10::impl::toTypedDict<std::string, double>(e[3].toGenericDict());
  expect(dict.at("lr") == 0.1 * (rank + 1), what + ": dict");
}

TEST(ObjectCollectivesTest, EveryCollectiveCarriesPickledValuesOfManyTypes) {
  for (int size : {1, 2, 3, 5}) {
    EXPECT_EQ(run_autograd_ranks(
                  size,
                  [size](int rank, comm::Communicator& comm) {
                    const int root = size - 1;
                    std::vector<c10::IValue> list;
                    if (rank == root) list = {c10::IValue("foo"), c10::IValue(12), object_of(root)};
                    broadcast_object_list(comm, list, root);
                    expect(list.size() == 3 && list[0].toStringRef() == "foo" && list[1].toInt() == 12,
                           "broadcast_object_list");
                    expect_object(list[2], root, "broadcast_object_list");

                    std::vector<c10::IValue> all;
                    all_gather_object(comm, all, object_of(rank));
                    expect(static_cast<int>(all.size()) == size, "all_gather_object size");
                    for (int r = 0; r < size; ++r) expect_object(all[r], r, "all_gather_object");

                    std::vector<c10::IValue> gathered;
                    gather_object(comm, object_of(rank), rank == 0 ? &gathered : nullptr, 0);
                    expect(static_cast<int>(gathered.size()) == (rank == 0 ? size : 0), "gather size");
                    for (size_t r = 0; r < gathered.size(); ++r) {
                      expect_object(gathered[r], static_cast<int>(r), "gather_object");
                    }

                    std::vector<c10::IValue> inputs, output;
                    if (rank == root) {
                      for (int r = 0; r < size; ++r) inputs.push_back(object_of(r));
                    }
                    scatter_object_list(comm, output, inputs, root);
                    expect(output.size() == 1, "scatter_object_list size");
                    expect_object(output[0], rank, "scatter_object_list");
                  }),
              "")
        << "size " << size;
  }
}

TEST(ObjectCollectivesTest, SendObjRecvObj) {
  EXPECT_EQ(run_autograd_ranks(3,
                               [](int rank, comm::Communicator& comm) {
                                 // A ring: each rank sends its object to the next and receives the previous
                                 // one's.
                                 const int next = (rank + 1) % 3, prev = (rank + 2) % 3;
                                 if (rank == 0) {
                                   send_obj(comm, object_of(rank), next, 5);
                                   expect_object(recv_obj(comm, prev, 5), prev, "recv_obj");
                                 } else {
                                   expect_object(recv_obj(comm, prev, 5), prev, "recv_obj");
                                   send_obj(comm, object_of(rank), next, 5);
                                 }
                               }),
            "");
}

// Each object call with a 300 ms per-call timeout, on ranks 0 and 1 of 3, while rank 2 (the root or
// peer each call needs data from) never joins: the call must fail naming itself well before the
// communicator's own 10 s timeout (run_autograd_ranks' kTestOpTimeout), so the option reaches the
// transfers. async_op is refused, naming the call.
TEST(ObjectCollectivesTest, EachCallFailsAfterItsOwnTimeoutWhenAPeerNeverJoins) {
  const OpOptions timeout{.async_op = false, .timeout = 300ms};
  const std::vector<std::pair<std::string, std::function<void(int, comm::Communicator&)>>> calls = {
      {"broadcast_object_list",
       [&](int, comm::Communicator& comm) {
         std::vector<c10::IValue> list;
         broadcast_object_list(comm, list, 2, timeout);
       }},
      {"all_gather_object",
       [&](int rank, comm::Communicator& comm) {
         std::vector<c10::IValue> all;
         all_gather_object(comm, all, object_of(rank), timeout);
       }},
      {"gather_object",
       [&](int rank, comm::Communicator& comm) {
         std::vector<c10::IValue> gathered;
         gather_object(comm, object_of(rank), rank == 0 ? &gathered : nullptr, 0, timeout);
       }},
      {"scatter_object_list",
       [&](int, comm::Communicator& comm) {
         std::vector<c10::IValue> output;
         scatter_object_list(comm, output, {}, 2, timeout);
       }},
      // send_obj / recv_obj fail with the error of the transfer they made (a send or recv naming
      // the peer and the tag).
      {"send to rank 2 (tag 4)",
       [&](int, comm::Communicator& comm) { send_obj(comm, object_of(0), 2, 4, timeout); }},
      {"recv from rank 2 (tag 4)", [&](int, comm::Communicator& comm) { recv_obj(comm, 2, 4, timeout); }},
  };
  for (const auto& [name, call] : calls) {
    EXPECT_EQ(run_autograd_ranks(3,
                                 [&, name = name, call = call](int rank, comm::Communicator& comm) {
                                   if (rank == 2) return;  // never joins
                                   const auto start = std::chrono::steady_clock::now();
                                   std::string error;
                                   try {
                                     call(rank, comm);
                                   } catch (const std::exception& e) {
                                     error = e.what();
                                   }
                                   // gather_object: only the destination surely waits for rank 2
                                   // (rank 1's part may be taken before rank 0 times out).
                                   if (name == "gather_object" && rank == 1) return;
                                   expect(error.find(name) != std::string::npos,
                                          name + " did not fail naming itself: '" + error + "'");
                                   expect(std::chrono::steady_clock::now() - start < 5s,
                                          name + ": the 300 ms timeout took over 5 s");
                                 }),
              "")
        << name;
  }
  EXPECT_EQ(run_autograd_ranks(2,
                               [](int rank, comm::Communicator& comm) {
                                 std::vector<c10::IValue> list = {c10::IValue(1)};
                                 try {
                                   broadcast_object_list(comm, list, 0, {.async_op = true, .timeout = {}});
                                 } catch (const std::exception& e) {
                                   expect(std::string(e.what()).find("async_op is not supported") !=
                                              std::string::npos,
                                          std::string("unexpected error: ") + e.what());
                                   return;
                                 }
                                 throw std::runtime_error("async_op was accepted by broadcast_object_list");
                               }),
            "");
}

}  // namespace
}  // namespace cohort::distributed
