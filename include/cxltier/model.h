// Model geometry: how big a token's KV cache is, how many score streams
// attention yields, and what cxltier's per-block state costs against it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cxltier/status.h"

namespace cxltier {

// Bytes of one BlockState record.
inline constexpr uint64_t kStateBytes = 64;
// Bytes per (stream, token) entry in the per-head tracking design the seeds
// retracted; kept only to show what it would have cost.
inline constexpr uint64_t kRetractedEntryBytes = 8;

struct ModelGeometry {
  std::string_view name = "custom";
  uint32_t layers = 0;
  uint32_t query_heads = 0;
  uint32_t kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 2;    // 2 for fp16/bf16
  uint32_t block_tokens = 16;  // tokens per block

  // Query heads sharing one KV head (GQA group size); 1 for MHA.
  constexpr uint32_t gqa_group() const { return kv_heads ? query_heads / kv_heads : 0; }
  // (layer, KV head) score streams: 640 for Llama-3 70B.
  constexpr uint64_t streams() const { return uint64_t{layers} * kv_heads; }
  // K and V for one token in one layer.
  constexpr uint64_t bytes_per_token_per_layer() const {
    return 2ull * kv_heads * head_dim * dtype_bytes;
  }
  // K and V for one token in all layers: 2 x layers x KV heads x head dim x dtype.
  constexpr uint64_t bytes_per_token() const { return bytes_per_token_per_layer() * layers; }
  constexpr uint64_t block_bytes() const { return bytes_per_token() * block_tokens; }
  // Blocks needed for `tokens`; a partial last block counts as a whole one.
  constexpr uint64_t blocks_for(uint64_t tokens) const {
    return block_tokens ? (tokens + block_tokens - 1) / block_tokens : 0;
  }
  // KV bytes of the blocks that hold `tokens` (whole blocks).
  constexpr uint64_t kv_bytes(uint64_t tokens) const { return blocks_for(tokens) * block_bytes(); }
  // KV bytes of one layer for exactly `tokens` tokens (the seed's per-layer figure).
  constexpr uint64_t per_layer_kv_bytes(uint64_t tokens) const {
    return bytes_per_token_per_layer() * tokens;
  }
  constexpr uint64_t state_bytes(uint64_t tokens) const { return blocks_for(tokens) * kStateBytes; }
  // State bytes as a percent of KV bytes (0.0012% for Llama-3 70B).
  constexpr double state_overhead_percent(uint64_t tokens) const {
    const uint64_t kv = kv_bytes(tokens);
    return kv ? 100.0 * static_cast<double>(state_bytes(tokens)) / static_cast<double>(kv) : 0.0;
  }
  // The retracted design: one 8-byte entry per (stream, token).
  constexpr uint64_t retracted_bytes(uint64_t tokens) const {
    return streams() * tokens * kRetractedEntryBytes;
  }
  constexpr double retracted_overhead_percent(uint64_t tokens) const {
    const uint64_t kv = kv_bytes(tokens);
    return kv ? 100.0 * static_cast<double>(retracted_bytes(tokens)) / static_cast<double>(kv)
              : 0.0;
  }

  // Ok when the geometry is usable; otherwise (kGeometry) what is wrong with it.
  Status Validate() const;
};

// The largest block the daemon places: 1 GiB, 262,144 pages of 4 KiB. Llama-3
// 405B's 16-token block is 7.9 MiB; a block beyond this is not a real model's.
inline constexpr uint64_t kMaxBlockBytes = uint64_t{1} << 30;

// Built-in presets (public model configs; head_dim 128, fp16, 16-token blocks).
inline constexpr ModelGeometry kLlama3_70B{"llama3-70b", 80, 64, 8, 128, 2, 16};
inline constexpr ModelGeometry kLlama33_70B{"llama3.3-70b", 80, 64, 8, 128, 2, 16};
inline constexpr ModelGeometry kMixtral8x22B{"mixtral-8x22b", 56, 48, 8, 128, 2, 16};
inline constexpr ModelGeometry kMistral7B{"mistral-7b", 32, 32, 8, 128, 2, 16};
inline constexpr ModelGeometry kQwen25_7B{"qwen2.5-7b", 28, 28, 4, 128, 2, 16};
inline constexpr ModelGeometry kLlama3_8B{"llama3-8b", 32, 32, 8, 128, 2, 16};

inline constexpr ModelGeometry kModelPresets[] = {kLlama3_70B, kLlama33_70B, kMixtral8x22B,
                                                  kMistral7B,  kQwen25_7B,   kLlama3_8B};
inline constexpr ModelGeometry kDefaultModel = kLlama3_70B;

// The preset called `name`, or nullopt.
std::optional<ModelGeometry> FindModelPreset(std::string_view name);

// Parses a token or byte count with an optional binary suffix: "131072",
// "128k"/"128K" (x1024), "1m"/"1M" (x1024^2), "1g" (x1024^3); "KiB", "MiB",
// "GiB", "TiB" and "B" spellings are accepted too. nullopt on bad input or overflow.
std::optional<uint64_t> ParseSize(std::string_view text);

// "5.00 MiB", "40.0 GiB", "512 KiB", "327680 B" style: three significant digits.
std::string FormatBytes(uint64_t bytes);

}  // namespace cxltier
