#include "numa/tier_memory.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "cxltier/detail/errno_text.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace cxltier::numa {
namespace {

// What the client's pool or device is not (kBadPool); the memory a new tier
// pool cannot have (kLimit).
Status Refused(std::string why) { return Status::Fail(wire::ErrorCode::kBadPool, std::move(why)); }
Status NoRoom(std::string why) { return Status::Fail(wire::ErrorCode::kLimit, std::move(why)); }

std::string NodeList(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : ",") + std::to_string(n);
  return s;
}

// Free pages plus inactive file pages (clean cache the kernel reclaims
// first), from the node's meminfo; 0 if it cannot be read.
uint64_t NodeAvailable(int node) {
  std::ifstream in("/sys/devices/system/node/node" + std::to_string(node) + "/meminfo");
  std::string line;
  uint64_t kib = 0;
  while (std::getline(in, line)) {
    const bool free = line.find(" MemFree:") != std::string::npos;
    const bool cache = line.find(" Inactive(file):") != std::string::npos;
    if (!free && !cache) continue;
    const size_t colon = line.find(':');
    try {
      kib += std::stoull(line.substr(colon + 1));
    } catch (...) {
    }
  }
  return kib << 10;
}

// Whether every page of `m` (all faulted in) is on one of `nodes`; the
// refusal says where the others are.
Status AllOnNodes(const Mapping& m, const std::vector<int>& nodes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t pages = m.length_bytes() / page;
  std::vector<void*> addr(pages);
  for (uint64_t i = 0; i < pages; ++i) addr[i] = m.bytes() + i * page;
  std::vector<int> status(pages, -1);
  constexpr uint64_t kChunk = 8192;
  for (uint64_t i = 0; i < pages; i += kChunk) {
    const unsigned long n = static_cast<unsigned long>(std::min(kChunk, pages - i));
    if (numa_move_pages(0, n, addr.data() + i, nullptr, status.data() + i, 0) < 0) {
      return Refused(detail::ErrnoText("move_pages (asking where the pool's pages are)"));
    }
  }
  std::map<int, uint64_t> off_nodes;
  for (int s : status) {
    if (std::find(nodes.begin(), nodes.end(), s) == nodes.end()) ++off_nodes[s];
  }
  if (off_nodes.empty()) return Status::Ok();
  std::string where;
  for (auto [n, c] : off_nodes) {
    where += (where.empty() ? "" : ", ") + std::to_string(c) +
             (n >= 0 ? " on node " + std::to_string(n) : " not present");
  }
  return Refused("the pool's pages are not all on node(s) " + NodeList(nodes) + ": " + where);
}

}  // namespace

Result<TierMemory> CreateTierMemory(const std::vector<int>& nodes, uint64_t bytes,
                                    const std::string& name) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (nodes.empty() || bytes == 0 || bytes % page != 0) {
    return NoRoom("a tier pool needs nodes and a whole number of pages");
  }
  // MPOL_BIND with too little memory would have the kernel swap or OOM-kill
  // to make room: refuse first, saying how much there is.
  uint64_t available = 0;
  for (int n : nodes) {
    if (numa_node_size64(n, nullptr) <= 0) {
      return NoRoom("node " + std::to_string(n) + " has no memory");
    }
    available += NodeAvailable(n);
  }
  if (available < bytes) {
    return NoRoom("node(s) " + NodeList(nodes) + " have " + std::to_string(available >> 20) +
                  " MiB free or reclaimable; the pool needs " + std::to_string(bytes >> 20) +
                  " MiB");
  }
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    return NoRoom(detail::ErrnoText("memfd_create"));
  }
  auto fail = [&](std::string why) {
    close(fd);
    return NoRoom(std::move(why));
  };
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) return fail(detail::ErrnoText("ftruncate"));
  Result<std::shared_ptr<const Mapping>> mapped = Mapping::MapWritable(fd, bytes, 0);
  if (!mapped.ok()) return fail(mapped.status().message);
  std::shared_ptr<const Mapping> m = std::move(*mapped);
  unsigned long mask[16] = {};  // 1024 nodes
  for (int n : nodes) {
    if (n < 0 || n >= 1024) return fail("node " + std::to_string(n) + " out of range");
    mask[n / (8 * sizeof(unsigned long))] |= 1ul << (n % (8 * sizeof(unsigned long)));
  }
  // On a shmem file the policy is the file's (shared policy): the client's
  // mapping faults by it too.
  if (mbind(m->bytes(), bytes, MPOL_BIND, mask, 1024, 0) != 0)
    return fail(detail::ErrnoText("mbind"));
  if (madvise(m->bytes(), bytes, MADV_POPULATE_WRITE) != 0) {
    return fail(detail::ErrnoText("faulting the pool in on node(s) " + NodeList(nodes)));
  }
  // Ask where every page is: the policy is a request, the kernel's answer is the fact.
  if (Status st = AllOnNodes(*m, nodes); !st.ok()) return fail(st.message);
  // The client may map, write and pin it, never resize it under our mapping.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return fail(detail::ErrnoText("sealing the pool"));
  }
  TierMemory out;
  out.fd = fd;
  out.mapping = std::move(m);
  out.nodes = nodes;
  return out;
}

