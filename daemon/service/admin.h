// Who may administer the daemon: change its policy, reload it, see every
// user's clients and blocks, and connect past the per-uid caps (into the
// connections kept for admins).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>

#include "server/server.h"

namespace cxltier::service {

// Root, or a member of `admin_group` (primary group or supplementary, as the
// group database has them). An empty or unknown group: root only. The
// databases are read on every call (the daemon asks through AdminCache).
bool IsAdmin(const server::Peer& peer, const std::string& admin_group);

// IsAdmin's answers, kept for a few seconds per (uid, gid). The daemon asks
// on every connect, hello, Stats and Admin request, on the I/O thread, and
// IsAdmin reads the group and user databases (three lookups), which with
// sssd or LDAP may leave the host: a client's loop of connects or Stats
// requests would make the I/O thread wait on them each time. With the cache
// it asks at most once per (uid, gid) per `ttl`, so a change to the group
// applies within `ttl` (5 s), and at once when admin_group itself changes
// (a reload). Root needs no lookup. At most `max_entries` peers are kept:
// a peer presents only its own uid and gid (SO_PEERCRED), so the entries
// are bounded by the host's users and groups anyway; past the bound the
// expired entries go, then all of them.
//
// Thread-safety: none; the I/O thread only.
class AdminCache {
 public:
  using Clock = std::chrono::steady_clock;
  using Lookup = std::function<bool(const server::Peer&, const std::string&)>;

  explicit AdminCache(Lookup lookup = IsAdmin, Clock::duration ttl = std::chrono::seconds(5),
                      size_t max_entries = 4096)
      : lookup_(std::move(lookup)), ttl_(ttl), max_entries_(max_entries) {}

  bool Is(const server::Peer& peer, const std::string& admin_group, Clock::time_point now);

  uint64_t lookups() const { return lookups_; }  // calls of the lookup so far
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    bool admin;
    Clock::time_point until;
  };
  Lookup lookup_;
  Clock::duration ttl_;
  size_t max_entries_;
  std::string group_;                            // the admin_group the entries answer for
  std::unordered_map<uint64_t, Entry> entries_;  // by uid << 32 | gid
  uint64_t lookups_ = 0;
};

}  // namespace cxltier::service
