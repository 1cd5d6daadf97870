#include "server/segment.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace cxltier::server {

Segment::Segment(Segment&& o) noexcept { *this = std::move(o); }

Segment& Segment::operator=(Segment&& o) noexcept {
  if (this != &o) {
    Unmap();
    fd_ = std::move(o.fd_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    slots_ = std::exchange(o.slots_, 0);
  }
  return *this;
}

Segment::~Segment() { Unmap(); }

void Segment::Unmap() {
  if (base_) munmap(base_, bytes_);
  base_ = nullptr;
}

namespace {
Status Failed(std::string message) {
  return Status::Fail(wire::ErrorCode::kInternal, std::move(message));
}
}  // namespace

Status Segment::Create(uint32_t slots, uint64_t client_id) {
  const uint64_t bytes = SegmentBytes(slots);
  UniqueFd fd(memfd_create("cxltier-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Failed(std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Failed(std::string("ftruncate: ") + std::strerror(errno));
  }
  // The client can write slots but never resize the segment under us.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Failed(std::string("sealing: ") + std::strerror(errno));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (base == MAP_FAILED) return Failed(std::string("mmap: ") + std::strerror(errno));
  Unmap();
  fd_ = std::move(fd);
  base_ = base;
  bytes_ = bytes;
  slots_ = slots;
  auto* h = new (base_) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->slots = slots;
  h->slot_offset = kSegmentSlotOffset;
  h->client_id = client_id;
  h->dirty_offset = SegmentDirtyOffset(slots);
  for (uint32_t i = 0; i < slots; ++i) new (slot(i)) BlockState{};
  return Status::Ok();
}

}  // namespace cxltier::server
