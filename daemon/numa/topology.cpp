#include "numa/topology.h"

#include <hwloc.h>
#include <numa.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace cxltier::numa {
namespace {

// Parses a sysfs node list like "0-2,4".
std::vector<int> ParseNodeList(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part == "\n") continue;
    const auto dash = part.find('-');
    try {
      if (dash == std::string::npos) {
        out.push_back(std::stoi(part));
      } else {
        const int a = std::stoi(part.substr(0, dash)), b = std::stoi(part.substr(dash + 1));
        for (int i = a; i <= b && i - a < 4096; ++i) out.push_back(i);
      }
    } catch (...) {
    }
  }
  return out;
}

void ReadMemoryTiers(const std::string& sysfs_root, Topology& topo) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(sysfs_root) / "devices/virtual/memory_tiering";
  std::error_code ec;
  if (!fs::exists(dir, ec)) return;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("memory_tier", 0) != 0) continue;
    int tier = 0;
    try {
      tier = std::stoi(name.substr(11));
    } catch (...) {
      continue;
    }
    std::ifstream in(entry.path() / "nodelist");
    std::string list;
    std::getline(in, list);
    for (int n : ParseNodeList(list)) {
      for (NumaNode& node : topo.nodes) {
        if (node.id == n) node.kernel_memory_tier = tier;
      }
    }
  }
}

}  // namespace

const NumaNode* Topology::Find(int id) const {
  for (const NumaNode& n : nodes) {
    if (n.id == id) return &n;
  }
  return nullptr;
}

Topology Discover(const std::string& sysfs_root) {
  Topology topo;
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) == 0 && hwloc_topology_load(t) == 0) {
    topo.source = "hwloc";
    const int n = hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_NUMANODE);
    // HMAT values are read as seen from the first node with CPUs.
    hwloc_cpuset_t initiator_set = nullptr;
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      if (obj && obj->cpuset && !hwloc_bitmap_iszero(obj->cpuset)) {
        initiator_set = obj->cpuset;
        break;
      }
    }
    for (int i = 0; i < n; ++i) {
      hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, static_cast<unsigned>(i));
      if (!obj) continue;
      NumaNode node;
      node.id = static_cast<int>(obj->os_index);
      node.memory_bytes = obj->attr ? obj->attr->numanode.local_memory : 0;
      // A node's own CPUs come from the kernel (libnuma reads sysfs): hwloc gives
      // a memory-only node the cpuset of the CPUs it hangs under (its HMAT
      // initiator), which would make CXL memory look like a node with CPUs.
      if (numa_available() >= 0) {
        bitmask* cpus = numa_allocate_cpumask();
        if (numa_node_to_cpus(node.id, cpus) == 0) {
          for (unsigned c = 0; c < cpus->size; ++c) {
            if (numa_bitmask_isbitset(cpus, c)) node.cpus.push_back(static_cast<int>(c));
          }
        }
        numa_free_cpumask(cpus);
      } else if (obj->cpuset) {
        for (int c = hwloc_bitmap_first(obj->cpuset); c >= 0;
             c = hwloc_bitmap_next(obj->cpuset, c)) {
          node.cpus.push_back(c);
        }
      }
      if (initiator_set) {
        hwloc_location loc;
        loc.type = HWLOC_LOCATION_TYPE_CPUSET;
        loc.location.cpuset = initiator_set;
        hwloc_uint64_t v = 0;
        if (hwloc_memattr_get_value(t, HWLOC_MEMATTR_ID_LATENCY, obj, &loc, 0, &v) == 0) {
          node.read_latency_ns = v;
        }
        if (hwloc_memattr_get_value(t, HWLOC_MEMATTR_ID_BANDWIDTH, obj, &loc, 0, &v) == 0) {
          node.read_bandwidth_mib_s = v;
        }
      }
      topo.nodes.push_back(std::move(node));
    }
    hwloc_topology_destroy(t);
  }
  if (topo.nodes.empty()) {
    topo.source = "fallback: one node";
    topo.nodes.push_back(NumaNode{0, 0, {0}, {}, {}, {}});
  }
  std::sort(topo.nodes.begin(), topo.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  const bool have_numa = numa_available() >= 0;
  topo.distances.assign(topo.nodes.size(), std::vector<int>(topo.nodes.size(), 10));
  for (size_t i = 0; i < topo.nodes.size(); ++i) {
    for (size_t j = 0; j < topo.nodes.size(); ++j) {
      const int d = have_numa ? numa_distance(topo.nodes[i].id, topo.nodes[j].id) : 0;
      topo.distances[i][j] = d > 0 ? d : (i == j ? 10 : 20);
    }
  }
  ReadMemoryTiers(sysfs_root, topo);
  return topo;
}

TierAssignment AssignTiers(const Topology& topo, const std::vector<int>& fast_override,
                           const std::vector<int>& slow_override, std::string* error) {
  TierAssignment a;
  if (!fast_override.empty() || !slow_override.empty()) {
    for (int n : fast_override) {
      if (!topo.Find(n)) *error = "fast node " + std::to_string(n) + " does not exist";
    }
    for (int n : slow_override) {
      if (!topo.Find(n)) *error = "slow node " + std::to_string(n) + " does not exist";
    }
    if (fast_override.empty()) *error = "the tiers override needs at least one fast node";
    a.fast_nodes = fast_override;
    a.slow_nodes = slow_override;
    a.why = "config override";
    return a;
  }
  for (const NumaNode& n : topo.nodes)
    (n.cpus.empty() ? a.slow_nodes : a.fast_nodes).push_back(n.id);
  if (a.fast_nodes.empty()) {  // no node has CPUs (odd); keep the first as fast
    a.fast_nodes.push_back(a.slow_nodes.front());
    a.slow_nodes.erase(a.slow_nodes.begin());
  }
  a.why = "auto: nodes with CPUs are tier 0, memory-only nodes tier 1";
  return a;
}

int KernelNumaBalancing(const std::string& proc_root) {
  std::ifstream in(proc_root + "/sys/kernel/numa_balancing");
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}

std::string Describe(const Topology& topo, const TierAssignment& tiers) {
  std::ostringstream out;
  for (const NumaNode& n : topo.nodes) {
    const bool fast = std::count(tiers.fast_nodes.begin(), tiers.fast_nodes.end(), n.id) > 0;
    const bool slow = std::count(tiers.slow_nodes.begin(), tiers.slow_nodes.end(), n.id) > 0;
    out << "node " << n.id << ": " << (n.memory_bytes >> 20) << " MiB, " << n.cpus.size()
        << " CPUs, tier "
        << (fast && slow ? "0+1"
            : fast       ? "0"
            : slow       ? "1"
                         : "-");
    if (n.read_latency_ns) out << ", read latency " << *n.read_latency_ns << " ns";
    if (n.read_bandwidth_mib_s) out << ", read bandwidth " << *n.read_bandwidth_mib_s << " MiB/s";
    if (n.kernel_memory_tier) out << ", kernel memory_tier" << *n.kernel_memory_tier;
    out << "\n";
  }
  return out.str();
}

}  // namespace cxltier::numa
