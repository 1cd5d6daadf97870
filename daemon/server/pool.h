// A client's KV pool: where each of its blocks' bytes live, as page ranges the
// migrator can move. Validates what the client claims (untrusted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "cxltier/wire.h"
#include "numa/migrator.h"
#include "unique_fd.h"

namespace cxltier::server {

class Pool {
 public:
  Pool() = default;
  Pool(Pool&& o) noexcept;
  Pool& operator=(Pool&& o) noexcept;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool();

  // Checks the registration against the block size and, for a memfd pool,
  // the fd (must be a memfd or other shmem file, at least `length` bytes) and
  // maps it. `pid` comes from SO_PEERCRED. Returns an error message or "".
  std::string Open(const wire::RegisterPool& m, UniqueFd fd, pid_t pid, uint64_t block_bytes);

  uint32_t blocks() const { return blocks_; }
  wire::PoolKind kind() const { return kind_; }
  uint64_t length() const { return length_; }
  // The pages of block `index`. REQUIRES: index < blocks().
  numa::PageRange Range(uint32_t index) const;

 private:
  void Unmap();
  wire::PoolKind kind_ = wire::PoolKind::kMemfd;
  UniqueFd fd_;
  pid_t pid_ = 0;
  uintptr_t base_ = 0;  // memfd: our mapping; range: the client's address
  uint64_t length_ = 0;
  uint64_t stride_ = 0;
  uint64_t block_bytes_ = 0;
  uint32_t blocks_ = 0;
  bool mapped_ = false;
};

}  // namespace cxltier::server
