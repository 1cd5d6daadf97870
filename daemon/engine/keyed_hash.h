// A hash of a block key keyed by a secret, for the tables that clients fill
// with keys of their choosing (the key indices, shards' sample). HashKey
// (cxltier/block.h) is public and XORing a secret into the key before it does
// not help: keys that differ only in the top bits of both halves keep their
// collisions whatever the secret. XXH3 with the secret as its seed mixes it
// into a 128-bit product of the two halves.
#pragma once

#include <cstdint>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "cxltier/block.h"

namespace cxltier::engine {

// Seed 0 (the simulator's) is HashKey itself: the same hashes in every run,
// the ones the simulator's results were measured with.
inline uint64_t KeyedHash(const BlockKey& key, uint64_t seed) {
  if (seed == 0) return HashKey(key);
  const uint64_t halves[2] = {key.hi, key.lo};
  return XXH3_64bits_withSeed(halves, sizeof halves, seed);
}

}  // namespace cxltier::engine
