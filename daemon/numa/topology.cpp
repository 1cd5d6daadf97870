#include "numa/topology.h"

#include <hwloc.h>
#include <numa.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
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

std::optional<uint64_t> ReadNumber(const std::filesystem::path& file) {
  std::ifstream in(file);
  uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

// HMAT as the kernel gives it: the node's access class 0 (its nearest
// initiator), read latency in ns and read bandwidth in MiB/s. Fills only what
// hwloc left empty.
void ReadHmat(const std::string& sysfs_root, Topology& topo) {
  const std::filesystem::path dir = std::filesystem::path(sysfs_root) / "devices/system/node";
  for (NumaNode& node : topo.nodes) {
    const auto access = dir / ("node" + std::to_string(node.id)) / "access0/initiators";
    if (!node.read_latency_ns) node.read_latency_ns = ReadNumber(access / "read_latency");
    if (!node.read_bandwidth_mib_s) {
      node.read_bandwidth_mib_s = ReadNumber(access / "read_bandwidth");
    }
  }
}

// Memory-only nodes in tier order (see AssignTiers in the header).
std::vector<std::vector<int>> OrderLowerTiers(std::vector<const NumaNode*> nodes) {
  constexpr int kNoKernelTier = std::numeric_limits<int>::max();
  auto kernel_tier = [&](const NumaNode* n) {
    return n->kernel_memory_tier.value_or(kNoKernelTier);
  };
  std::sort(nodes.begin(), nodes.end(), [&](const NumaNode* a, const NumaNode* b) {
    if (kernel_tier(a) != kernel_tier(b)) return kernel_tier(a) < kernel_tier(b);
    if (a->read_latency_ns.has_value() != b->read_latency_ns.has_value()) {
      return a->read_latency_ns.has_value();  // known latencies first
    }
    if (a->read_latency_ns != b->read_latency_ns) return a->read_latency_ns < b->read_latency_ns;
    const uint64_t bw_a = a->read_bandwidth_mib_s.value_or(0);
    const uint64_t bw_b = b->read_bandwidth_mib_s.value_or(0);
    if (bw_a != bw_b) return bw_a > bw_b;
    return a->id < b->id;
  });
  std::vector<std::vector<int>> tiers;
  const NumaNode* first = nullptr;  // the fastest node of the tier being filled
  for (const NumaNode* n : nodes) {
    const bool new_kernel_tier = !first || kernel_tier(n) != kernel_tier(first);
    const bool much_slower = first && first->read_latency_ns && n->read_latency_ns &&
                             static_cast<double>(*n->read_latency_ns) >
                                 kHmatSplitRatio * static_cast<double>(*first->read_latency_ns);
    if (new_kernel_tier || much_slower) {
      tiers.emplace_back();
      first = n;
    }
    tiers.back().push_back(n->id);
  }
  return tiers;
}

}  // namespace

int TierAssignment::TierOf(int node) const {
  for (size_t k = 0; k < count(); ++k) {
    const std::vector<int>& nodes = Nodes(k);
    if (std::find(nodes.begin(), nodes.end(), node) != nodes.end()) return static_cast<int>(k);
  }
  return -1;
}

Topology DiscoverSysfs(const std::string& sysfs_root) {
  namespace fs = std::filesystem;
  Topology topo;
  topo.source = "sysfs";
  const fs::path dir = fs::path(sysfs_root) / "devices/system/node";
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 ||
        name.find_first_not_of("0123456789", 4) != std::string::npos) {
      continue;
    }
    NumaNode node;
    node.id = std::stoi(name.substr(4));
    std::string line;
    if (std::ifstream cpus(entry.path() / "cpulist"); std::getline(cpus, line)) {
      node.cpus = ParseNodeList(line);
    }
    // "Node 0 MemTotal:       2030572 kB"
    std::ifstream meminfo(entry.path() / "meminfo");
    while (std::getline(meminfo, line)) {
      std::istringstream words(line);
      std::string node_word, id, key;
      uint64_t kib = 0;
      if (words >> node_word >> id >> key >> kib && key == "MemTotal:") {
        node.memory_bytes = kib << 10;
      }
    }
    topo.nodes.push_back(std::move(node));
  }
  std::sort(topo.nodes.begin(), topo.nodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.id < b.id; });
  // nodeN/distance lists the distances to every online node, in node order.
  topo.distances.assign(topo.nodes.size(), std::vector<int>(topo.nodes.size(), 20));
  for (size_t i = 0; i < topo.nodes.size(); ++i) {
    topo.distances[i][i] = 10;
    std::ifstream in(dir / ("node" + std::to_string(topo.nodes[i].id)) / "distance");
    for (size_t j = 0, d = 0; j < topo.nodes.size() && in >> d; ++j) {
      topo.distances[i][j] = static_cast<int>(d);
    }
  }
  ReadHmat(sysfs_root, topo);
  ReadMemoryTiers(sysfs_root, topo);
  return topo;
}

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
    Topology from_sysfs = DiscoverSysfs(sysfs_root);
    if (!from_sysfs.nodes.empty()) return from_sysfs;
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
  ReadHmat(sysfs_root, topo);
  ReadMemoryTiers(sysfs_root, topo);
  return topo;
}

