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

int64_t NodeFreeBytes(int node) {
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long kib = 0;
    int n = 0;
    if (std::sscanf(line.c_str(), "Node %d MemFree: %llu kB", &n, &kib) == 2) {
      return static_cast<int64_t>(kib) * 1024;
    }
  }
  return -1;
}

uint64_t NodeHighWatermarkBytes(int node) {
  std::ifstream in("/proc/zoneinfo");
  std::string line;
  bool ours = false;
  uint64_t pages = 0;
  while (std::getline(in, line)) {
    int n = -1;
    char zone[32];
    if (std::sscanf(line.c_str(), "Node %d, zone %31s", &n, zone) == 2) {
      ours = n == node;
      continue;
    }
    unsigned long long v = 0;
    if (ours && std::sscanf(line.c_str(), " high %llu", &v) == 1) pages += v;
  }
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
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

Residency::Count Residency::Query(const void* base, uint64_t bytes, const std::vector<int>& fast) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const size_t n = (bytes + page - 1) / page;
  pages_.resize(n);
  status_.assign(n, -1);
  for (size_t i = 0; i < n; ++i)
    pages_[i] = const_cast<char*>(static_cast<const char*>(base)) + i * page;
  Count c;
  if (numa_move_pages(0, n, pages_.data(), nullptr, status_.data(), 0) < 0) {
    status_.assign(n, -errno);
  }
  for (size_t i = 0; i < n; ++i) {
    int node = status_[i];
    if (node < 0) {
      node = NodeOfPage(reinterpret_cast<uintptr_t>(pages_[i]));
      c.via_pagemap += node >= 0;
    }
    if (node < 0) {
      ++c.unknown;
    } else if (std::find(fast.begin(), fast.end(), node) != fast.end()) {
      ++c.fast;
    } else {
      ++c.other;
    }
  }
  return c;
}

Balloon::~Balloon() {
  if (base_) munmap(base_, bytes_);
}

std::string Balloon::Inflate(int node, uint64_t free_bytes) {
  const int64_t free_now = NodeFreeBytes(node);
  if (free_now < 0) return "cannot read node " + std::to_string(node) + "'s free memory";
  const uint64_t keep = free_bytes + NodeHighWatermarkBytes(node);
  if (static_cast<uint64_t>(free_now) <= keep) return "";  // already no more free than that
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  bytes_ = (static_cast<uint64_t>(free_now) - keep) / page * page;
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    return "cannot map a balloon of " + std::to_string(bytes_) + " bytes";
  }
  madvise(base_, bytes_, MADV_NOHUGEPAGE);
  unsigned long mask[16] = {};
  mask[node / 64] |= 1UL << (node % 64);
  if (mbind(base_, bytes_, MPOL_BIND, mask, 1024, 0) != 0) {
    return std::string("mbind of the balloon: ") + std::strerror(errno);
  }
  if (mlock(base_, bytes_) != 0) {
    return std::string("mlock of the balloon (needs CAP_IPC_LOCK or RLIMIT_MEMLOCK): ") +
           std::strerror(errno);
  }
  return "";
}

}  // namespace cxltier::replay
