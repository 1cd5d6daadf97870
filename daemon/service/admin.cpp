#include "service/admin.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

namespace cxltier::service {

bool IsAdmin(const server::Peer& peer, const std::string& admin_group) {
  if (peer.uid == 0) return true;
  if (admin_group.empty()) return false;
  std::vector<char> buf(16384);
  group gr{};
  group* g = nullptr;
  if (getgrnam_r(admin_group.c_str(), &gr, buf.data(), buf.size(), &g) != 0 || !g) {
    return false;
  }
  if (peer.gid == g->gr_gid) return true;
  // Supplementary groups of the peer's user, as the group database has them.
  passwd pw{};
  passwd* u = nullptr;
  std::vector<char> pbuf(16384);
  if (getpwuid_r(peer.uid, &pw, pbuf.data(), pbuf.size(), &u) != 0 || !u) return false;
  int n = 64;
  std::vector<gid_t> groups(static_cast<size_t>(n));
  if (getgrouplist(u->pw_name, u->pw_gid, groups.data(), &n) < 0) {
    groups.resize(static_cast<size_t>(n));
    if (getgrouplist(u->pw_name, u->pw_gid, groups.data(), &n) < 0) return false;
  }
  groups.resize(static_cast<size_t>(n));
  return std::find(groups.begin(), groups.end(), g->gr_gid) != groups.end();
}

}  // namespace cxltier::service