Result<TierAssignment> AssignTiers(const Topology& topo,
                                   const std::vector<std::vector<int>>& override) {
  TierAssignment a;
  if (!override.empty()) {
    std::string error;  // the last problem found
    if (override.size() < 2) error = "the tiers override needs at least two tiers";
    if (override.size() > kMaxDiscoveredTiers) {
      error = "the tiers override names " + std::to_string(override.size()) + " tiers; at most " +
              std::to_string(kMaxDiscoveredTiers);
    }
    for (size_t k = 0; k < override.size(); ++k) {
      if (override[k].empty()) error = "tier " + std::to_string(k) + " of the override has no node";
      for (int n : override[k]) {
        if (!topo.Find(n)) {
          error = "node " + std::to_string(n) + " of tier " + std::to_string(k) + " does not exist";
        }
      }
    }
    if (!error.empty()) return Status::Fail(wire::ErrorCode::kBadPayload, error);
    a.fast_nodes = override[0];
    a.slow_nodes = override[1];
    a.lower_nodes.assign(override.begin() + 2, override.end());
    a.why = "config override";
    return a;
  }
  std::vector<const NumaNode*> memory_only;
  for (const NumaNode& n : topo.nodes) {
    if (n.cpus.empty()) {
      memory_only.push_back(&n);
    } else {
      a.fast_nodes.push_back(n.id);
    }
  }
  if (a.fast_nodes.empty() && !memory_only.empty()) {  // no node has CPUs (odd): the first is fast
    a.fast_nodes.push_back(memory_only.front()->id);
    memory_only.erase(memory_only.begin());
  }
  std::vector<std::vector<int>> lower = OrderLowerTiers(std::move(memory_only));
  while (lower.size() + 1 > kMaxDiscoveredTiers) {  // the slowest ones share the last tier
    lower[lower.size() - 2].insert(lower[lower.size() - 2].end(), lower.back().begin(),
                                   lower.back().end());
    lower.pop_back();
  }
  if (!lower.empty()) {
    a.slow_nodes = lower[0];
    a.lower_nodes.assign(lower.begin() + 1, lower.end());
  }
  a.why = lower.size() <= 1
              ? "auto: nodes with CPUs are tier 0, memory-only nodes tier 1"
              : "auto: nodes with CPUs are tier 0, memory-only nodes in " +
                    std::to_string(lower.size()) + " tiers by kernel memory tier and HMAT latency";
  return a;
}

Result<TierAssignment> AssignTiers(const Topology& topo, const std::vector<int>& fast_override,
                                   const std::vector<int>& slow_override) {
  if (fast_override.empty() && slow_override.empty()) {
    return AssignTiers(topo, std::vector<std::vector<int>>{});
  }
  TierAssignment a;
  std::string error;  // the last problem found
  for (int n : fast_override) {
    if (!topo.Find(n)) error = "fast node " + std::to_string(n) + " does not exist";
  }
  for (int n : slow_override) {
    if (!topo.Find(n)) error = "slow node " + std::to_string(n) + " does not exist";
  }
  if (fast_override.empty()) error = "the tiers override needs at least one fast node";
  if (!error.empty()) return Status::Fail(wire::ErrorCode::kBadPayload, error);
  a.fast_nodes = fast_override;
  a.slow_nodes = slow_override;
  a.why = "config override";
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
    std::string in_tiers;
    for (size_t k = 0; k < tiers.count(); ++k) {
      const std::vector<int>& nodes = tiers.Nodes(k);
      if (std::find(nodes.begin(), nodes.end(), n.id) == nodes.end()) continue;
      in_tiers += (in_tiers.empty() ? "" : "+") + std::to_string(k);
    }
    out << "node " << n.id << ": " << (n.memory_bytes >> 20) << " MiB, " << n.cpus.size()
        << " CPUs, tier " << (in_tiers.empty() ? "-" : in_tiers);
    if (n.read_latency_ns) out << ", read latency " << *n.read_latency_ns << " ns";
    if (n.read_bandwidth_mib_s) out << ", read bandwidth " << *n.read_bandwidth_mib_s << " MiB/s";
    if (n.kernel_memory_tier) out << ", kernel memory_tier" << *n.kernel_memory_tier;
    out << "\n";
  }
  return out.str();
}

}  // namespace cxltier::numa
