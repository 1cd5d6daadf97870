#include "cxltier/model.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cxltier {

Status ModelGeometry::Validate() const {
  const auto bad = [](const char* why) { return Status::Fail(wire::ErrorCode::kGeometry, why); };
  if (layers == 0) return bad("layers must be at least 1");
  if (kv_heads == 0) return bad("KV heads must be at least 1");
  if (query_heads == 0) return bad("query heads must be at least 1");
  if (query_heads % kv_heads != 0) return bad("query heads must be a multiple of KV heads (GQA)");
  if (head_dim == 0) return bad("head dim must be at least 1");
  if (dtype_bytes == 0 || dtype_bytes > 8) return bad("dtype bytes must be between 1 and 8");
  if (block_tokens == 0) return bad("block tokens must be at least 1");
  // Keep every derived product far from 64-bit overflow for contexts up to
  // 2^40 tokens. The product is taken in double: in 64 bits it wraps (2 x
  // 2^31 KV heads x 2^31 head dim x 2 bytes is 2^64, a block of 0 bytes).
  const double bytes = 2.0 * kv_heads * head_dim * dtype_bytes * layers * block_tokens;
  if (bytes > 1e15) return bad("geometry is absurdly large");
  return Status::Ok();
}

std::optional<ModelGeometry> FindModelPreset(std::string_view name) {
  for (const ModelGeometry& m : kModelPresets) {
    if (m.name == name) return m;
  }
  return std::nullopt;
}

std::optional<uint64_t> ParseSize(std::string_view text) {
  size_t i = 0;
  uint64_t value = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    const uint64_t digit = static_cast<uint64_t>(text[i] - '0');
    if (value > (std::numeric_limits<uint64_t>::max() - digit) / 10) return std::nullopt;
    value = value * 10 + digit;
    ++i;
  }
  if (i == 0) return std::nullopt;
  std::string suffix;
  for (; i < text.size(); ++i)
    suffix += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k" || suffix == "kib") {
    shift = 10;
  } else if (suffix == "m" || suffix == "mib") {
    shift = 20;
  } else if (suffix == "g" || suffix == "gib") {
    shift = 30;
  } else if (suffix == "t" || suffix == "tib") {
    shift = 40;
  } else {
    return std::nullopt;
  }
  if (shift && value > (std::numeric_limits<uint64_t>::max() >> shift)) return std::nullopt;
  return value << shift;
}

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024.0 && unit < 6) {
    v /= 1024.0;
    ++unit;
  }
  char buf[32];
  const int decimals = v < 10.0 ? 2 : (v < 100.0 ? 1 : 0);
  std::snprintf(buf, sizeof(buf), "%.*f %s", decimals, v, kUnits[unit]);
  return buf;
}

}  // namespace cxltier
