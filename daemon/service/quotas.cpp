#include "service/quotas.h"

#include <algorithm>
#include <string>

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

void Quotas::Apply(engine::Engine& engine, const DaemonConfig& config, const ClientTable& clients) {
  const uint64_t bb = engine.options().block_bytes;
  std::map<uint64_t, engine::Quota> want;
  for (const UserQuota& u : EffectiveUserQuotas(config)) {
    want[u.uid] = ToEngineQuota(u.quota, bb, true);
  }
  for (const auto& [session, c] : clients.all()) {
    if (!c.hello || c.leaving) continue;
    if (const QuotaBytes* q = config.ClientQuotaOf(c.peer.uid, c.name)) {
      want[c.account] = ToEngineQuota(*q, bb, false);
    }
  }
  // An unlimited quota (a guarantee below one block, say) is no quota.
  std::erase_if(want, [](const auto& kv) { return kv.second.Unlimited(); });
  for (const auto& [account, quota] : applied_) {
    if (!want.count(account)) engine.SetQuota(account, engine::Quota{});
  }
  for (const auto& [account, quota] : want) {
    auto it = applied_.find(account);
    if (it == applied_.end() || it->second != quota) engine.SetQuota(account, quota);
  }
  applied_ = std::move(want);
}

engine::Quota Quotas::Of(uint64_t account) const {
  auto it = applied_.find(account);
  return it == applied_.end() ? engine::Quota{} : it->second;
}

Quotas::Grant Quotas::TierPool(const Client& c, const wire::CreateTierPool& m,
                               const engine::Engine& engine, const ClientTable& clients) const {
  Grant g;
  const unsigned k = m.tier;
  const std::string tier = std::to_string(k);
  if (k + 1u >= engine.tiers()) {
    g.blocks = m.blocks;  // the last tier holds every block
    return g;
  }
  // What binds, and why (the smallest bound wins; the first of equals).
  uint64_t bound = m.blocks;
  std::string why;
  auto bind = [&](uint64_t blocks, const std::string& reason) {
    if (blocks >= bound) return;
    bound = blocks;
    why = reason;
  };
  const uint64_t budget = engine.tier_capacity_blocks(k);
  const uint64_t given = clients.tier_pool_blocks(k);
  // Tier 0: room for every other uid's guarantee that its pools do not hold yet.
  uint64_t kept = 0;
  if (k == 0) {
    for (const auto& [account, q] : applied_) {
      if ((account & engine::kClientAccount) || account == c.peer.uid || q.guarantee == 0) continue;
      const uint64_t held = clients.UidTierPoolBlocks(static_cast<uid_t>(account), 0);
      if (held < q.guarantee) kept += q.guarantee - held;
    }
  }
  bind(budget > given + kept ? budget - given - kept : 0,
       "tier " + tier + "'s budget (" + std::to_string(budget) +
           " blocks) is already given to other clients' tier-" + tier + " pools (" +
           std::to_string(given) + " blocks)" +
           (kept ? " and kept for other users' guarantees (" + std::to_string(kept) + " blocks)"
                 : ""));
  // The caps of the client's uid and client account, over all their pools of the tier.
  const std::string uid = std::to_string(c.peer.uid);
  auto cap_room = [&](uint64_t account, uint64_t held, const std::string& whose) {
    const size_t cap = Of(account).cap[k];
    if (cap == engine::kNoCap) return;
    bind(cap > held ? cap - held : 0,
         whose + "'s tier-" + tier + " cap is " + std::to_string(cap) + " blocks" +
             (held ? " and its tier-" + tier + " pools hold " + std::to_string(held) + " already"
                   : ""));
  };
  cap_room(c.peer.uid, clients.UidTierPoolBlocks(c.peer.uid, k), "uid " + uid);
  cap_room(c.account, clients.AccountTierPoolBlocks(c.account, k),
           "client '" + c.name + "' of uid " + uid);
  g.blocks = static_cast<uint32_t>(bound);
  if (g.blocks == 0) {
    g.refusal = Error{ErrorCode::kLimit, "no tier-" + tier + " pool: " + why +
                                             " (blocks go to the pools of the other tiers)"};
  } else if (m.source == wire::TierPoolSource::kImport && g.blocks < m.blocks) {
    // An import is held to what a new pool would get: any local user can
    // make a memfd of the right name and seals.
    g.refusal = Error{ErrorCode::kLimit, "the imported tier-" + tier + " pool holds " +
                                             std::to_string(m.blocks) + " blocks and only " +
                                             std::to_string(g.blocks) + " fit: " + why};
  }
  return g;
}

}  // namespace cxltier::service
