#include "server/pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "cxltier/lease.h"

namespace cxltier::server {
namespace {

uint64_t PageSize() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

namespace {
Status Refused(std::string message) {
  return Status::Fail(wire::ErrorCode::kBadPool, std::move(message));
}
}  // namespace

Status Pool::Open(const wire::RegisterPool& m, UniqueFd fd, pid_t pid, uid_t uid,
                  uint64_t block_bytes) {
  const uint64_t page = PageSize();
  if (m.blocks == 0) return Refused("a pool needs at least one block");
  if (m.stride == 0) return Refused("a pool's stride must be at least one page");
  if (m.stride < block_bytes) {
    return Refused("stride " + std::to_string(m.stride) + " is smaller than a block (" +
                   std::to_string(block_bytes) + " bytes)");
  }
  if (m.stride % page != 0) return Refused("stride must be a multiple of the page size");
  if (m.length / m.stride < m.blocks) {
    return Refused("pool of " + std::to_string(m.length) + " bytes cannot hold " +
                   std::to_string(m.blocks) + " blocks of stride " + std::to_string(m.stride));
  }
  if (m.length > (uint64_t{1} << 46)) return Refused("pool length is absurd");
  kind_ = m.kind;
  length_ = m.length;
  stride_ = m.stride;
  block_bytes_ = block_bytes;
  blocks_ = m.blocks;
  if (m.kind == wire::PoolKind::kRange) {
    if (fd.valid()) return Refused("an address-range pool takes no fd");
    if (m.address % page != 0 || m.address == 0)
      return Refused("pool address must be page-aligned");
    if (m.address + m.length < m.address)
      return Refused("pool range wraps around the address space");
    Result<std::shared_ptr<const numa::ProcessHandle>> process =
        numa::ProcessHandle::Open(pid, uid);
    if (!process.ok()) return Refused(process.status().message);
    process_ = std::move(*process);
    base_ = m.address;
    return Status::Ok();
  }
  if (!fd.valid()) return Refused("a memfd pool needs its memfd (SCM_RIGHTS)");
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return Refused(std::string("fstat: ") + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Refused("the pool fd is not a memfd (not a regular file)");
  // Only shmem files (memfd, tmpfs) support seals: a cheap way to refuse disk files.
  const int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0) return Refused("the pool fd is not a memfd or other shmem file");
  // Without the seal the client (or a file system it mounted) can take pages
  // from under our mapping at any moment, and touching them would be SIGBUS.
  // A tmpfs file opened with open(2) carries F_SEAL_SEAL and can never get it.
  if (!(seals & F_SEAL_SHRINK)) {
    return Refused(
        "the pool memfd is not sealed against shrinking: seal it with "
        "fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK); create it with MFD_ALLOW_SEALING");
  }
  if (static_cast<uint64_t>(st.st_size) < m.length) {
    return Refused("the memfd holds " + std::to_string(st.st_size) +
                   " bytes, less than the pool's " + std::to_string(m.length));
  }
  // Only its blocks are mapped: the length past them is never used, and a
  // mapping takes the daemon's address space, sparse file or not.
  Result<std::shared_ptr<const numa::Mapping>> mapping =
      numa::Mapping::Map(fd.get(), uint64_t{m.blocks} * m.stride);
  if (!mapping.ok()) return Refused(mapping.status().message);
  mapping_ = std::move(*mapping);
  base_ = mapping_->address();
  return Status::Ok();  // `fd` closes here: the mapping holds the file
}

Status Pool::OpenTier(uint8_t tier, uint32_t blocks, uint64_t stride, uint64_t block_bytes,
                      const std::vector<int>& nodes, wire::TierPoolSource source, UniqueFd fd,
                      uint64_t offset) {
  const uint64_t page = PageSize();
  if (blocks == 0) return Refused("a tier pool needs at least one block");
  if (blocks > kMaxPoolIndex + 1) {
    return Refused("a tier pool holds at most " + std::to_string(kMaxPoolIndex + 1) + " blocks");
  }
  if (stride < block_bytes) {
    return Refused("stride " + std::to_string(stride) + " is smaller than a block (" +
                   std::to_string(block_bytes) + " bytes)");
  }
  // The budgets count blocks: a larger stride would make one block cost more.
  const uint64_t want = (block_bytes + page - 1) / page * page;
  if (stride != want) {
    return Refused("a tier pool's stride is the block size rounded up to a page (" +
                   std::to_string(want) + "), not " + std::to_string(stride));
  }
  const uint64_t bytes = uint64_t{blocks} * stride;
  numa::TierMemory mem;
  const std::string name = "cxltier-tier" + std::to_string(tier);
  if (source == wire::TierPoolSource::kDevdax) {
    UniqueFd devdax = std::move(fd);
    if (!devdax.valid()) return Refused("a device-DAX tier pool needs the device's fd");
    if (tier == 0) return Refused("tier 0 cannot be device-DAX memory (it has no CPU node)");
    Result<numa::DevdaxInfo> inspected = numa::InspectDevdax(devdax.get());
    if (!inspected.ok()) return Refused(inspected.status().message);
    const numa::DevdaxInfo info = *inspected;
    if (offset % info.align != 0) {
      return Refused("offset " + std::to_string(offset) + " is not a multiple of the device's " +
                     std::to_string(info.align) + "-byte alignment");
    }
    const uint64_t mapped = (bytes + info.align - 1) / info.align * info.align;
    if (offset > info.size || mapped > info.size - offset) {
      return Refused("the device-DAX region from offset " + std::to_string(offset) + " holds " +
                     std::to_string(offset > info.size ? 0 : info.size - offset) +
                     " bytes, less than the tier's " + std::to_string(blocks) + " blocks (" +
                     std::to_string(mapped) + " bytes)");
    }
    struct stat dev {};
    if (fstat(devdax.get(), &dev) != 0)
      return Refused(std::string("fstat: ") + std::strerror(errno));
    Result<numa::TierMemory> dax = numa::MapDevdax(devdax.get(), offset, mapped);
    if (!dax.ok()) return Refused(dax.status().message);
    devdax_ = DevdaxRegion{static_cast<uint64_t>(dev.st_rdev), offset, offset + mapped};
    mem = std::move(*dax);
    node_ = info.node;
  } else if (source == wire::TierPoolSource::kImport) {
    if (!fd.valid()) return Refused("an imported tier pool needs its memfd (SCM_RIGHTS)");
    Result<numa::TierMemory> adopted = numa::AdoptTierMemory(fd.get(), nodes, bytes, name);
    if (!adopted.ok()) {
      return Refused("the imported tier " + std::to_string(tier) +
                     " pool: " + adopted.status().message);
    }
    mem = std::move(*adopted);
    tier_fd_ = std::move(fd);
    imported_ = true;
    node_ = nodes.front();
  } else {
    if (fd.valid()) return Refused("a tier pool the daemon makes takes no fd");
    Result<numa::TierMemory> created = numa::CreateTierMemory(nodes, bytes, name);
    if (!created.ok()) {
      return Status::Fail(wire::ErrorCode::kLimit,
                          "tier " + std::to_string(tier) + " pool: " + created.status().message);
    }
    mem = std::move(*created);
    tier_fd_ = UniqueFd(mem.fd);
    node_ = nodes.front();
  }
  if (tier_fd_.valid()) {
    struct stat st {};
    if (fstat(tier_fd_.get(), &st) == 0) memory_id_ = {st.st_dev, st.st_ino};
  }
  kind_ = wire::PoolKind::kMemfd;
  mapping_ = std::move(mem.mapping);
  base_ = mapping_->address();
  length_ = mapping_->length_bytes();  // devdax: rounded up to the device's alignment
  stride_ = stride;
  block_bytes_ = block_bytes;
  blocks_ = blocks;
  tier_ = tier;
  free_.clear();
  for (uint32_t i = blocks; i-- > 0;) free_.push_back(i);
  taken_.assign(blocks, 0);
  free_count_ = blocks;
  return Status::Ok();  // a devdax fd closes here: the mapping holds the device
}

bool Pool::TakeFree(uint32_t* index) {
  while (!free_.empty()) {
    const uint32_t i = free_.back();
    free_.pop_back();
    if (taken_[i]) continue;  // taken by TakeAt, or listed twice
    taken_[i] = 1;
    --free_count_;
    *index = i;
    return true;
  }
  return false;
}

bool Pool::TakeAt(uint32_t index) {
  if (!IsFree(index)) return false;
  taken_[index] = 1;
  --free_count_;
  return true;
}

numa::PageRange Pool::Range(uint32_t index) const {
  const uint64_t page = PageSize();
  const uint64_t len = (block_bytes_ + page - 1) / page * page;
  numa::PageRange r;
  r.pid = process_ ? process_->pid() : 0;
  r.address = base_ + uint64_t{index} * stride_;
  r.length = len;
  r.shared = kind_ == wire::PoolKind::kMemfd;
  r.process = process_;
  r.mapping = mapping_;
  return r;
}

}  // namespace cxltier::server
