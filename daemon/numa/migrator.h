// Moving pages between NUMA nodes, and asking the kernel where they are.
// The only code in cxltier that calls move_pages(2) and mbind(2).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "cxltier/status.h"

namespace cxltier::numa {

// Another process, pinned by a pidfd. A pid alone names whichever process
// holds that number now: once the one that registered a pool exits, the
// number may be reused by anyone's process. The pidfd keeps naming the
// original, so every use of pid() is bracketed by Check() calls: if the
// process is still running afterwards, the pid meant that process.
// Thread-safe (const); shared by the pool and every move queued for it.
class ProcessHandle {
 public:
  // Opens a pidfd for `pid` and checks that the process runs as `uid` (real,
  // effective, saved and filesystem uid, from /proc/<pid>/status, read after
  // the pidfd was opened and confirmed by the pidfd afterwards). kBadPool
  // when it has exited, runs as someone else, or cannot be inspected.
  static Result<std::shared_ptr<const ProcessHandle>> Open(pid_t pid, uid_t uid);
  ~ProcessHandle();
  ProcessHandle(const ProcessHandle&) = delete;
  ProcessHandle& operator=(const ProcessHandle&) = delete;

  pid_t pid() const { return pid_; }
  // False once the process has exited (the pidfd polls readable). One poll(2).
  bool Alive() const;
  // 0 while the process runs with the uid it had at Open; ESRCH once it has
  // exited; EPERM when its uids changed (it ran a set-uid program).
  int Check() const;

 private:
  ProcessHandle(int pidfd, pid_t pid, uid_t uid) : pidfd_(pidfd), pid_(pid), uid_(uid) {}
  int pidfd_;
  pid_t pid_;
  uid_t uid_;
};

// This process's shared mapping of a file (a client's memfd pool, a copy-mode
// tier pool, a state segment), unmapped when the last holder lets go: the
// pool, or a move queued or running for it. So a move never runs on
// addresses that were unmapped and perhaps reused for another client's pool.
// The fd is not kept: the mapping holds the file.
class Mapping {
 public:
  // Read-only (a page-mode pool: the daemon never reads nor writes its bytes).
  // kBadPool when mmap fails.
  static Result<std::shared_ptr<const Mapping>> Map(int fd, size_t length_bytes);
  // Read-write from `offset` (copy mode: the daemon copies blocks).
  // kInternal when mmap fails.
  static Result<std::shared_ptr<const Mapping>> MapWritable(int fd, size_t length_bytes,
                                                            uint64_t offset);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uintptr_t address() const { return address_; }
  // REQUIRES: a writable mapping.
  uint8_t* bytes() const { return reinterpret_cast<uint8_t*>(address_); }
  size_t length_bytes() const { return length_bytes_; }

 private:
  Mapping(uintptr_t address, size_t length_bytes)
      : address_(address), length_bytes_(length_bytes) {}
  uintptr_t address_;
  size_t length_bytes_;
};

// Sets the shared memory policy of the file that `mapping` maps, over the
// whole mapping: mbind on a MAP_SHARED mapping of a shmem file (a memfd) sets
// the file's own policy, which every process's page faults in that range
// follow (its other mappings too). Pages the file has already stay where they
// are; pages faulted in later prefer `nodes`: MPOL_PREFERRED for one node,
// MPOL_PREFERRED_MANY for several (MPOL_PREFERRED on the first where the
// kernel has no MPOL_PREFERRED_MANY, before 5.15). Never MPOL_BIND: a full
// node falls back to another instead of reclaiming or OOM-killing. kInternal
// saying why when mbind fails (a hugetlbfs memfd may refuse) or `nodes` is
// empty or names a node past 1023.
Status PreferNodes(const Mapping& mapping, const std::vector<int>& nodes);

// A byte range of one process's address space.
struct PageRange {
  PageRange() = default;
  // Spelled out so that {pid, address, length, shared} still reads as before.
  PageRange(pid_t pid_, uintptr_t address_, size_t length_, bool shared_,
            std::shared_ptr<const ProcessHandle> process_ = nullptr,
            std::shared_ptr<const Mapping> mapping_ = nullptr)
      : pid(pid_),
        address(address_),
        length(length_),
        shared(shared_),
        process(std::move(process_)),
        mapping(std::move(mapping_)) {}

