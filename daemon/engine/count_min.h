// A count-min sketch with 4-bit-style saturating counters and periodic halving
// ("aging"), as W-TinyLFU uses it. Estimates never fall below the true count
// since the last halving, and equal it when no two keys collide in every row.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cxltier/block.h"
#include "engine/keyed_hash.h"

namespace cxltier::engine {

class CountMinSketch {
 public:
  static constexpr int kRows = 4;
  static constexpr uint8_t kMaxCount = 15;

  // `width` is rounded up to a power of two (at least 16). After `sample_size`
  // increments every counter is halved; 0 disables aging. `seed` keys the
  // hash of the keys (KeyedHash): with a secret one, a client cannot choose
  // keys that share every counter with another's.
  CountMinSketch(size_t width, uint64_t sample_size, uint64_t seed = 0)
      : sample_size_(sample_size), seed_(seed) {
    width_ = 16;
    while (width_ < width) width_ *= 2;
    counters_.assign(width_ * kRows, 0);
  }

  void Increment(const BlockKey& key) {
    const uint64_t h = KeyedHash(key, seed_);
    for (int r = 0; r < kRows; ++r) {
      uint8_t& c = counters_[Index(h, r)];
      if (c < kMaxCount) ++c;
    }
    if (sample_size_ && ++additions_ >= sample_size_) Age();
  }

  uint8_t Estimate(const BlockKey& key) const {
    const uint64_t h = KeyedHash(key, seed_);
    uint8_t m = kMaxCount;
    for (int r = 0; r < kRows; ++r) m = std::min(m, counters_[Index(h, r)]);
    return m;
  }

  size_t width() const { return width_; }
  uint64_t agings() const { return agings_; }

 private:
  size_t Index(uint64_t h, int row) const {
    // A different odd multiplier per row gives four near-independent indices.
    static constexpr uint64_t kSeeds[kRows] = {0x9e3779b97f4a7c15ULL, 0xc2b2ae3d27d4eb4fULL,
                                               0x165667b19e3779f9ULL, 0xd6e8feb86659fd93ULL};
    const uint64_t x = (h ^ (h >> 29)) * kSeeds[row];
    return static_cast<size_t>(row) * width_ + static_cast<size_t>((x >> 32) & (width_ - 1));
  }

  void Age() {
    for (uint8_t& c : counters_) c = static_cast<uint8_t>(c >> 1);
    additions_ /= 2;
    ++agings_;
  }

  size_t width_;
  uint64_t sample_size_;
  uint64_t seed_ = 0;
  uint64_t additions_ = 0;
  uint64_t agings_ = 0;
  std::vector<uint8_t> counters_;
};

}  // namespace cxltier::engine
