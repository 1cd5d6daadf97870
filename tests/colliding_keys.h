// Keys a hostile client can choose so that their hashes collide: HashKey
// (include/cxltier/block.h) is public and invertible, so for any 64-bit h a
// key with HashKey(key) == h can be computed (hi = 0, lo from the inverse
// of the finaliser). Keys whose hashes share their low 32 bits share one
// home in an unkeyed KeyIndex.
#pragma once

#include <cstdint>

#include "cxltier/block.h"

namespace cxltier::test {

inline uint64_t InverseOdd(uint64_t m) {
  uint64_t inv = m;
  for (int i = 0; i < 6; ++i) inv *= 2 - m * inv;  // Newton: doubles the correct bits
  return inv;
}

// The inverse of x ^= x >> shift.
inline uint64_t UnshiftXor(uint64_t x, int shift) {
  for (int s = shift; s < 64; s += shift) x ^= x >> s;
  return x;
}

// A key whose HashKey is `h`.
inline BlockKey KeyWithHash(uint64_t h) {
  uint64_t x = UnshiftXor(h, 31);
  x *= InverseOdd(0x94d049bb133111ebULL);
  x = UnshiftXor(x, 27);
  x *= InverseOdd(0xbf58476d1ce4e5b9ULL);
  x = UnshiftXor(x, 30);
  return BlockKey{0, x - 0x632be59bd9b4e019ULL};
}

// The n-th of a family of keys whose hashes all end in the same 32 bits.
inline BlockKey CollidingKey(uint32_t n) { return KeyWithHash((uint64_t{n} + 1) << 32 | 0x5eed); }

}  // namespace cxltier::test
