// A client's KV pool: where each of its blocks' bytes live, as page ranges the
// migrator can move. Validates what the client claims (untrusted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "cxltier/wire.h"
#include "numa/migrator.h"
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
  // whoever has the pid now. REQUIRES: no live block in this pool.
  void MarkDead() { dead_ = true; }
  bool dead() const { return dead_; }
  // The pages of block `index`; they hold the mapping or the process handle,
  // so a queued move outlives the pool safely. REQUIRES: index < blocks().
  numa::PageRange Range(uint32_t index) const;

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
};

}  // namespace cxltier::server
