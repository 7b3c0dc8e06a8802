// cohort nodes

#include <fmt/format.h>

#include "client/cli/args.h"
#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kHelp = R"(usage: cohort nodes

Lists the live nodes (agents that registered and heartbeat) with their capacity and what is free.

  -o json prints {"nodes": [...]} (cohort.v1.ListNodesResponse).

examples:
  cohort nodes
  cohort nodes -o json | jq '.nodes[].node.free_slots'
)";

int run(const CommandContext& context, const std::vector<std::string>& raw_args) {
  StatusOr<Args> args = Args::parse(raw_args, {});
  if (!args.ok()) return usage_error(context, "nodes", args.status().message());
  if (!args->positional().empty()) return usage_error(context, "nodes", "nodes takes no arguments");
  Client client(context.coordinator, context.client_options);
  StatusOr<std::vector<cohort::v1::NodeStatus>> nodes = client.nodes();
  if (!nodes.ok()) return report_error(context, nodes.status());
  if (context.format == OutputFormat::kJson) {
    cohort::v1::ListNodesResponse response;
    for (const cohort::v1::NodeStatus& node : *nodes) *response.add_nodes() = node;
    *context.out << to_json(response);
    return kExitOk;
  }
  if (nodes->empty()) {
    *context.out << "no live nodes (start an agent: cohortd --role agent --coordinator "
                 << context.coordinator << " --data-dir DIR)\n";
    return kExitOk;
  }
  std::vector<std::vector<std::string>> rows;
  for (const cohort::v1::NodeStatus& status : *nodes) {
    const cohort::v1::NodeInfo& node = status.node();
    std::string gpus = "-";
    if (node.gpus_size() > 0) {
      gpus = fmt::format("{}/{} free", status.free_gpus_size(), node.gpus_size());
      if (!node.gpus(0).model().empty()) gpus += " (" + node.gpus(0).model() + ")";
    }
    rows.push_back({node.node_id(), node.address(), fmt::format("{}/{}", node.free_slots(), node.slots()),
                    gpus, std::to_string(node.cores()), format_bytes(node.memory_bytes()),
                    format_duration(status.lease_remaining_ms() / 1000)});
  }
  print_table(*context.out, {"NODE", "ADDRESS", "FREE/SLOTS", "GPUS", "CORES", "MEMORY", "LEASE"}, rows);
  return kExitOk;
}

}  // namespace

const Command kNodesCommand = {"nodes", "list live nodes and their free capacity", kHelp, run};

}  // namespace cohort::client::commands