  pid_t pid = 0;          // 0 = this process
  uintptr_t address = 0;  // page-aligned
  size_t length = 0;      // bytes, a multiple of the page size
  bool shared = false;    // mapped by more than one process (a memfd pool): needs MOVE_ALL
  // What keeps the addresses meaning what they meant when the range was made.
  // Another process's range: its pidfd (a range without one trusts `pid` as is).
  std::shared_ptr<const ProcessHandle> process;
  // This process's mapping of a memfd pool (kept mapped while a move holds it).
  std::shared_ptr<const Mapping> mapping;
};

struct MoveResult {
  size_t pages = 0;
  size_t verified = 0;           // verified with move_pages(nodes = NULL) after the move
  size_t absent = 0;             // never faulted in: nothing to move (-ENOENT)
  size_t busy = 0;               // pinned or under I/O (-EBUSY)
  size_t elsewhere = 0;          // present but still on another node
  std::map<int, size_t> errors;  // errno -> pages, for anything else
  // The move failed as a whole, in `call`: "move_pages" (the default),
  // "populate" (faulting a memfd pool in: the file shrank or cannot be read
  // without a fault), or "process" (the pool's process exited or changed uid,
  // before the call or during it).
  int call_errno = 0;
  const char* call = "move_pages";
  // Every present page is on the target node.
  bool done() const { return call_errno == 0 && verified + absent == pages; }
};

class Migrator {
 public:
  virtual ~Migrator() = default;
  // Moves the range's pages to `node` and verifies where they ended up.
  virtual MoveResult Move(const PageRange& range, int node) = 0;
  // Node of every page (negative errno for pages that are not present; every
  // page -ESRCH when the range's process has exited). For this process's
  // shared ranges (a memfd pool) the pages the file has are faulted into our
  // mapping first, as Move does: a page only the client has touched is
  // present in the file, not here. The daemon asks Where()
  // on its I/O thread while Move() may run on the mover's: an implementation
  // must allow both at once.
  virtual std::vector<int> Where(const PageRange& range) = 0;
  // Where() of at most `samples` pages spread evenly over the range, the
  // first and the last among them (every page when it has no more): what the
  // daemon asks at admission, on its I/O thread, where Where() of a whole
  // 2 MiB block would fault in and query 512 pages. The default thins
  // Where(); the real one touches only the sampled pages.
  virtual std::vector<int> Sample(const PageRange& range, size_t samples);
  // Where the range's pages that do not exist yet will be faulted: a memory
  // policy preferring `nodes` (PreferNodes), on this process's shared ranges
  // only (a memfd pool, through our mapping: the file's shared policy, which
  // the client's faults follow too). Another process's range is left alone
  // (its client library sets that policy). The default does nothing.
  virtual Status Steer(const PageRange& range, const std::vector<int>& nodes);
};

// The indexes of `samples` pages spread evenly over `pages` (all of them when
// samples >= pages; none when either is 0), ascending, first and last included.
std::vector<size_t> SpreadPages(size_t pages, size_t samples);

// The real one: move_pages(2) in chunks, then move_pages with no node list to
// verify. For this process's shared ranges it first faults the range into
// this process's page tables (MADV_POPULATE_READ, which fails instead of
// raising SIGBUS where the file has no page; it never reads a byte), only
// the pages the file has (mincore): holes stay holes, counted absent, so a
// sparse pool costs the daemon no memory; and it sets
// the range's memory policy (mbind, MPOL_PREFERRED) so pages faulted later
// land on the same node. A range with a ProcessHandle is checked before and
// after the calls: a process that exited fails the move with ESRCH, and no
// move_pages call names its pid once it is known to be gone.
std::unique_ptr<Migrator> MakeLinuxMigrator();

// "what cannot move and why", e.g. "3 pages busy (pinned), 1 page EACCES".
std::string Summarize(const MoveResult& r);

// True when this process may move pages of shared mappings (CAP_SYS_NICE).
bool HaveSysNice();

}  // namespace cxltier::numa
