#include "plan.h"

#include <fmt/format.h>

#include <algorithm>

namespace cxltier::ctl {

std::string Grouped(uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

namespace {

std::string BytesCell(uint64_t bytes) {
  return fmt::format("{} B ({})", Grouped(bytes), FormatBytes(bytes));
}

ModelGeometry AsMha(ModelGeometry m) {
  m.kv_heads = m.query_heads;
  return m;
}

}  // namespace

nlohmann::json PlanJson(const ModelGeometry& m, uint64_t tokens) {
  nlohmann::json j;
  j["model"] = std::string(m.name);
  j["context_tokens"] = tokens;
  j["layers"] = m.layers;
  j["query_heads"] = m.query_heads;
  j["kv_heads"] = m.kv_heads;
  j["head_dim"] = m.head_dim;
  j["dtype_bytes"] = m.dtype_bytes;
  j["streams"] = m.streams();
  j["gqa_group"] = m.gqa_group();
  j["bytes_per_token"] = m.bytes_per_token();
  j["block_tokens"] = m.block_tokens;
  j["block_bytes"] = m.block_bytes();
  j["blocks"] = m.blocks_for(tokens);
  j["kv_bytes"] = m.kv_bytes(tokens);
  j["state_bytes_per_block"] = kStateBytes;
  j["state_bytes"] = m.state_bytes(tokens);
  j["state_overhead_percent"] = m.state_overhead_percent(tokens);
  j["retracted"] = {
      {"design", "one entry per (stream, token)"},
      {"entry_bytes", kRetractedEntryBytes},
      {"bytes", m.retracted_bytes(tokens)},
      {"overhead_percent", m.retracted_overhead_percent(tokens)},
  };
  return j;
}

std::string PlanTable(const ModelGeometry& m, uint64_t tokens) {
  std::string out;
  auto row = [&out](std::string_view label, const std::string& value) {
    out += fmt::format("  {:<22}{}\n", label, value);
  };
  out += fmt::format("cxltier plan: {}, context {} tokens\n\n", m.name, Grouped(tokens));
  row("layers", std::to_string(m.layers));
  row("query heads", std::to_string(m.query_heads));
  row("KV heads", fmt::format("{} (GQA group {})", m.kv_heads, m.gqa_group()));
  row("head dim", std::to_string(m.head_dim));
  row("dtype bytes", std::to_string(m.dtype_bytes));
  row("score streams",
      fmt::format("{} ({} layers x {} KV heads)", Grouped(m.streams()), m.layers, m.kv_heads));
  row("bytes per token", BytesCell(m.bytes_per_token()));
  row("block tokens", std::to_string(m.block_tokens));
  row("block bytes", BytesCell(m.block_bytes()));
  row("blocks", Grouped(m.blocks_for(tokens)));
  row("KV bytes", BytesCell(m.kv_bytes(tokens)));
  row("state bytes", fmt::format("{}  ({} B x {} blocks)", BytesCell(m.state_bytes(tokens)),
                                 kStateBytes, Grouped(m.blocks_for(tokens))));
  row("state overhead", fmt::format("{:.4f}% of KV", m.state_overhead_percent(tokens)));
  out += fmt::format("\n  retracted design, one {}-byte entry per (stream, token), for contrast:\n",
                     kRetractedEntryBytes);
  row("tracking bytes", fmt::format("{}  {:.2f}% of KV", BytesCell(m.retracted_bytes(tokens)),
                                    m.retracted_overhead_percent(tokens)));
  if (m.state_bytes(tokens) > 0) {
    row("per-block state",
        fmt::format("{}x smaller",
                    m.retracted_bytes(tokens) / std::max<uint64_t>(1, m.state_bytes(tokens))));
  }
  return out;
}

nlohmann::json PerLayerJson(std::span<const ModelGeometry> models, uint64_t tokens) {
  nlohmann::json j;
  j["context_tokens"] = tokens;
  j["models"] = nlohmann::json::array();
  const ModelGeometry* smallest = nullptr;
  for (const ModelGeometry& m : models) {
    j["models"].push_back({
        {"model", std::string(m.name)},
        {"layers", m.layers},
        {"kv_heads", m.kv_heads},
        {"head_dim", m.head_dim},
        {"per_layer_kv_bytes", m.per_layer_kv_bytes(tokens)},
        {"mha_per_layer_kv_bytes", AsMha(m).per_layer_kv_bytes(tokens)},
        {"kv_bytes", m.per_layer_kv_bytes(tokens) * m.layers},
    });
    if (!smallest || m.per_layer_kv_bytes(tokens) < smallest->per_layer_kv_bytes(tokens)) {
      smallest = &m;
    }
  }
  if (smallest) j["smallest_per_layer"] = std::string(smallest->name);
  return j;
}

std::string PerLayerTable(std::span<const ModelGeometry> models, uint64_t tokens) {
  std::string out = fmt::format("per-layer KV cache at {} tokens\n\n", Grouped(tokens));
  out += fmt::format("  {:<16}{:>7}{:>9}{:>22}{:>22}{:>14}\n", "model", "layers", "KV heads",
                     "per layer (GQA)", "per layer (MHA)", "all layers");
  for (const ModelGeometry& m : models) {
    out += fmt::format("  {:<16}{:>7}{:>9}{:>22}{:>22}{:>14}\n", m.name, m.layers, m.kv_heads,
                       FormatBytes(m.per_layer_kv_bytes(tokens)),
                       FormatBytes(AsMha(m).per_layer_kv_bytes(tokens)),
                       FormatBytes(m.per_layer_kv_bytes(tokens) * m.layers));
  }
  const nlohmann::json j = PerLayerJson(models, tokens);
  if (j.contains("smallest_per_layer")) {
    out += fmt::format(
        "\n  smallest per-layer cache: {} (fewest KV heads x head dim); it fits the most tokens\n"
        "  per byte of fast memory, so a tier-0 budget holds the longest context with it.\n",
        j["smallest_per_layer"].get<std::string>());
  }
  return out;
}

}  // namespace cxltier::ctl
