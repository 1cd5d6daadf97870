// What cxltier-replay asks the kernel: where pages are, what it migrated, and
// how much CPU time it and others spent. Linux only; every reader returns what
// it could read and says what it could not.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <istream>
#include <map>
#include <string>
#include <vector>

namespace cxltier::replay {

// /proc/vmstat, every counter (pgpromote_success, pgdemote_kswapd, numa_hint_faults...).
std::map<std::string, uint64_t> ReadVmstat();

// DAMON's schemes that are running (DAMON's sysfs admin interface): for
// each kdamond that is on, each scheme's action and the bytes it was
// applied to and tried on so far. Asks the kdamonds to refresh the stats
// first (update_schemes_stats); empty where DAMON is absent or off.
struct DamonScheme {
  std::string action;  // "migrate_hot", "migrate_cold", ...
  uint64_t applied_bytes = 0, tried_bytes = 0;
};
std::vector<DamonScheme> ReadDamonSchemes();

// A node's zones, from /proc/zoneinfo: free pages (on the free lists and the
// per-CPU lists) and high watermarks.
struct ZoneMemory {
  uint64_t free = 0, high = 0;
  // The sum over the zones of what each has free above its own high
  // watermark and its reserve against user pages (ZONE_DMA's protection).
  uint64_t above_high = 0;
  // kswapd has given the node up ("node_unreclaimable"): 16 of its runs in a
  // row reclaimed nothing (kswapd_failures), and until some reclaim on the
  // node succeeds it is not woken, so nothing is demoted from the node.
  bool unreclaimable = false;
};
ZoneMemory NodeUserZones(int node);  // all 0 for a node that is not there
// The same from text in /proc/zoneinfo's format.
ZoneMemory ParseZoneinfo(std::istream& zoneinfo, int node);

// Asks a cgroup (v2) to reclaim `bytes` of its memory (memory.reclaim); with
// demotion on, reclaim demotes. A reclaim that frees anything on a node that
// kswapd has given up revives kswapd there. Returns "" or what went wrong
// (EAGAIN: it reclaimed less than asked).
std::string ReclaimFromCgroup(const std::string& cgroup_dir, uint64_t bytes);

// utime + stime of a process, in seconds (/proc/PID/stat); -1 when it is gone.
double ProcessCpuSeconds(pid_t pid);
// Processes whose comm starts with `prefix` ("kswapd"): their pids.
std::vector<pid_t> FindProcesses(const std::string& prefix);

// Where pages are. move_pages(2) with no target nodes, as the issue of a
// touch asks it; a page it cannot answer for (NUMA balancing makes pages it
// is sampling read as -ENOENT) is looked up through /proc/self/pagemap and
// the nodes' memory blocks (root only: the pagemap hides frame numbers from
// others).
class Residency {
 public:
  Residency();
  // Counts the pages of [base, base + bytes) on `fast` nodes, on other nodes,
  // and those nobody could place.
  struct Count {
    uint64_t fast = 0, other = 0, unknown = 0, via_pagemap = 0;
  };
  Count Query(const void* base, uint64_t bytes, const std::vector<int>& fast);
  // The same for several ranges of `bytes` each, in one move_pages call: one
  // Count per range.
  std::vector<Count> QueryMany(const std::vector<const void*>& bases, uint64_t bytes,
                               const std::vector<int>& fast);

 private:
  int NodeOfPage(uintptr_t address);  // via pagemap; -1 unknown
  void Add(size_t page, const std::vector<int>& fast, Count* c);
  int pagemap_ = -1;
  uint64_t block_bytes_ = 0;
  std::map<uint64_t, int> block_node_;  // first physical byte of a memory block -> node
  std::vector<void*> pages_;
  std::vector<int> status_;
};

// Locked memory on one node that leaves it `free_bytes` free above its high
// watermark (so the balloon itself never wakes reclaim): the same
// fast-tier capacity in every arm of a comparison (mbind MPOL_BIND, then
// mlock, so the kernel can neither reclaim, demote nor move it).
class Balloon {
 public:
  Balloon() = default;
  ~Balloon();
  Balloon(const Balloon&) = delete;
  Balloon& operator=(const Balloon&) = delete;
  // Returns "" or what went wrong. Inflating can wake kswapd (and, with
  // demotion on, make it demote), which frees more than it took: the balloon
  // grows and shrinks until the node's free memory above the high watermark
  // is within 1% of the target (32 KiB at least) and stays so for a round;
  // an error if it has not after 150 rounds of 100 ms (kswapd may still be
  // demoting after the arm before).
  std::string Inflate(int node, uint64_t free_bytes);
  // How far from `free_bytes` the node's free memory may settle: 1% of it,
  // 32 KiB at least (arms compared at the same free memory start within 2%
  // of each other).
  static uint64_t Slack(uint64_t free_bytes) {
    return std::max<uint64_t>(32 << 10, free_bytes / 100);
  }
  uint64_t bytes() const;
  // The balloon's bytes that are not on `node` (now): mlock keeps pages from
  // reclaim, not from migration, and a physical-address migrator (DAMOS
  // migrate_cold) could move them and give node 0 room the arm was not given.
  uint64_t OffNodeBytes(int node) const;

 private:
  std::string Settle(int node, uint64_t free_bytes);  // Inflate's rounds
  std::string Grow(int node, uint64_t bytes);
  void Shrink(uint64_t bytes);
  struct Chunk {
    void* base;
    uint64_t bytes;
  };
  std::vector<Chunk> chunks_;
  // OffNodeBytes's arrays, made when the balloon settles: at the end of an
  // arm node 0 may be full (DAMON promotes into it down to the min
  // watermark), and a page table for new arrays then met the OOM killer.
  mutable std::vector<void*> pages_;
  mutable std::vector<int> status_;
};

}  // namespace cxltier::replay
