// Moving pages between NUMA nodes, and asking the kernel where they are.
// The only code in cxltier that calls move_pages(2) and mbind(2).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace cxltier::numa {

// A byte range of one process's address space.
struct PageRange {
  pid_t pid = 0;          // 0 = this process
  uintptr_t address = 0;  // page-aligned
  size_t length = 0;      // bytes, a multiple of the page size
  bool shared = false;    // mapped by more than one process (a memfd pool): needs MOVE_ALL
};

struct MoveResult {
  size_t pages = 0;
  size_t on_target = 0;          // verified with move_pages(nodes = NULL) after the move
  size_t absent = 0;             // never faulted in: nothing to move (-ENOENT)
  size_t busy = 0;               // pinned or under I/O (-EBUSY)
  size_t elsewhere = 0;          // present but still on another node
  std::map<int, size_t> errors;  // errno -> pages, for anything else
  int call_errno = 0;            // the move_pages call itself failed
  // Every present page is on the target node.
  bool done() const { return call_errno == 0 && on_target + absent == pages; }
};

class Migrator {
 public:
  virtual ~Migrator() = default;
  // Moves the range's pages to `node` and verifies where they ended up.
  virtual MoveResult Move(const PageRange& range, int node) = 0;
  // Node of every page (negative errno for pages that are not present).
  virtual std::vector<int> Where(const PageRange& range) = 0;
};

// The real one: move_pages(2) in chunks, then move_pages with no node list to
// verify. For this process's shared ranges it also sets the range's memory
// policy (mbind, MPOL_PREFERRED) so pages faulted later land on the same node.
std::unique_ptr<Migrator> MakeLinuxMigrator();

// Moves nothing: every move is reported done and every page on node 0,
// without a syscall. For benchmarks and fuzzing of the layers above, where
// the kernel's cost or answers are not what is measured.
class NullMigrator final : public Migrator {
 public:
  MoveResult Move(const PageRange& r, int) override {
    MoveResult res;
    res.pages = res.on_target = r.length / 4096;
    return res;
  }
  std::vector<int> Where(const PageRange& r) override {
    return std::vector<int>(r.length / 4096, 0);
  }
};

// "what cannot move and why", e.g. "3 pages busy (pinned), 1 page EACCES".
std::string Summarize(const MoveResult& r);

// True when this process may move pages of shared mappings (CAP_SYS_NICE).
bool HaveSysNice();

}  // namespace cxltier::numa
