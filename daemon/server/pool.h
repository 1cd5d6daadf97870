// A client's KV pool: where each of its blocks' bytes live, as page ranges the
// migrator can move. Validates what the client claims (untrusted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cxltier/wire.h"
#include "numa/migrator.h"
#include "numa/tier_memory.h"
#include "server/unique_fd.h"

namespace cxltier::server {

class Pool {
 public:
  // Checks the registration against the block size. A memfd pool's fd must be
  // a memfd sealed against shrinking (F_SEAL_SHRINK) of at least `length`
  // bytes: then the daemon's mapping of it can never lose a page under a
  // move. It is mapped and the fd closed (the mapping keeps the file). An
  // address-range pool pins the peer's process (`pid` and `uid` from
  // SO_PEERCRED) with a pidfd, refused if that process has exited. A refusal
  // is kBadPool, saying why.
  Status Open(const wire::RegisterPool& m, UniqueFd fd, pid_t pid, uid_t uid, uint64_t block_bytes);

  uint32_t blocks() const { return blocks_; }
  wire::PoolKind kind() const { return kind_; }
  uint64_t length() const { return length_; }
  // An address-range pool whose process has exited (one poll(2)). Its pid may
  // name another process by now: nothing may use this pool's ranges.
  bool ProcessGone() const { return process_ && !process_->Alive(); }
  // Refuses further admits. The handle is kept: it reports the process gone
  // forever, so a stray range of this pool fails (ESRCH) instead of naming
  // whoever has the pid now. Its live blocks are released after (a chunk
  // per turn of the I/O thread); meanwhile no move is planned for them.
  void MarkDead() { dead_ = true; }
  bool dead() const { return dead_; }
  // The pages of block `index`; they hold the mapping or the process handle,
  // so a queued move outlives the pool safely. REQUIRES: index < blocks().
  numa::PageRange Range(uint32_t index) const;

  // Page mode: a move's outcome. Pages under I/O are busy for a moment;
  // pinned pages always are. After kPinnedAfter moves in a row whose present
  // pages were all busy the pool counts as pinned, and moves of its blocks
  // are no longer tried. True when this outcome made it so.
  static constexpr int kPinnedAfter = 3;
  bool NoteMove(bool all_busy) {
    if (pinned_) return false;
    busy_streak_ = all_busy ? busy_streak_ + 1 : 0;
    pinned_ = busy_streak_ >= kPinnedAfter;
    return pinned_;
  }
  bool pinned() const { return pinned_; }
  // Page mode: the tier a memfd pool's new pages are steered to (the file's
  // memory policy, set by the daemon at registration), or -1: where the
  // client's first touch puts them.
  int new_pages_tier() const { return new_pages_tier_; }
  void set_new_pages_tier(int tier) { new_pages_tier_ = tier; }

  // ---- copy mode: one pool per tier, its blocks handed out by the daemon ----

  // A pool of `blocks` blocks of `stride` bytes for `tier`, from `source`:
  // kDaemon, a memfd the daemon creates on `nodes`; kDevdax, a region of the
  // client's device-DAX device `fd` from `offset`; kImport, `fd` is a memfd a
  // daemon made for this tier (a reconnect): adopted, bytes and all, once it
  // is checked to be what kDaemon would make (numa::AdoptTierMemory). No
  // byte of it is written. kBadPool or kLimit, saying why.
  Status OpenTier(uint8_t tier, uint32_t blocks, uint64_t stride, uint64_t block_bytes,
                  const std::vector<int>& nodes, wire::TierPoolSource source, UniqueFd fd,
                  uint64_t offset);
  bool is_tier() const { return tier_ >= 0; }
  uint8_t tier() const { return static_cast<uint8_t>(tier_); }
  // The memfd to pass to the client: kDaemon's; -1 for kDevdax (the client
  // has its own) and kImport (the client sent it).
  int tier_fd() const { return imported_ ? -1 : tier_fd_.get(); }
  // A memfd pool (kDaemon or kImport): counted in the uid's tier pool bytes.
  bool daemon_memory() const { return tier_fd_.valid(); }
  // The memfd's identity (st_dev, st_ino); {0, 0} for device-DAX.
  std::pair<uint64_t, uint64_t> memory_id() const { return memory_id_; }
  // A device-DAX pool's region: the device (st_rdev) and its bytes
  // [begin, end); device 0 for any other pool.
  struct DevdaxRegion {
    uint64_t device = 0;
    uint64_t begin = 0, end = 0;
    bool Overlaps(const DevdaxRegion& o) const {
      return device == o.device && begin < o.end && o.begin < end;
    }
  };
  const DevdaxRegion& devdax_region() const { return devdax_; }
  int node() const { return node_; }
  const std::shared_ptr<const numa::Mapping>& mapping() const { return mapping_; }
  uint8_t* BlockAddress(uint32_t index) const {
    return mapping_->bytes() + uint64_t{index} * stride_;
  }
  // A free block, or false when all are taken.
  bool TakeFree(uint32_t* index);
  // Takes block `index` (a block a reconnect re-admits where it is); false
  // when it is taken already or out of range.
  bool TakeAt(uint32_t index);
  bool IsFree(uint32_t index) const { return index < blocks_ && !taken_[index]; }
  void PutFree(uint32_t index) {
    if (index >= blocks_ || !taken_[index]) return;
    taken_[index] = 0;
    free_.push_back(index);
    ++free_count_;
  }
  uint32_t free_blocks() const { return free_count_; }

 private:
  wire::PoolKind kind_ = wire::PoolKind::kMemfd;
  std::shared_ptr<const numa::Mapping> mapping_;        // memfd pool
  std::shared_ptr<const numa::ProcessHandle> process_;  // range pool
  uintptr_t base_ = 0;  // memfd: our mapping; range: the client's address
  uint64_t length_ = 0;
  uint64_t stride_ = 0;
  uint64_t block_bytes_ = 0;
  uint32_t blocks_ = 0;
  bool dead_ = false;
  bool pinned_ = false;
  int busy_streak_ = 0;
  int new_pages_tier_ = -1;
  int tier_ = -1;  // copy mode: the tier; -1: a page-mode pool
  int node_ = -1;
  UniqueFd tier_fd_;
  bool imported_ = false;
  std::pair<uint64_t, uint64_t> memory_id_{0, 0};
  DevdaxRegion devdax_;
  // Copy mode: blocks holding nothing. free_ may also list taken blocks (one
  // TakeAt took, or PutFree listed twice): TakeFree skips them.
  std::vector<uint32_t> free_;
  std::vector<uint8_t> taken_;  // by block
  uint32_t free_count_ = 0;
};

}  // namespace cxltier::server
