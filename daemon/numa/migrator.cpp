#include "numa/migrator.h"

#include <fcntl.h>
#include <numa.h>
#include <numaif.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

namespace cxltier::numa {
namespace {

constexpr size_t kChunkPages = 8192;

size_t PageSize() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

std::vector<void*> PagesOf(const PageRange& r) {
  std::vector<void*> pages;
  const size_t ps = PageSize();
  pages.reserve(r.length / ps);
  for (uintptr_t a = r.address; a < r.address + r.length; a += ps) {
    pages.push_back(reinterpret_cast<void*>(a));
  }
  return pages;
}

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

// move_pages works on this process's page tables: a page of a shared mapping
// that we never touched is "not present" here even though the client wrote
// it, and would be skipped (and look done). Fault the range in first, with
// the one call that cannot fault on us: where the client's file has no page
// (shrunk, or a file that cannot back the range) it fails with EFAULT
// instead of raising SIGBUS. Nothing here may ever read a byte of the range.
//
// Only the pages the file has: a read fault on a hole of a shmem file
// allocates a page, so populating a sparse pool would make the daemon pay
// for the client's holes (a sealed, never written 1 GiB pool cost 1 GiB of
// shmem, charged to no uid). mincore on a shared file mapping tells which
// pages the file has (in its page cache), mapped here or not; only those runs
// are faulted in. A hole stays a hole: move_pages finds no page there, and
// the move counts it absent. Returns 0 or its errno.
int Populate(const PageRange& r) {
  const size_t ps = PageSize();
  const size_t pages = r.length / ps;
  std::vector<unsigned char> in_file(pages);
  if (mincore(reinterpret_cast<void*>(r.address), r.length, in_file.data()) != 0) return errno;
  for (size_t i = 0; i < pages;) {
    if (!(in_file[i] & 1)) {
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < pages && (in_file[end] & 1)) ++end;
    if (madvise(reinterpret_cast<void*>(r.address + i * ps), (end - i) * ps, MADV_POPULATE_READ) !=
        0) {
      return errno;
    }
    i = end;
  }
  return 0;
}

MoveResult Failed(MoveResult r, int e, const char* call) {
  r.call_errno = e;
  r.call = call;
  return r;
}

// The four uids (real, effective, saved, filesystem) of /proc/<pid>/status.
// 0 or an errno (ENOENT when the process is gone or hidden from us).
int ReadUids(pid_t pid, std::array<uid_t, 4>* uids) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/status", static_cast<int>(pid));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  char buf[4096];
  size_t len = 0;
  for (;;) {
    const ssize_t n = read(fd, buf + len, sizeof buf - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += static_cast<size_t>(n);
    if (len == sizeof buf - 1) break;  // Uid: is near the top, well inside 4 KiB
  }
  close(fd);
  buf[len] = '\0';
  const char* line = std::strstr(buf, "\nUid:");
  if (!line) return EIO;
  unsigned long v[4];
  if (std::sscanf(line + 5, "%lu %lu %lu %lu", &v[0], &v[1], &v[2], &v[3]) != 4) return EIO;
  for (int i = 0; i < 4; ++i) (*uids)[i] = static_cast<uid_t>(v[i]);
  return 0;
}

}  // namespace

Result<std::shared_ptr<const ProcessHandle>> ProcessHandle::Open(pid_t pid, uid_t uid) {
  const auto refused = [](std::string why) {
    return Status::Fail(wire::ErrorCode::kBadPool, std::move(why));
  };
  const std::string exited =
      "the process that connected (pid " + std::to_string(pid) + ") has exited";
  if (pid <= 0) {
    return refused("peer pid unknown (SO_PEERCRED)");
  }
  const int fd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    return refused(errno == ESRCH ? exited : std::string("pidfd_open: ") + std::strerror(errno));
  }
  std::shared_ptr<const ProcessHandle> h(new ProcessHandle(fd, pid, uid));
  // The pidfd names one process from here on; /proc/<pid> names whoever has
  // the pid. If the pidfd's process is still running after the read, they
  // were the same one.
  std::array<uid_t, 4> uids{};
  const int e = ReadUids(pid, &uids);
  if (!h->Alive()) {
    return refused(exited);
  }
  if (e != 0) {
    return refused("cannot read /proc/" + std::to_string(pid) + "/status (" + std::strerror(e) +
                   "): an address-range pool of another user's process needs CAP_SYS_PTRACE");
  }
  for (uid_t u : uids) {
    if (u != uid) {
      return refused(exited + " or no longer runs as uid " + std::to_string(uid) +
                     " (its uids are " + std::to_string(uids[0]) + "/" + std::to_string(uids[1]) +
                     "/" + std::to_string(uids[2]) + "/" + std::to_string(uids[3]) + ")");
    }
  }
  return h;
}

