// The object collectives and send_obj / recv_obj with ranks as threads over the loopback
// transport: values of several types (strings, ints, doubles, tensors, lists, dicts) round-trip
// through torch's pickler.

#include "worker/distributed/object_collectives.h"

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

}  // namespace
}  // namespace cohort::distributed
