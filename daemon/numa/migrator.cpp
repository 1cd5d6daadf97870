#include "migrator.h"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

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
// it, and would be skipped (and look done). Fault the range in first.
void Populate(const PageRange& r) {
  if (madvise(reinterpret_cast<void*>(r.address), r.length, MADV_POPULATE_READ) == 0) return;
  const size_t ps = PageSize();
  for (uintptr_t a = r.address; a < r.address + r.length; a += ps) {
    (void)*reinterpret_cast<const volatile char*>(a);
  }
}

class LinuxMigrator final : public Migrator {
 public:
  MoveResult Move(const PageRange& range, int node) override {
    MoveResult r;
    std::vector<void*> pages = PagesOf(range);
    r.pages = pages.size();
    if (range.pid == 0 && range.shared) Populate(range);
    if (range.pid == 0 && range.shared) SetPolicy(range, node);
    std::vector<int> nodes(kChunkPages, node), status(kChunkPages);
    const int flags = range.shared ? MPOL_MF_MOVE_ALL : MPOL_MF_MOVE;
    for (size_t i = 0; i < pages.size(); i += kChunkPages) {
      const size_t n = std::min(kChunkPages, pages.size() - i);
      if (numa_move_pages(range.pid, n, pages.data() + i, nodes.data(), status.data(), flags) < 0) {
        r.call_errno = errno;
        return r;
      }
    }
    // Never trust the return code: ask where every page is now.
    for (int where : Where(range)) {
      if (where == node) {
        ++r.on_target;
      } else if (where == -ENOENT) {
        ++r.absent;
      } else if (where == -EBUSY) {
        ++r.busy;
      } else if (where < 0) {
        ++r.errors[-where];
      } else {
        ++r.elsewhere;  // the call said nothing useful about it; it simply did not move
      }
    }
    return r;
  }

  std::vector<int> Where(const PageRange& range) override {
    std::vector<void*> pages = PagesOf(range);
    std::vector<int> status(pages.size(), -1);
    for (size_t i = 0; i < pages.size(); i += kChunkPages) {
      const size_t n = std::min(kChunkPages, pages.size() - i);
      if (numa_move_pages(range.pid, n, pages.data() + i, nullptr, status.data() + i, 0) < 0) {
        const int e = errno;
        for (size_t j = i; j < i + n; ++j) status[j] = -e;
      }
    }
    return status;
  }

 private:
  static void SetPolicy(const PageRange& range, int node) {
    unsigned long mask[16] = {};  // 1024 nodes
    if (node < 0 || node >= 1024) return;
    mask[node / (8 * sizeof(unsigned long))] |= 1ul << (node % (8 * sizeof(unsigned long)));
    // Policy only (flags 0): the move itself is move_pages' job, and verified.
    mbind(reinterpret_cast<void*>(range.address), range.length, MPOL_PREFERRED, mask, 1024, 0);
  }
};

}  // namespace

std::unique_ptr<Migrator> MakeLinuxMigrator() { return std::make_unique<LinuxMigrator>(); }

std::string Summarize(const MoveResult& r) {
  std::ostringstream out;
  out << r.on_target << "/" << r.pages << " pages on target";
  if (r.absent) out << ", " << r.absent << " not present";
  if (r.busy) out << ", " << r.busy << " busy (pinned?)";
  if (r.elsewhere) out << ", " << r.elsewhere << " still on another node";
  for (auto [e, n] : r.errors) out << ", " << n << " " << std::strerror(e);
  if (r.call_errno) out << ", move_pages failed: " << std::strerror(r.call_errno);
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
