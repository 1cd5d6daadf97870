// Block identity and the 64-byte per-block state.
//
// A block is 16 consecutive tokens of one sequence, all layers and all KV heads
// together. It is the unit that is placed, moved and evicted. Its key is stable
// across eviction and re-admission, so a block's score can survive both.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

namespace cxltier {

// 16-byte identity of a block. Either a direct packing of {sequence id, block
// index} or a 128-bit prefix hash (XXH3-128) chained from the parent block's key.
struct BlockKey {
  uint64_t hi = 0;
  uint64_t lo = 0;

  // The key of block `block_index` of sequence `sequence_id`: hi = sequence id,
  // lo = block index. Reversible and cheap; unique while sequence ids are unique.
  static constexpr BlockKey FromSequence(uint64_t sequence_id, uint64_t block_index) {
    return BlockKey{sequence_id, block_index};
  }

  // The key of the block holding `tokens`, whose prefix ends with `parent`
  // (use BlockKey{} for the first block). XXH3-128 over parent's 16 bytes
  // followed by the token ids in little-endian order, so equal prefixes give
  // equal keys and any change earlier in the prefix changes every later key.
  static BlockKey FromParent(const BlockKey& parent, std::span<const uint32_t> tokens);

  // Parses the 32 hex digits printed by ToString(). Returns false on bad input.
  static bool Parse(std::string_view text, BlockKey* out);

  // 32 lowercase hex digits, hi first.
  std::string ToString() const;

  constexpr bool IsZero() const { return hi == 0 && lo == 0; }

  friend constexpr bool operator==(const BlockKey&, const BlockKey&) = default;
  friend constexpr auto operator<=>(const BlockKey&, const BlockKey&) = default;
};
static_assert(sizeof(BlockKey) == 16);

// A 64-bit hash of a key, good for hash tables. Keys made by FromSequence are
// far from random, so both halves are mixed (splitmix64 finaliser).
constexpr uint64_t HashKey(const BlockKey& key) {
  uint64_t x = key.hi * 0x9e3779b97f4a7c15ULL ^ (key.lo + 0x632be59bd9b4e019ULL);
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

struct BlockKeyHash {
  size_t operator()(const BlockKey& key) const { return static_cast<size_t>(HashKey(key)); }
};

// Tiers, fastest first. A host has two or more: tier k is TierAt(k), for k
// below kMaxTiers; the last one holds what the faster ones have no room for.
enum class Tier : uint8_t {
  kFast = 0,     // tier 0: DRAM, nodes with CPUs
  kSlow = 1,     // tier 1: CXL Type-3 or a remote node (the last tier of a two-tier host)
  kNone = 0xff,  // not resident anywhere (a ghost)
};
inline constexpr unsigned kMaxTiers = 8;
constexpr Tier TierAt(unsigned k) { return static_cast<Tier>(k); }
constexpr unsigned TierIndex(Tier t) { return static_cast<unsigned>(t); }

// BlockState::flags bits (written by the daemon only).
enum BlockFlags : uint8_t {
  kFlagResident = 1u << 0,   // the block is admitted and its bytes live in `tier`
  kFlagRestored = 1u << 1,   // its score came back from a ghost on admission
  kFlagMigrating = 1u << 2,  // a move is in flight; `tier` is the source
  kFlagInTarget = 1u << 4,   // the policy wants it in tier 0 (engine bookkeeping)
  // Bit 3 is free.
};

// The 64-byte per-block record. The same layout is used by the engine's table
// and by the shared-memory segment a client maps.
//
// Who writes what (everything a client writes is untrusted by the daemon):
//   field            bytes  writer
//   key              0-15   client at admit (the daemon keeps its own copy)
//   score            16-23  daemon (policy value: LFU count, EMA, last touch)
//   touch_time       24-31  daemon (the engine's clock at the last folded touch)
//   touch_count      32-35  daemon (touches folded so far)
//   tier             36     daemon (Tier, written after a move is verified)
//   flags            37     daemon (BlockFlags)
//   reserved0        38-39  nobody (zero)
//   client_touches   40-43  client (running count of observations; wraps)
//   client_mass_q16  44-47  client (running sum of masses in 1/65536 units; wraps)
//   touch_seq        48-55  daemon (global order of the last touch; ties break on it)
//   generation       56-59  daemon (bumped each time the slot is reused)
//   policy_word      60-63  daemon (private to the policy)
struct alignas(64) BlockState {
  BlockKey key;
  double score = 0.0;
  // The engine's clock at the last folded touch, not a wall time: the daemon's
  // tick count (which continues across restarts: checkpoints carry it), the
  // simulator's workload step. Differences are in those units.
  uint64_t touch_time = 0;
  uint32_t touch_count = 0;
  Tier tier = Tier::kNone;
  uint8_t flags = 0;
  uint16_t reserved0 = 0;
  uint32_t client_touches = 0;
  uint32_t client_mass_q16 = 0;
  uint64_t touch_seq = 0;
  uint32_t generation = 0;
  uint32_t policy_word = 0;
};

static_assert(sizeof(BlockState) == 64, "BlockState must be exactly one cache line");
static_assert(alignof(BlockState) == 64, "BlockState must be cache-line aligned");
static_assert(offsetof(BlockState, key) == 0);
static_assert(offsetof(BlockState, score) == 16);
static_assert(offsetof(BlockState, touch_time) == 24);
static_assert(offsetof(BlockState, touch_count) == 32);
static_assert(offsetof(BlockState, tier) == 36);
static_assert(offsetof(BlockState, flags) == 37);
static_assert(offsetof(BlockState, client_touches) == 40);
static_assert(offsetof(BlockState, client_mass_q16) == 44);
static_assert(offsetof(BlockState, touch_seq) == 48);
static_assert(offsetof(BlockState, generation) == 56);
static_assert(offsetof(BlockState, policy_word) == 60);

}  // namespace cxltier

template <>
struct std::hash<cxltier::BlockKey> {
  size_t operator()(const cxltier::BlockKey& key) const noexcept {
    return static_cast<size_t>(cxltier::HashKey(key));
  }
};
