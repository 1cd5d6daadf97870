// `cxltierctl plan`: what a model's KV cache and cxltier's block state cost.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include <nlohmann/json.hpp>

#include "cxltier/model.h"

namespace cxltier::ctl {

// One JSON object with the derived figures of `model` at `context_tokens`.
nlohmann::json PlanJson(const ModelGeometry& model, uint64_t context_tokens);
// The same figures as a readable table.
std::string PlanTable(const ModelGeometry& model, uint64_t context_tokens);

// Per-layer KV bytes at `context_tokens` for each model (the second seed's exercise),
// with the MHA figure (every query head with its own KV head) for contrast.
nlohmann::json PerLayerJson(std::span<const ModelGeometry> models, uint64_t context_tokens);
std::string PerLayerTable(std::span<const ModelGeometry> models, uint64_t context_tokens);

// 42949672960 -> "42,949,672,960".
std::string Grouped(uint64_t v);

}  // namespace cxltier::ctl
