// Each user's share of the tiers and its quota, as `cxltierctl status`, `top`
// and `quota` print them (from the "quotas" object of `Stats status`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <nlohmann/json.hpp>

namespace cxltier::ctl {

// One line per user, then one per client with a quota: its bytes in each
// tier ("USED/CAP" on a capped tier), its share of what tier 0 holds
// (`tier0_used_bytes`, from status's tiers), its guarantee and its quota
// evictions. `user_name` names a uid ("" when unknown: the uid alone).
// "" when there is no row.
std::string ShareTable(const nlohmann::json& quotas, uint64_t tier0_used_bytes,
                       const std::function<std::string(uint32_t)>& user_name);

}  // namespace cxltier::ctl
