// Model geometries the tests share, named by their block size. A block is
// 16 tokens x layers x KV heads x (K and V) x head_dim x dtype bytes; these
// have one layer and one KV head, so head_dim x 64 bytes.
#pragma once

#include "cxltier/model.h"

namespace cxltier {

inline constexpr ModelGeometry kTiny4KiB{"tiny", 1, 1, 1, 64, 2, 16};
inline constexpr ModelGeometry kTiny8KiB{"tiny", 1, 1, 1, 128, 2, 16};
inline constexpr ModelGeometry kSmall64KiB{"small", 1, 1, 1, 1024, 2, 16};

static_assert(kTiny4KiB.block_bytes() == 4096);
static_assert(kTiny8KiB.block_bytes() == 8192);
static_assert(kSmall64KiB.block_bytes() == 65536);

}  // namespace cxltier