Result<TierMemory> AdoptTierMemory(int fd, const std::vector<int>& nodes, uint64_t bytes,
                                   const std::string& name) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  if (nodes.empty() || bytes == 0 || bytes % page != 0) {
    return Refused("a tier pool needs nodes and a whole number of pages");
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return Refused(detail::ErrnoText("fstat"));
  }
  // Shmem, as the daemon's own memfds are: not hugetlbfs (MFD_HUGETLB), where
  // lseek shows no hole, the client can punch pages out under these seals,
  // and a fault past the free huge pages is a SIGBUS in this daemon's copy.
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return Refused(detail::ErrnoText("fstatfs"));
  if (fs.f_type != TMPFS_MAGIC) {
    return Refused("not a tmpfs memfd: a tier pool is a plain memfd (no MFD_HUGETLB)");
  }
  // The name memfd_create gave it: anyone can choose it, so it only tells a
  // mistake (another tier's pool, a page-mode memfd) from the right file.
  char link[64];
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t n = readlink(self.c_str(), link, sizeof(link) - 1);
  const std::string got = n > 0 ? std::string(link, static_cast<size_t>(n)) : "";
  const std::string want = "/memfd:" + name + " (deleted)";
  if (!S_ISREG(st.st_mode) || got != want) {
    return Refused("not the memfd a daemon makes for this tier ('" + want + "'; this is '" + got +
                   "')");
  }
  // The seals CreateTierMemory adds: no size change, ever (so our mapping can
  // never lose a page), and no seal removed.
  constexpr int kSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSeals) != kSeals) {
    return Refused("the memfd is not sealed as a daemon seals a tier pool (shrink, grow and seal)");
  }
  if (static_cast<uint64_t>(st.st_size) != bytes) {
    return Refused("the memfd holds " + std::to_string(st.st_size) + " bytes, not the pool's " +
                   std::to_string(bytes));
  }
  // Every page exists (a daemon made them all): faulting in a hole would
  // make this daemon allocate memory the client chose not to have.
  const off_t hole = lseek(fd, 0, SEEK_HOLE);
  if (hole < 0 || static_cast<uint64_t>(hole) != bytes) {
    return Refused(hole < 0 ? detail::ErrnoText("lseek(SEEK_HOLE)")
                            : "the memfd has a hole at byte " + std::to_string(hole) +
                                  ": a tier pool a daemon made has every page");
  }
  Result<std::shared_ptr<const Mapping>> mapped = Mapping::MapWritable(fd, bytes, 0);
  if (!mapped.ok()) return Refused(mapped.status().message);
  std::shared_ptr<const Mapping> m = std::move(*mapped);
  // Maps the pages that exist, allocating none (there is no hole), so that
  // the kernel can say where each one is.
  if (madvise(m->bytes(), bytes, MADV_POPULATE_READ) != 0) {
    return Refused(detail::ErrnoText("mapping the pool's pages"));
  }
  if (Status placed = AllOnNodes(*m, nodes); !placed.ok()) return placed;
  TierMemory out;
  out.fd = fd;
  out.mapping = std::move(m);
  out.nodes = nodes;
  return out;
}

namespace {

bool ReadSysValue(const std::string& path, uint64_t* value) {
  std::ifstream in(path);
  if (!in) return false;
  std::string text;
  in >> text;
  try {
    *value = std::stoull(text, nullptr, 0);
  } catch (...) {
    return false;
  }
  return true;
}

}  // namespace

Result<DevdaxInfo> InspectDevdax(int fd, const std::string& sys_root) {
  DevdaxInfo info;
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    return Refused(detail::ErrnoText("fstat"));
  }
  if (!S_ISCHR(st.st_mode)) {
    return Refused("not a device-DAX device: not a character device");
  }
  const std::string dev = sys_root + "/sys/dev/char/" + std::to_string(major(st.st_rdev)) + ":" +
                          std::to_string(minor(st.st_rdev));
  std::error_code ec;
  const std::filesystem::path subsystem = std::filesystem::read_symlink(dev + "/subsystem", ec);
  const std::string kind = ec ? "unknown" : subsystem.filename().string();
  if (kind != "dax") {
    return Refused("not a device-DAX device: character device " +
                   std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev)) +
                   " belongs to '" + kind + "'");
  }
  if (!ReadSysValue(dev + "/size", &info.size) || info.size == 0) {
    return Refused("device-DAX device without a size in " + dev);
  }
  if (!ReadSysValue(dev + "/align", &info.align) || info.align == 0) info.align = 2u << 20;
  uint64_t node = 0;
  if (ReadSysValue(dev + "/target_node", &node) || ReadSysValue(dev + "/numa_node", &node)) {
    info.node = static_cast<int>(node);
  }
  return info;
}

Result<TierMemory> MapDevdax(int fd, uint64_t offset, uint64_t bytes) {
  Result<std::shared_ptr<const Mapping>> m = Mapping::MapWritable(fd, bytes, offset);
  if (!m.ok()) return Refused("mapping the device-DAX device: " + m.status().message);
  TierMemory out;
  out.fd = fd;
  out.mapping = std::move(*m);
  return out;
}

}  // namespace cxltier::numa
