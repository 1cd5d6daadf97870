// NUMA topology and tiers: which nodes are fast (tier 0) and slow (tier 1).
// hwloc for nodes, CPUs, memory and HMAT attributes; libnuma for distances;
// sysfs for the kernel's memory tiers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace cxltier::numa {

struct NumaNode {
  int id = 0;  // OS node number
  uint64_t memory_bytes = 0;
  std::vector<int> cpus;                         // OS CPU numbers; empty for a memory-only node
  std::optional<uint64_t> read_latency_ns;       // HMAT, seen from the CPUs' node
  std::optional<uint64_t> read_bandwidth_mib_s;  // HMAT
  std::optional<int> kernel_memory_tier;         // /sys/devices/virtual/memory_tiering
};

struct Topology {
  std::vector<NumaNode> nodes;
  std::vector<std::vector<int>> distances;  // [i][j] between nodes[i] and nodes[j] (SLIT)
  std::string source;                       // how it was found, for logs

  const NumaNode* Find(int id) const;
};

// Reads the machine. Never fails: without hwloc data it falls back to one node.
Topology Discover(const std::string& sysfs_root = "/sys");

struct TierAssignment {
  std::vector<int> fast_nodes;  // tier 0
  std::vector<int> slow_nodes;  // tier 1
  std::string why;              // "auto: CPU-less nodes are tier 1", "config override", ...
  bool has_slow() const { return !slow_nodes.empty(); }
};

// Nodes with CPUs are tier 0 and memory-only nodes tier 1, unless the config
// names nodes (both lists non-empty). Returns an error string for nodes that
// do not exist.
TierAssignment AssignTiers(const Topology& topo, const std::vector<int>& fast_override,
                           const std::vector<int>& slow_override, std::string* error);

// /proc/sys/kernel/numa_balancing: 0 off, 1 normal, 2 memory tiering (bits);
// -1 when unknown. In normal mode the kernel migrates pages towards the CPUs
// that touch them, undoing demotions of pages that have no memory policy.
int KernelNumaBalancing(const std::string& proc_root = "/proc");

// One line per node, for logs and `cxltierctl tiers`.
std::string Describe(const Topology& topo, const TierAssignment& tiers);

}  // namespace cxltier::numa
