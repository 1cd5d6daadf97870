#include "server/segment.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace cxltier::server {

Status Segment::Create(uint32_t slots, uint64_t client_id) {
  const uint64_t bytes = SegmentBytes(slots);
  UniqueFd fd(memfd_create("cxltier-state", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return Status::Internal(std::string("memfd_create: ") + std::strerror(errno));
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    return Status::Internal(std::string("ftruncate: ") + std::strerror(errno));
  }
  // The client can write slots but never resize the segment under us.
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return Status::Internal(std::string("sealing: ") + std::strerror(errno));
  }
  Result<std::shared_ptr<const numa::Mapping>> mapping =
      numa::Mapping::MapWritable(fd.get(), bytes, 0);
  if (!mapping.ok()) return Status::Internal(mapping.status().message);
  fd_ = std::move(fd);
  mapping_ = std::move(*mapping);
  base_ = mapping_->bytes();
  slots_ = slots;
  auto* h = new (base_) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->slots = slots;
  h->slot_offset = kSegmentSlotOffset;
  h->client_id = client_id;
  h->dirty_offset = SegmentDirtyOffset(slots);
  h->location_offset = SegmentLocationOffset(slots);
  h->lease_offset = SegmentLeaseOffset(slots);
  for (uint32_t i = 0; i < slots; ++i) new (slot(i)) BlockState{};
  for (uint32_t i = 0; i < slots; ++i) locations()[i] = LocationWord(kNoLocationTier, 0, 0);
  return Status::Ok();
}

}  // namespace cxltier::server
