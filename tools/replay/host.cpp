#include "host.h"

#include <dirent.h>
#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace cxltier::replay {

std::map<std::string, uint64_t> ReadVmstat() {
  std::map<std::string, uint64_t> out;
  std::ifstream in("/proc/vmstat");
  std::string name;
  uint64_t v = 0;
  while (in >> name >> v) out[name] = v;
  return out;
}

std::vector<DamonScheme> ReadDamonSchemes() {
  const std::string admin = "/sys/kernel/mm/damon/admin/kdamonds/";
  auto read = [](const std::string& path) {
    std::ifstream in(path);
    std::string v;
    in >> v;
    return v;
  };
  std::vector<DamonScheme> out;
  const std::string n = read(admin + "nr_kdamonds");
  for (int k = 0; k < std::atoi(n.c_str()); ++k) {
    const std::string kd = admin + std::to_string(k) + "/";
    if (read(kd + "state") != "on") continue;
    std::ofstream(kd + "state") << "update_schemes_stats";  // refreshes every scheme's stats
    for (int c = 0; c < std::atoi(read(kd + "contexts/nr_contexts").c_str()); ++c) {
      const std::string ctx = kd + "contexts/" + std::to_string(c) + "/schemes/";
      for (int i = 0; i < std::atoi(read(ctx + "nr_schemes").c_str()); ++i) {
        const std::string sc = ctx + std::to_string(i) + "/";
        out.push_back({read(sc + "action"),
                       std::strtoull(read(sc + "stats/sz_applied").c_str(), nullptr, 10),
                       std::strtoull(read(sc + "stats/sz_tried").c_str(), nullptr, 10)});
      }
    }
  }
  return out;
}

ZoneMemory NodeUserZones(int node) {
  std::ifstream in("/proc/zoneinfo");
  return ParseZoneinfo(in, node);
}

ZoneMemory ParseZoneinfo(std::istream& in, int node) {
  std::string line;
  bool ours = false;
  ZoneMemory m;
  uint64_t zone_free = 0, zone_high = 0, zone_reserve = 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  // Every zone of the node, ZONE_DMA too: a user page goes there once the
  // others are at their low watermarks, before the allocation falls back to
  // another node. A zone's free pages count those on its per-CPU lists
  // ("count:" under "pagesets"), free to any allocation all the same; what it
  // keeps from a user page is its high watermark plus its reserve against
  // allocations that could use a higher zone (the largest of "protection").
  auto end_zone = [&] {
    if (!ours) return;
    m.free += zone_free;
    m.high += zone_high;
    const uint64_t kept = zone_high + zone_reserve;
    m.above_high += zone_free > kept ? zone_free - kept : 0;
    zone_free = zone_high = zone_reserve = 0;
  };
  while (std::getline(in, line)) {
    int n = -1;
    char zone[32];
    if (std::sscanf(line.c_str(), "Node %d, zone %31s", &n, zone) == 2) {
      end_zone();
      ours = n == node;
      continue;
    }
    unsigned long long v = 0;
    if (!ours) continue;
    if (std::sscanf(line.c_str(), " node_unreclaimable: %llu", &v) == 1) m.unreclaimable = v != 0;
    if (std::sscanf(line.c_str(), " pages free %llu", &v) == 1) zone_free += v * page;
    if (std::sscanf(line.c_str(), " high %llu", &v) == 1) zone_high = v * page;
    if (std::sscanf(line.c_str(), " count: %llu", &v) == 1) zone_free += v * page;
    if (const size_t at = line.find("protection: ("); at != std::string::npos) {
      std::istringstream list(line.substr(at + 13));
      std::string item;
      while (std::getline(list, item, ',')) {
        zone_reserve =
            std::max<uint64_t>(zone_reserve, std::strtoull(item.c_str(), nullptr, 10) * page);
      }
    }
  }
  end_zone();
  return m;
}

std::string ReclaimFromCgroup(const std::string& cgroup_dir, uint64_t bytes) {
  const std::string path = cgroup_dir + "/memory.reclaim";
  const int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return path + ": " + std::strerror(errno);
  const std::string amount = std::to_string(bytes);
  const ssize_t n = write(fd, amount.data(), amount.size());
  const int err = errno;
  close(fd);
  if (n < 0) return path + ": " + std::strerror(err);
  return "";
}

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The comm (field 2) is in parentheses and may hold spaces: count from its end.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int f = 3; f <= 15 && rest >> field; ++f) {
    if (f == 14) utime = std::stoull(field);
    if (f == 15) stime = std::stoull(field);
  }
  return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::vector<pid_t> FindProcesses(const std::string& prefix) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end || pid <= 0) continue;
    std::ifstream in(std::string("/proc/") + e->d_name + "/comm");
    std::string comm;
    if (std::getline(in, comm) && comm.rfind(prefix, 0) == 0)
      out.push_back(static_cast<pid_t>(pid));
  }
  closedir(d);
  return out;
}

Residency::Residency() {
  pagemap_ = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  std::ifstream bs("/sys/devices/system/memory/block_size_bytes");
  std::string hex;
  if (bs >> hex) block_bytes_ = std::stoull(hex, nullptr, 16);
  for (int node = 0; node < 64 && block_bytes_; ++node) {
    const std::string dir = "/sys/devices/system/node/node" + std::to_string(node);
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      unsigned long long index = 0;
      if (std::sscanf(e->d_name, "memory%llu", &index) == 1) {
        block_node_[index * block_bytes_] = node;
      }
    }
    closedir(d);
  }
}

