// Who is an admin, and the admins' requests: show the configuration, set
// the policy, reload, set a quota (`cxltierctl record` is in recording.cpp).
#include "service/admin.h"

#include <grp.h>
#include <pwd.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "service/requests.h"

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

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

bool AdminCache::Is(const server::Peer& peer, const std::string& admin_group,
                    Clock::time_point now) {
  if (peer.uid == 0) return true;
  if (admin_group != group_) {
    entries_.clear();
    group_ = admin_group;
  }
  const uint64_t key = (uint64_t{peer.uid} << 32) | peer.gid;
  if (auto it = entries_.find(key); it != entries_.end() && now < it->second.until) {
    return it->second.admin;
  }
  if (entries_.size() >= max_entries_) {
    std::erase_if(entries_, [&](const auto& e) { return now >= e.second.until; });
    if (entries_.size() >= max_entries_) entries_.clear();
  }
  ++lookups_;
  const bool admin = lookup_(peer, admin_group);
  entries_[key] = Entry{admin, now + ttl_};
  return admin;
}

Result<wire::AdminOk> Requests::SetQuota(const std::string& arg) {
  QuotaTarget target;
  QuotaBytes quota;
  if (Status st = ParseQuotaArg(arg, &target, &quota); !st.ok()) return st;
  DaemonConfig next = d_.config;
  std::string who;
  if (target.user) {
    who = "uid " + std::to_string(target.uid);
    std::erase_if(next.user_quotas, [&](const UserQuota& u) { return u.uid == target.uid; });
    if (!quota.Unlimited()) next.user_quotas.push_back({target.uid, quota});
  } else {
    who = "client '" + target.client + "' of uid " + std::to_string(target.uid);
    std::erase_if(next.client_quotas, [&](const ClientQuota& q) {
      return q.uid == target.uid && q.name == target.client;
    });
    if (!quota.Unlimited()) next.client_quotas.push_back({target.uid, target.client, quota});
  }
  if (Status st = next.Validate(); !st.ok()) return st;
  if (Status st = CheckQuotaTiers(next, d_.TierCount()); !st.ok()) return st;
  d_.config.user_quotas = std::move(next.user_quotas);
  d_.config.client_quotas = std::move(next.client_quotas);
  d_.ApplyQuotas();
  std::string text = who + ": " + DescribeQuota(quota);
  if (d_.engine && !quota.Unlimited()) {
    const engine::Quota q = ToEngineQuota(quota, d_.engine->options().block_bytes, target.user);
    std::string blocks;
    for (size_t k = 0; k < quota.caps.size(); ++k) {
      if (quota.caps[k] != kNoCapBytes) {
        blocks += (blocks.empty() ? "" : ", ") +
                  fmt::format("tier {} {} blocks", k, static_cast<uint64_t>(q.cap[k]));
      }
    }
    if (q.guarantee) {
      blocks += (blocks.empty() ? "" : ", ") +
                fmt::format("guarantee {} blocks", static_cast<uint64_t>(q.guarantee));
    }
    if (!blocks.empty()) {
      text += fmt::format(" ({}, blocks of {}, rounded down)", blocks,
                          FormatBytes(d_.engine->options().block_bytes));
    }
  }
  if (!target.user) {
    uint64_t connected = 0;
    for (const auto& [session, c] : d_.clients.all()) {
      connected += c.hello && !c.leaving && c.peer.uid == target.uid && c.name == target.client;
    }
    text += fmt::format("; {} connected client(s) of that uid and name", connected);
    // The uid's cap on top: without a user quota, the sum of its client quotas'.
    if (!d_.config.UserQuotaOf(target.uid)) {
      std::string sum = "no quota";
      for (const UserQuota& u : EffectiveUserQuotas(d_.config)) {
        if (u.uid == target.uid) sum = DescribeQuota(u.quota);
      }
      text += fmt::format("; uid {} has no user quota, so its client quotas' sum caps it: {}",
                          target.uid, sum);
    }
  }
  text += "; until the next reload";
  spdlog::info("quota set: {}", text);
  return wire::AdminOk{text};
}

Result<wire::AdminOk> Requests::OnAdmin(const server::Peer& peer, const wire::Admin& m,
                                        server::UniqueFd* reply_fd) {
  if (m.op == wire::AdminOp::kShowConfig) {
    if (d_.IsAdmin(peer)) return wire::AdminOk{ToToml(d_.config)};
    // Anyone may read the configuration, but of the quotas only their own
    // uid's (its user quota and its client quotas), as status shows them:
    // who else has a quota is the admins' to see.
    DaemonConfig mine = d_.config;
    std::erase_if(mine.user_quotas, [&](const UserQuota& u) { return u.uid != peer.uid; });
    std::erase_if(mine.client_quotas, [&](const ClientQuota& q) { return q.uid != peer.uid; });
    const std::string admins = d_.config.admin_group.empty()
                                   ? "root sees"
                                   : "root and group '" + d_.config.admin_group + "' see";
    return wire::AdminOk{ToToml(mine) + fmt::format("# [quotas]: yours only (uid {}); {} every "
                                                    "user's and client's\n",
                                                    peer.uid, admins)};
  }
  const char* what = m.op == wire::AdminOp::kReload        ? "reload"
                     : m.op == wire::AdminOp::kSetPolicy   ? "policy set"
                     : m.op == wire::AdminOp::kRecordStart ? "record start"
                     : m.op == wire::AdminOp::kSetQuota    ? "quota set"
                                                           : "record stop";
  if (!d_.IsAdmin(peer)) {
    d_.ClientWarning(peer, fmt::format("denied {}: not root nor in group '{}' (gid {})", what,
                                       d_.config.admin_group, peer.gid));
    return Error{ErrorCode::kDenied, std::string(what) + " needs root or membership of group '" +
                                         d_.config.admin_group + "'"};
  }
  d_.ClientInfo(peer, fmt::format("{} requested by pid {} uid {}", what, peer.pid, peer.uid));
  if (m.op == wire::AdminOp::kSetPolicy) {
    if (Status st = d_.SetPolicy(m.arg); !st.ok()) return st;
    return wire::AdminOk{"policy " + m.arg};
  }
  if (m.op == wire::AdminOp::kRecordStart) return StartRecording(m.arg);
  if (m.op == wire::AdminOp::kRecordStop) return StopRecording(reply_fd);
  if (m.op == wire::AdminOp::kSetQuota) return SetQuota(m.arg);
  Status st;
  if (reload_hook_) {
    st = reload_hook_();
  } else {
    d_.Reload(d_.config);
  }
  if (!st.ok()) return st.Context("reload refused: ");
  return wire::AdminOk{"configuration reloaded"};
}

}  // namespace cxltier::service