ProcessHandle::~ProcessHandle() { close(pidfd_); }

bool ProcessHandle::Alive() const {
  pollfd p{pidfd_, POLLIN, 0};
  int n;
  do {
    n = poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  // POLLIN: the process has exited. An error says nothing good either.
  return n == 0;
}

int ProcessHandle::Check() const {
  if (!Alive()) return ESRCH;
  std::array<uid_t, 4> uids{};
  const int e = ReadUids(pid_, &uids);
  if (!Alive()) return ESRCH;
  if (e != 0) return e;
  for (uid_t u : uids) {
    if (u != uid_) return EPERM;
  }
  return 0;
}

Result<std::shared_ptr<const Mapping>> Mapping::Map(int fd, size_t length_bytes) {
  void* p = mmap(nullptr, length_bytes, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    return Status::Fail(wire::ErrorCode::kBadPool,
                        std::string("mmap of the pool: ") + std::strerror(errno));
  }
  return std::shared_ptr<const Mapping>(new Mapping(reinterpret_cast<uintptr_t>(p), length_bytes));
}

Result<std::shared_ptr<const Mapping>> Mapping::MapWritable(int fd, size_t length_bytes,
                                                            uint64_t offset) {
  void* p = mmap(nullptr, length_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                 static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    return Status::Fail(wire::ErrorCode::kInternal, std::string("mmap: ") + std::strerror(errno));
  }
  return std::shared_ptr<const Mapping>(new Mapping(reinterpret_cast<uintptr_t>(p), length_bytes));
}

Mapping::~Mapping() { munmap(reinterpret_cast<void*>(address_), length_bytes_); }

#ifndef MPOL_PREFERRED_MANY
#define MPOL_PREFERRED_MANY 5
#endif

namespace {

// PreferNodes over any range of this process's address space.
Status PreferNodesAt(uintptr_t address, size_t length, const std::vector<int>& nodes) {
  constexpr int kMaxNode = 1024;
  constexpr size_t kBits = 8 * sizeof(unsigned long);
  unsigned long mask[kMaxNode / kBits] = {};
  if (nodes.empty()) return Status::Fail(wire::ErrorCode::kInternal, "mbind: no node to prefer");
  for (int n : nodes) {
    if (n < 0 || n >= kMaxNode) {
      return Status::Fail(wire::ErrorCode::kInternal,
                          "mbind: node " + std::to_string(n) + " is out of range");
    }
    mask[n / kBits] |= 1ul << (n % kBits);
  }
  void* at = reinterpret_cast<void*>(address);
  // Policy only (flags 0): the pages the range has stay where they are.
  int mode = nodes.size() > 1 ? MPOL_PREFERRED_MANY : MPOL_PREFERRED;
  int rc = mbind(at, length, mode, mask, kMaxNode, 0);
  if (rc != 0 && errno == EINVAL && mode == MPOL_PREFERRED_MANY) {
    // A kernel before 5.15: the first node alone.
    unsigned long first[kMaxNode / kBits] = {};
    first[nodes.front() / kBits] = 1ul << (nodes.front() % kBits);
    mode = MPOL_PREFERRED;
    rc = mbind(at, length, mode, first, kMaxNode, 0);
  }
  if (rc != 0) {
    const int e = errno;
    return Status::Fail(wire::ErrorCode::kInternal,
                        std::string("mbind(") +
                            (mode == MPOL_PREFERRED ? "MPOL_PREFERRED" : "MPOL_PREFERRED_MANY") +
                            "): " + std::strerror(e));
  }
  return Status::Ok();
}

}  // namespace

Status PreferNodes(const Mapping& mapping, const std::vector<int>& nodes) {
  return PreferNodesAt(mapping.address(), mapping.length_bytes(), nodes);
}

Status Migrator::Steer(const PageRange&, const std::vector<int>&) { return Status::Ok(); }

std::vector<size_t> SpreadPages(size_t pages, size_t samples) {
  std::vector<size_t> at;
  if (pages == 0 || samples == 0) return at;
  if (samples >= pages || samples == 1) {
    const size_t n = samples >= pages ? pages : 1;
    for (size_t i = 0; i < n; ++i) at.push_back(i);
    return at;
  }
  for (size_t k = 0; k < samples; ++k) at.push_back(k * (pages - 1) / (samples - 1));
  return at;
}

std::vector<int> Migrator::Sample(const PageRange& range, size_t samples) {
  const std::vector<int> all = Where(range);
  std::vector<int> some;
  for (size_t i : SpreadPages(all.size(), samples)) some.push_back(all[i]);
  return some;
}

namespace {

class LinuxMigrator final : public Migrator {
 public:
  MoveResult Move(const PageRange& range, int node) override {
    MoveResult r;
    r.pages = range.length / PageSize();
    if (range.process) {
      if (const int e = range.process->Check(); e != 0) return Failed(std::move(r), e, "process");
    }
    if (range.pid == 0 && range.shared) {
      if (const int e = Populate(range); e != 0) return Failed(std::move(r), e, "populate");
      SetPolicy(range, node);
    }
    std::vector<void*> pages = PagesOf(range);
    std::vector<int> nodes(kChunkPages, node), status(pages.size(), 0);
    std::vector<uint8_t> refused(pages.size(), 0);
    const int flags = range.shared ? MPOL_MF_MOVE_ALL : MPOL_MF_MOVE;
    for (size_t i = 0; i < pages.size(); i += kChunkPages) {
      const size_t n = std::min(kChunkPages, pages.size() - i);
      const long rc =
          numa_move_pages(range.pid, n, pages.data() + i, nodes.data(), status.data() + i, flags);
      // A positive count: pages the kernel could not migrate (pinned pages
      // end here; their status still names the target node).
      if (rc > 0) {
        for (size_t j = i; j < i + n; ++j) refused[j] = 1;
      }
      if (rc < 0) {
        r.call_errno = errno;
        return r;
      }
      // Died meanwhile: the pid may name someone else's process by now. Say
      // so, and do not ask it anything more.
      if (range.process && !range.process->Alive()) return Failed(std::move(r), ESRCH, "process");
    }
    // Never trust the return code: ask where every page is now. The move's
    // own answer only says why a page that is not there stayed: a page the
    // call could not migrate (EBUSY, or counted in its positive return) is busy.
    const std::vector<int> now = Ask(range, false);  // populated above
    for (size_t i = 0; i < now.size(); ++i) {
      const int where = now[i];
      if (where == node) {
        ++r.verified;
      } else if (where == -ENOENT) {
        ++r.absent;
      } else if (where == -EBUSY || (where >= 0 && (status[i] == -EBUSY || refused[i]))) {
        ++r.busy;
      } else if (where < 0) {
        ++r.errors[-where];
      } else {
        ++r.elsewhere;  // the call said nothing useful about it; it simply did not move
      }
    }
    return r;
  }

  // A memfd pool's pages that the client wrote are not in our page tables
  // until we fault them in: without that they would all read "not present"
  // (a failure, a shrunk file, leaves those pages so).
  std::vector<int> Where(const PageRange& range) override {
    return Ask(range, range.pid == 0 && range.shared);
  }

  // As Where(), page by sampled page, in one move_pages call. For a memfd
  // pool, the sampled pages it finds absent here (the daemon never touched
  // them: a block's first admission) and that the file has (mincore: a hole
  // stays a hole) are faulted in alone and asked again; a block admitted
  // before costs the one call. System calls cost 1.5 to 7 us each on our VM
  // (docs/performance.md, figure 5).
  std::vector<int> Sample(const PageRange& range, size_t samples) override {
    const size_t ps = PageSize();
    const std::vector<size_t> at = SpreadPages(range.length / ps, samples);
    if (range.process && !range.process->Alive()) return std::vector<int>(at.size(), -ESRCH);
    std::vector<void*> pages;
    pages.reserve(at.size());
    for (size_t i : at) pages.push_back(reinterpret_cast<void*>(range.address + i * ps));
    std::vector<int> status(pages.size(), -1);
    const auto ask = [&](std::vector<void*>& which, std::vector<int>& out) {
      if (!which.empty() &&
          numa_move_pages(range.pid, which.size(), which.data(), nullptr, out.data(), 0) < 0) {
        const int e = errno;
        for (int& s : out) s = -e;
      }
    };
    ask(pages, status);
    if (range.pid == 0 && range.shared) {
      std::vector<void*> faulted;
      std::vector<size_t> index;
      for (size_t k = 0; k < pages.size(); ++k) {
        unsigned char in_file = 0;
        if (status[k] != -ENOENT || mincore(pages[k], ps, &in_file) != 0 || !(in_file & 1)) {
          continue;
        }
        if (madvise(pages[k], ps, MADV_POPULATE_READ) == 0) {
          faulted.push_back(pages[k]);
          index.push_back(k);
        }
      }
      std::vector<int> again(faulted.size(), -1);
      ask(faulted, again);
      for (size_t k = 0; k < faulted.size(); ++k) status[index[k]] = again[k];
    }
    if (range.process && !range.process->Alive()) return std::vector<int>(at.size(), -ESRCH);
    return status;
  }

 private:
  // Node of every page, faulting a memfd range in first when `populate`
  // (Move has already done so before it asks).
  static std::vector<int> Ask(const PageRange& range, bool populate) {
    std::vector<void*> pages = PagesOf(range);
    // Alive() only, not Check(): a poll costs well under a microsecond.
    if (range.process && !range.process->Alive()) return std::vector<int>(pages.size(), -ESRCH);
    if (populate) (void)Populate(range);
    std::vector<int> status(pages.size(), -1);
    for (size_t i = 0; i < pages.size(); i += kChunkPages) {
      const size_t n = std::min(kChunkPages, pages.size() - i);
      if (numa_move_pages(range.pid, n, pages.data() + i, nullptr, status.data() + i, 0) < 0) {
        const int e = errno;
        for (size_t j = i; j < i + n; ++j) status[j] = -e;
      }
    }
    if (range.process && !range.process->Alive()) return std::vector<int>(pages.size(), -ESRCH);
    return status;
  }

  Status Steer(const PageRange& range, const std::vector<int>& nodes) override {
    if (range.pid != 0 || !range.shared) return Status::Ok();
    return PreferNodesAt(range.address, range.length, nodes);
  }

  // Policy only: the move itself is move_pages' job, and verified.
  static void SetPolicy(const PageRange& range, int node) {
    (void)PreferNodesAt(range.address, range.length, {node});
  }
};

}  // namespace

std::unique_ptr<Migrator> MakeLinuxMigrator() { return std::make_unique<LinuxMigrator>(); }

std::string Summarize(const MoveResult& r) {
  std::ostringstream out;
  out << r.verified << "/" << r.pages << " pages on target";
  if (r.absent) out << ", " << r.absent << " not present";
  if (r.busy) out << ", " << r.busy << " busy (pinned?)";
  if (r.elsewhere) out << ", " << r.elsewhere << " still on another node";
  for (auto [e, n] : r.errors) out << ", " << n << " " << std::strerror(e);
  if (r.call_errno) {
    const std::string call = r.call ? r.call : "move_pages";
    if (call == "copy") {
      out << ", copy not done: "
          << (r.call_errno == EBUSY    ? "the client holds the block's write lease"
              : r.call_errno == EIO    ? "the copy differs from the source"
              : r.call_errno == ENOSPC ? "no free block in the target tier's pool"
                                       : std::strerror(r.call_errno));
      return out.str();
    }
    if (call == "populate") {
      out << ", faulting the pool in failed (its file shrank or has no page there?): ";
    } else if (call == "process") {
      out << ", the pool's process "
          << (r.call_errno == ESRCH ? "has exited" : "cannot be moved (uid changed?)") << ": ";
    } else {
      out << ", " << call << " failed: ";
    }
    out << std::strerror(r.call_errno);
  }
  return out.str();
}

bool HaveSysNice() {
  // CapEff in /proc/self/status; CAP_SYS_NICE is bit 23.
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) != 0) continue;
    try {
      return (std::stoull(line.substr(7), nullptr, 16) >> 23) & 1;
    } catch (...) {
      return false;
    }
  }
  return false;
}

}  // namespace cxltier::numa
