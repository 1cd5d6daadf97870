// The daemon's side of status: reads what the daemon shares into the plain
// structs of status.h, once per request (snapshot.cpp); status.cpp and
// metrics.cpp render them.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "service/shared.h"
#include "service/status.h"

namespace cxltier::service {

// Everything `Stats status` and the metrics report.
StatusSnapshot Snapshot(const Shared& d);
// The views of Stats: "status", "tiers", "clients", "blocks" or "quotas"
// (nullopt for another name). Clients, blocks and the users of status and
// quotas: every uid's (only = nullopt), or only `only`'s. `*slots_scanned`
// counts the clients' slots it looked at: "blocks" looks at every slot of
// the clients it shows, the others at none (their cost is per client, user
// and tier).
std::optional<nlohmann::json> StatsJson(const Shared& d, const std::string& what,
                                        std::optional<uid_t> only, uint64_t* slots_scanned);

}  // namespace cxltier::service
