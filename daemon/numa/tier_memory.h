// Memory for copy mode's per-tier pools. A tier pool's pages never move:
// they are placed on the tier's nodes before the client sees them, and a
// block changes tier by being copied into the other tier's pool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "numa/migrator.h"

namespace cxltier::numa {

struct TierMemory {
  int fd = -1;  // the caller owns it: a sealed memfd (created) or the client's devdax fd
  std::shared_ptr<const Mapping> mapping;  // read-write, `bytes` long
  std::vector<int> nodes;                  // where its pages are
};

// A memfd of `bytes` whose pages are all on `nodes`: bound there (mbind,
// MPOL_BIND) before any page exists, faulted in (MADV_POPULATE_WRITE), asked
// of the kernel page by page (move_pages), and sealed against any change of
// size. kLimit when the nodes have less free memory than `bytes` or when a
// page landed elsewhere (the caller owns the memory's fd).
Result<TierMemory> CreateTierMemory(const std::vector<int>& nodes, uint64_t bytes,
                                    const std::string& name);

// Reconnect: adopts `fd` (the caller keeps it), a memfd a daemon made with
// CreateTierMemory(nodes, bytes, name), bytes and all. kBadPool unless it
// is one: a memfd named `name`, sealed against any change of size,
// exactly `bytes` long, with no hole, every page on `nodes`. Nothing of it is
// written or allocated.
Result<TierMemory> AdoptTierMemory(int fd, const std::vector<int>& nodes, uint64_t bytes,
                                   const std::string& name);

// What a device-DAX character device is (from /sys/dev/char/MAJ:MIN).
struct DevdaxInfo {
  uint64_t size = 0;   // bytes
  uint64_t align = 0;  // mappings start and end on this
  int node = -1;       // target_node (the memory's own node), or numa_node
};
// What the device-DAX device `fd` is; kBadPool says what it is instead.
// `sys_root` prefixes /sys (tests).
Result<DevdaxInfo> InspectDevdax(int fd, const std::string& sys_root = "");

// Maps `bytes` of a device-DAX device from `offset` (both multiples of its
// alignment). The fd stays the caller's. kBadPool when mmap fails.
Result<TierMemory> MapDevdax(int fd, uint64_t offset, uint64_t bytes);

}  // namespace cxltier::numa
