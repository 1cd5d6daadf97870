#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include <array>
#include <cstring>
#include <vector>

#include "cxltier/block.h"

namespace cxltier {
namespace {

void PutLe64(uint64_t v, unsigned char* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

BlockKey BlockKey::FromParent(const BlockKey& parent, std::span<const uint32_t> tokens) {
  XXH3_state_t state;
  XXH3_128bits_reset(&state);
  unsigned char head[16];
  PutLe64(parent.hi, head);
  PutLe64(parent.lo, head + 8);
  XXH3_128bits_update(&state, head, sizeof(head));
  // Token ids are hashed as little-endian 32-bit words whatever the host order.
  std::array<unsigned char, 4 * 64> chunk;
  size_t i = 0;
  while (i < tokens.size()) {
    size_t n = 0;
    for (; n < chunk.size() / 4 && i < tokens.size(); ++n, ++i) {
      const uint32_t t = tokens[i];
      for (int b = 0; b < 4; ++b) chunk[4 * n + b] = static_cast<unsigned char>(t >> (8 * b));
    }
    XXH3_128bits_update(&state, chunk.data(), 4 * n);
  }
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockKey{h.high64, h.low64};
}

bool BlockKey::Parse(std::string_view text, BlockKey* out) {
  if (text.size() != 32) return false;
  uint64_t parts[2] = {0, 0};
  for (size_t i = 0; i < 32; ++i) {
    const int d = HexDigit(text[i]);
    if (d < 0) return false;
    parts[i / 16] = (parts[i / 16] << 4) | static_cast<uint64_t>(d);
  }
  *out = BlockKey{parts[0], parts[1]};
  return true;
}

std::string BlockKey::ToString() const {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = kHex[(hi >> (4 * i)) & 0xf];
    s[31 - i] = kHex[(lo >> (4 * i)) & 0xf];
  }
  return s;
}

}  // namespace cxltier
