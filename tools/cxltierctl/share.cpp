#include "share.h"

#include <fmt/format.h>

#include <algorithm>

#include "cxltier/model.h"

namespace cxltier::ctl {

namespace {

// "12.0 MiB" or "12.0 MiB/80.0 MiB" (capped).
std::string TierCell(const nlohmann::json& t) {
  std::string cell = FormatBytes(t.value("bytes", uint64_t{0}));
  if (t.contains("cap_bytes")) cell += "/" + FormatBytes(t["cap_bytes"].get<uint64_t>());
  return cell;
}

}  // namespace

std::string ShareTable(const nlohmann::json& quotas, uint64_t tier0_used_bytes,
                       const std::function<std::string(uint32_t)>& user_name) {
  if (!quotas.is_object()) return "";
  const nlohmann::json& users = quotas.value("users", nlohmann::json::array());
  const nlohmann::json& clients = quotas.value("clients", nlohmann::json::array());
  if (users.empty() && clients.empty()) return "";
  size_t tiers = 0;
  for (const auto* rows : {&users, &clients}) {
    for (const auto& r : *rows)
      tiers = std::max(tiers, r.value("tiers", nlohmann::json::array()).size());
  }
  std::string out = fmt::format("{:<28}", "user / client");
  for (size_t k = 0; k < tiers; ++k) out += fmt::format(" {:>21}", fmt::format("tier {}", k));
  out += fmt::format(" {:>7} {:>10} {:>9}\n", "share", "guarantee", "evicted");
  auto row = [&](const std::string& who, const nlohmann::json& r) {
    std::string line = fmt::format("{:<28}", who.size() > 28 ? fmt::format("{:.27}~", who) : who);
    const nlohmann::json& t = r.value("tiers", nlohmann::json::array());
    for (size_t k = 0; k < tiers; ++k) {
      line += fmt::format(" {:>21}", k < t.size() ? TierCell(t[k]) : "-");
    }
    const uint64_t t0 = t.empty() ? 0 : t[0].value("bytes", uint64_t{0});
    line += fmt::format(" {:>7}",
                        tier0_used_bytes
                            ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(t0) /
                                                         static_cast<double>(tier0_used_bytes))
                            : "-");
    line += fmt::format(" {:>10}", r.contains("guarantee_bytes") && r["guarantee_bytes"] != 0
                                       ? FormatBytes(r["guarantee_bytes"].get<uint64_t>())
                                       : "-");
    line += fmt::format(" {:>9}\n", r.value("quota_evictions", uint64_t{0}));
    return line;
  };
  for (const auto& u : users) {
    const uint32_t uid = u.value("uid", uint32_t{0});
    const std::string name = user_name ? user_name(uid) : "";
    out += row(name.empty() ? fmt::format("uid {}", uid) : fmt::format("{} ({})", name, uid), u);
  }
  for (const auto& c : clients) {
    out += row(
        fmt::format("client {} #{}", c.value("name", std::string()), c.value("id", uint64_t{0})),
        c);
  }
  return out;
}

}  // namespace cxltier::ctl
