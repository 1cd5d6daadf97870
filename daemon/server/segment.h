// A client's shared-memory state segment: a sealed memfd holding a header
// page and 64-byte BlockState slots, mapped here and in the client.
#pragma once

#include <cstdint>
#include <string>

#include "cxltier/segment.h"
#include "unique_fd.h"

namespace cxltier::server {

class Segment {
 public:
  Segment() = default;
  Segment(Segment&& o) noexcept;
  Segment& operator=(Segment&& o) noexcept;
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;
  ~Segment();

  // Creates a memfd of SegmentBytes(slots), seals its size, maps it and writes
  // the header. Returns an error message or "".
  std::string Create(uint32_t slots, uint64_t client_id);

  int fd() const { return fd_.get(); }
  uint32_t slots() const { return slots_; }
  SegmentHeader* header() const { return static_cast<SegmentHeader*>(base_); }
  // REQUIRES: i < slots().
  BlockState* slot(uint32_t i) const {
    return reinterpret_cast<BlockState*>(static_cast<char*>(base_) + kSegmentSlotOffset) + i;
  }
  uint64_t* dirty() const {
    return reinterpret_cast<uint64_t*>(static_cast<char*>(base_) + SegmentDirtyOffset(slots_));
  }

 private:
  void Unmap();
  UniqueFd fd_;
  void* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t slots_ = 0;
};

}  // namespace cxltier::server
