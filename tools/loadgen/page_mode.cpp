#include "page_mode.h"

#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace cxltier::loadgen {
namespace {

uint64_t Pattern(uint64_t block, uint64_t word) {
  uint64_t x = (block + 1) * 0x9E3779B97F4A7C15ULL ^ (word * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 29;
  return x;
}

}  // namespace

int MapPagePool(Session& s) {
  void* pool = MAP_FAILED;
  if (s.opt.pool_kind == "memfd") {
    s.memfd = memfd_create("cxltier-loadgen-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (s.memfd < 0 || ftruncate(s.memfd, static_cast<off_t>(s.length)) != 0) return Fail("memfd");
    pool = mmap(nullptr, s.length, PROT_READ | PROT_WRITE, MAP_SHARED, s.memfd, 0);
  } else {
    pool = mmap(nullptr, s.length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  }
  if (pool == MAP_FAILED) return Fail("cannot map a pool of " + FormatBytes(s.length));
  s.pool = pool;
  madvise(pool, s.length, MADV_NOHUGEPAGE);
  return 0;
}

void FillPagePool(Session& s) {
  auto* words = static_cast<uint64_t*>(s.pool);
  const uint64_t words_per_block = s.opt.block_bytes / 8;
  for (uint64_t b = 0; b < s.opt.blocks; ++b) {
    uint64_t* w = words + b * (s.stride / 8);
    for (uint64_t i = 0; i < words_per_block; ++i) w[i] = Pattern(b, i);
  }
}

int RegisterPagePool(Session& s) {
  const Status st =
      s.opt.pool_kind == "memfd"
          ? s.client->RegisterMemfdPool(s.memfd, s.length, s.stride, s.opt.blocks, &s.pool_id)
          : s.client->RegisterRangePool(s.pool, s.length, s.stride, s.opt.blocks, &s.pool_id);
  if (!st.ok()) return Fail("register pool: " + st.message);
  return 0;
}

int PinPagePool(Session& s) {
  if (Status st = s.pins.Add(s.pool, s.length); !st.ok()) {
    return Fail("pinning the pool: " + st.message);
  }
  return 0;
}

void VerifyPagePool(const Session& s, Verified* v) {
  const auto* words = static_cast<const uint64_t*>(s.pool);
  const uint64_t words_per_block = s.opt.block_bytes / 8;
  for (uint64_t b = 0; b < s.opt.blocks; ++b) {
    const uint64_t* w = words + b * (s.stride / 8);
    ++v->verified;
    for (uint64_t k = 0; k < words_per_block; ++k) {
      if (w[k] != Pattern(b, k)) {
        ++v->corrupt;
        break;
      }
    }
  }
}

}  // namespace cxltier::loadgen