int Residency::NodeOfPage(uintptr_t address) {
  if (pagemap_ < 0 || block_node_.empty()) return -1;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t entry = 0;
  if (pread(pagemap_, &entry, sizeof(entry), static_cast<off_t>(address / page * 8)) !=
      sizeof(entry)) {
    return -1;
  }
  const uint64_t pfn = entry & ((uint64_t{1} << 55) - 1);
  if (!(entry >> 63) || pfn == 0) return -1;  // not present, or the pagemap hid the frame
  const uint64_t phys = pfn * page;
  auto it = block_node_.upper_bound(phys);
  if (it == block_node_.begin()) return -1;
  --it;
  return phys - it->first < block_bytes_ ? it->second : -1;
}

void Residency::Add(size_t i, const std::vector<int>& fast, Count* c) {
  int node = status_[i];
  if (node < 0) {
    node = NodeOfPage(reinterpret_cast<uintptr_t>(pages_[i]));
    c->via_pagemap += node >= 0;
  }
  if (node < 0) {
    ++c->unknown;
  } else if (std::find(fast.begin(), fast.end(), node) != fast.end()) {
    ++c->fast;
  } else {
    ++c->other;
  }
}

std::vector<Residency::Count> Residency::QueryMany(const std::vector<const void*>& bases,
                                                   uint64_t bytes, const std::vector<int>& fast) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const size_t per = (bytes + page - 1) / page;
  pages_.clear();
  for (const void* base : bases) {
    for (size_t i = 0; i < per; ++i) {
      pages_.push_back(const_cast<char*>(static_cast<const char*>(base)) + i * page);
    }
  }
  status_.assign(pages_.size(), -1);
  if (!pages_.empty() &&
      numa_move_pages(0, pages_.size(), pages_.data(), nullptr, status_.data(), 0) < 0) {
    status_.assign(pages_.size(), -errno);
  }
  std::vector<Count> out(bases.size());
  for (size_t b = 0; b < bases.size(); ++b) {
    for (size_t i = 0; i < per; ++i) Add(b * per + i, fast, &out[b]);
  }
  return out;
}

Residency::Count Residency::Query(const void* base, uint64_t bytes, const std::vector<int>& fast) {
  return QueryMany({base}, bytes, fast).front();
}

Balloon::~Balloon() {
  for (const Chunk& c : chunks_) munmap(c.base, c.bytes);
}

uint64_t Balloon::bytes() const {
  uint64_t n = 0;
  for (const Chunk& c : chunks_) n += c.bytes;
  return n;
}

std::string Balloon::Grow(int node, uint64_t bytes) {
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return "cannot map " + std::to_string(bytes) + " bytes of balloon";
  chunks_.push_back({base, bytes});
  madvise(base, bytes, MADV_NOHUGEPAGE);
  unsigned long mask[16] = {};
  mask[node / 64] |= 1UL << (node % 64);
  if (mbind(base, bytes, MPOL_BIND, mask, 1024, 0) != 0) {
    return std::string("mbind of the balloon: ") + std::strerror(errno);
  }
  if (mlock(base, bytes) != 0) {
    return std::string("mlock of the balloon (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK): ") +
           std::strerror(errno);
  }
  return "";
}

uint64_t Balloon::OffNodeBytes(int node) const {
  if (pages_.empty()) return 0;
  std::fill(status_.begin(), status_.end(), -1);
  if (move_pages(0, pages_.size(), pages_.data(), nullptr, status_.data(), 0) != 0) return 0;
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t off_node = 0;
  for (int s : status_) off_node += s != node ? page : 0;
  return off_node;
}

void Balloon::Shrink(uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  while (bytes > 0 && !chunks_.empty()) {
    Chunk& c = chunks_.back();
    const uint64_t cut = std::min(c.bytes, bytes) / page * page;
    if (cut == 0) break;
    munmap(static_cast<char*>(c.base) + (c.bytes - cut), cut);
    c.bytes -= cut;
    bytes -= cut;
    if (c.bytes == 0) chunks_.pop_back();
  }
}

std::string Balloon::Inflate(int node, uint64_t free_bytes) {
  std::string err = Settle(node, free_bytes);
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  pages_.clear();
  for (const Chunk& c : chunks_) {
    for (uint64_t off = 0; off < c.bytes; off += page)
      pages_.push_back(static_cast<char*>(c.base) + off);
  }
  status_.assign(pages_.size(), -1);
  return err;
}

std::string Balloon::Settle(int node, uint64_t free_bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const int64_t kSlack = static_cast<int64_t>(Slack(free_bytes));
  int64_t off = 0;
  for (int round = 0; round < 150; ++round) {
    const ZoneMemory m = NodeUserZones(node);
    if (m.free == 0) return "cannot read node " + std::to_string(node) + "'s zones";
    off = static_cast<int64_t>(m.above_high) - static_cast<int64_t>(free_bytes);
    if (off > kSlack) {
      if (std::string err = Grow(node, static_cast<uint64_t>(off) / page * page); !err.empty()) {
        return err;
      }
    } else if (off < -kSlack && bytes() > 0) {
      Shrink(static_cast<uint64_t>(-off));
    } else if (off < -kSlack) {
      return "";  // less free than that already: the output's fast_above_high_at_start says so
    } else if (round > 0) {
      return "";  // within the slack, and it held for a round
    }
    usleep(100 * 1000);
  }
  return "node " + std::to_string(node) + "'s free memory did not settle within " +
         std::to_string(kSlack >> 10) + " KiB of " + std::to_string(free_bytes) +
         " bytes above its high watermark in 15 s (" + std::to_string(off) + " bytes off)";
}

}  // namespace cxltier::replay
