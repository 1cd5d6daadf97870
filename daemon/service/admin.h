// Who may administer the daemon: change its policy, reload it, see every
// user's clients and blocks, and connect past the per-uid caps (into the
// connections kept for admins).
#pragma once

#include <string>

#include "server/server.h"

namespace cxltier::service {

// Root, or a member of `admin_group` (primary group or supplementary, as the
// group database has them). An empty or unknown group: root only. The
// databases are read on every call, so a change to the group applies to the
// next request.
bool IsAdmin(const server::Peer& peer, const std::string& admin_group);

}  // namespace cxltier::service
