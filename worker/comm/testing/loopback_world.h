#pragma once

// Test helper: the CommWorlds of an in-process group over the loopback transport and one shared
// HashStore. `node_of(rank)` simulates the node each rank runs on (default: all on one node).

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/store/hash_store.h"
#include "worker/comm/transport/loopback/loopback_transport.h"

namespace cohort::comm::testing {

inline std::vector<std::shared_ptr<CommWorld>> loopback_worlds(
    int size, const std::function<std::string(int)>& node_of = [](int) { return std::string("node0"); },
    std::shared_ptr<LoopbackFabric>* fabric_out = nullptr) {
  auto fabric = std::make_shared<LoopbackFabric>(size);
  auto store = std::make_shared<HashStore>();
  std::vector<std::string> nodes;
  for (int r = 0; r < size; ++r) nodes.push_back(node_of(r));
  std::vector<std::shared_ptr<CommWorld>> worlds;
  for (int r = 0; r < size; ++r) {
    worlds.push_back(std::make_shared<CommWorld>(CommWorld{fabric->transport(r), store, nodes}));
  }
  if (fabric_out != nullptr) *fabric_out = fabric;
  return worlds;
}

// `ranks_per_node` consecutive ranks per simulated node: node_of for loopback_worlds.
inline std::function<std::string(int)> nodes_of(int ranks_per_node) {
  return [ranks_per_node](int rank) { return "node" + std::to_string(rank / ranks_per_node); };
}

}  // namespace cohort::comm::testing
