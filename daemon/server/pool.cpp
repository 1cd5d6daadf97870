#include "pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace cxltier::server {
namespace {

uint64_t PageSize() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

Pool::Pool(Pool&& o) noexcept { *this = std::move(o); }

Pool& Pool::operator=(Pool&& o) noexcept {
  if (this != &o) {
    Unmap();
    kind_ = o.kind_;
    fd_ = std::move(o.fd_);
    pid_ = o.pid_;
    base_ = o.base_;
    length_ = o.length_;
    stride_ = o.stride_;
    block_bytes_ = o.block_bytes_;
    blocks_ = o.blocks_;
    mapped_ = std::exchange(o.mapped_, false);
  }
  return *this;
}

Pool::~Pool() { Unmap(); }

void Pool::Unmap() {
  if (mapped_) munmap(reinterpret_cast<void*>(base_), length_);
  mapped_ = false;
}

std::string Pool::Open(const wire::RegisterPool& m, UniqueFd fd, pid_t pid, uint64_t block_bytes) {
  const uint64_t page = PageSize();
  if (m.blocks == 0) return "a pool needs at least one block";
  if (m.stride < block_bytes) {
    return "stride " + std::to_string(m.stride) + " is smaller than a block (" +
           std::to_string(block_bytes) + " bytes)";
  }
  if (m.stride % page != 0) return "stride must be a multiple of the page size";
  if (m.length / m.stride < m.blocks) {
    return "pool of " + std::to_string(m.length) + " bytes cannot hold " +
           std::to_string(m.blocks) + " blocks of stride " + std::to_string(m.stride);
  }
  if (m.length > (uint64_t{1} << 46)) return "pool length is absurd";
  kind_ = m.kind;
  length_ = m.length;
  stride_ = m.stride;
  block_bytes_ = block_bytes;
  blocks_ = m.blocks;
  if (m.kind == wire::PoolKind::kRange) {
    if (fd.valid()) return "an address-range pool takes no fd";
    if (m.address % page != 0 || m.address == 0) return "pool address must be page-aligned";
    if (pid <= 0) return "peer pid unknown (SO_PEERCRED)";
    pid_ = pid;
    base_ = m.address;
    return {};
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return std::string("fstat: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "the pool fd is not a memfd (not a regular file)";
  // Only shmem files (memfd, tmpfs) support seals: a cheap way to refuse disk files.
  if (fcntl(fd.get(), F_GET_SEALS) < 0) return "the pool fd is not a memfd or other shmem file";
  if (static_cast<uint64_t>(st.st_size) < m.length) {
    return "the memfd holds " + std::to_string(st.st_size) + " bytes, less than the pool's " +
           std::to_string(m.length);
  }
  void* p = mmap(nullptr, m.length, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (p == MAP_FAILED) return std::string("mmap of the pool: ") + std::strerror(errno);
  fd_ = std::move(fd);
  base_ = reinterpret_cast<uintptr_t>(p);
  mapped_ = true;
  pid_ = 0;
  return {};
}

numa::PageRange Pool::Range(uint32_t index) const {
  const uint64_t page = PageSize();
  const uint64_t len = (block_bytes_ + page - 1) / page * page;
  return numa::PageRange{pid_, base_ + uint64_t{index} * stride_, len,
                         kind_ == wire::PoolKind::kMemfd};
}

}  // namespace cxltier::server
