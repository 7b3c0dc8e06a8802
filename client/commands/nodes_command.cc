// cohort nodes

#include <fmt/format.h>

#include "client/cli/output.h"
#include "client/client.h"
#include "client/commands/commands.h"
#include "worker/base/cli_flags.h"

namespace cohort::client::commands {
namespace {

using namespace cli;

constexpr const char* kDescription =
    "Lists the live nodes (agents that registered and heartbeat) with their capacity and what is free.\n"
    "STATE is ready, draining (its cohortd is stopping) or suspect (its agent did not answer a launch;\n"
    "nothing is placed there until it heartbeats again; why is printed below the table) or restored\n"
    "(known from etcd since this coordinator took over; its agent has not registered with it yet).\n"
    "-o wide adds the host name and each GPU; -o json and -o yaml print {nodes: [...]}\n"
    "(cohort.v1.ListNodesResponse).";

constexpr const char* kFooter = R"(examples:
  cohort nodes
  cohort nodes -o wide
  cohort nodes -o json | jq '.nodes[].node.free_slots'
)";

int run(const CommandContext& context) {
  Client client(context.coordinator, context.client_options);
  StatusOr<std::vector<cohort::v1::NodeStatus>> nodes = client.nodes();
  if (!nodes.ok()) return report_error(context, nodes.status());
  if (context.structured()) {
    cohort::v1::ListNodesResponse response;
    for (const cohort::v1::NodeStatus& node : *nodes) *response.add_nodes() = node;
    print_structured(context, to_json(response));
    return kExitOk;
  }
  if (nodes->empty()) {
    *context.out << "no live nodes (start an agent: cohortd --role agent --coordinator "
                 << context.coordinator << " --data-dir DIR)\n";
    return kExitOk;
  }
  const bool wide = context.format == OutputFormat::kWide;
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> suspects;  // "node-b is suspect: why", printed below the table
  for (const cohort::v1::NodeStatus& status : *nodes) {
    const cohort::v1::NodeInfo& node = status.node();
    std::string gpus = "-";
    if (node.gpus_size() > 0) {
      gpus = fmt::format("{}/{} free", status.free_gpus_size(), node.gpus_size());
      if (!node.gpus(0).model().empty()) gpus += " (" + node.gpus(0).model() + ")";
    }
    std::vector<std::string> row = {node.node_id(), node.address(),
                                    fmt::format("{}/{}", node.free_slots(), node.slots()), gpus,
                                    std::to_string(node.cores()), format_bytes(node.memory_bytes()),
                                    format_duration(status.lease_remaining_ms() / 1000)};
    const char* state = !status.suspect_reason().empty()   ? "suspect"
                        : status.draining()                ? "draining"
                        : status.awaiting_registration() ? "restored"
                                                           : "ready";
    row.insert(row.begin() + 2, state);
    if (!status.suspect_reason().empty()) suspects.push_back(node.node_id() + " is suspect: " + status.suspect_reason());
    if (wide) {
      // Every GPU: "0:A100 40.0 GiB,1:A100 40.0 GiB".
      std::string each;
      for (const auto& gpu : node.gpus()) {
        each += fmt::format("{}{}:{} {}", each.empty() ? "" : ",", gpu.index(),
                            gpu.model().empty() ? "gpu" : gpu.model(), format_bytes(gpu.memory_bytes()));
      }
      row.insert(row.begin() + 2, node.hostname().empty() ? "-" : node.hostname());
      row.push_back(each.empty() ? "-" : each);
    }
    rows.push_back(std::move(row));
  }
  if (wide) {
    print_table(*context.out,
                {"NODE", "ADDRESS", "HOSTNAME", "STATE", "FREE/SLOTS", "GPUS", "CORES", "MEMORY", "LEASE", "GPU LIST"},
                rows);
  } else {
    print_table(*context.out, {"NODE", "ADDRESS", "STATE", "FREE/SLOTS", "GPUS", "CORES", "MEMORY", "LEASE"}, rows);
  }
  for (const std::string& line : suspects) *context.out << line << "\n";
  return kExitOk;
}

CommandRunner define(CLI::App* app) {
  app->description(kDescription);
  app->footer(kFooter);
  return [](const CommandContext& context) { return run(context); };
}

}  // namespace

const Command kNodesCommand = {"nodes", "list live nodes and their free capacity", define};

}  // namespace cohort::client::commands
