// NUMA topology and tiers: which nodes make tier 0 (fast), tier 1, tier 2...
// hwloc for nodes, CPUs, memory and HMAT attributes; libnuma for distances;
// sysfs for the kernel's memory tiers (and HMAT where hwloc has none).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cxltier/status.h"

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

// Reads the machine. Never fails: without hwloc data it reads sysfs, and
// without that it falls back to one node. HMAT values hwloc does not give are
// read from sysfs (nodeN/access0/initiators).
Topology Discover(const std::string& sysfs_root = "/sys");

// Reads the machine from sysfs alone (devices/system/node/node*: cpulist,
// meminfo, distance, access0/initiators/read_latency and read_bandwidth;
// devices/virtual/memory_tiering). For the tests' fake sysfs trees and as
// Discover's fallback; no nodes when the tree has none.
Topology DiscoverSysfs(const std::string& sysfs_root);

// As many tiers as the engine can hold (kMaxTiers in cxltier/block.h).
inline constexpr size_t kMaxDiscoveredTiers = 8;

// A memory-only node whose HMAT read latency is more than this many times the
// fastest node of its tier (same kernel memory tier) starts a tier of its own.
inline constexpr double kHmatSplitRatio = 1.5;

struct TierAssignment {
  std::vector<int> fast_nodes;  // tier 0
  std::vector<int> slow_nodes;  // tier 1
  std::string why;              // "auto: ...", "config override", ...
  // Tiers 2, 3, ... (each non-empty); empty with two tiers. Tier k's nodes
  // are Nodes(k) for every k.
  std::vector<std::vector<int>> lower_nodes;

  bool has_slow() const { return !slow_nodes.empty(); }
  // 1 (tier 0 alone: no slow tier), 2, 3, ...
  size_t count() const { return has_slow() ? 2 + lower_nodes.size() : 1; }
  // REQUIRES: tier < count().
  const std::vector<int>& Nodes(size_t tier) const {
    return tier == 0 ? fast_nodes : tier == 1 ? slow_nodes : lower_nodes[tier - 2];
  }
  // The first tier that names `node`, or -1.
  int TierOf(int node) const;
};

// Automatic tiers (no override):
//   - tier 0 is the nodes with CPUs (the first node when none has CPUs);
//   - memory-only nodes follow, grouped by the kernel's memory tier (a lower
//     memory_tier id, a smaller abstract distance, is faster); nodes the
//     kernel puts in no memory tier come after every kernel tier;
//   - within one kernel memory tier, nodes are ordered by HMAT read latency
//     (then bandwidth, higher first) and a node more than kHmatSplitRatio times
//     slower than the first node of its tier starts a new tier; nodes without
//     HMAT latency stay in the last tier of their kernel memory tier;
//   - at most kMaxDiscoveredTiers: any further ones join the last.
// Two nodes, one with CPUs and one without, are tiers 0 and 1, as always.
// `override` (the config's, tier 0 first) replaces all of it: at least two
// tiers, each with a node, every node existing; otherwise kBadPayload says why.
Result<TierAssignment> AssignTiers(const Topology& topo,
                                   const std::vector<std::vector<int>>& override);

// The two-tier form of the override (both empty: automatic).
Result<TierAssignment> AssignTiers(const Topology& topo, const std::vector<int>& fast_override,
                                   const std::vector<int>& slow_override);

// /proc/sys/kernel/numa_balancing: 0 off, 1 normal, 2 memory tiering (bits);
// -1 when unknown. In normal mode the kernel migrates pages towards the CPUs
// that touch them, undoing demotions of pages that have no memory policy.
int KernelNumaBalancing(const std::string& proc_root = "/proc");

// One line per node, for logs and `cxltierctl tiers`.
std::string Describe(const Topology& topo, const TierAssignment& tiers);

}  // namespace cxltier::numa
