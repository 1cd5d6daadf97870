// Quotas, the service's part (docs/operations.md, "Quotas"): which engine
// account has which quota, from the configuration and the connected clients,
// and what the quotas leave a new tier pool in copy mode. The engine enforces
// caps and guarantees on the blocks (engine::Engine::SetQuota); this part
// decides the accounts and bounds what copy mode hands out before a block
// exists.
//
// Accounts: a user's is its uid; a client's is shared by every connection of
// one uid that said hello with one name (ClientTable::Open). A client quota
// names its uid, and the uid's cap is on top (EffectiveUserQuotas): neither
// another connection nor another name gets around either.
//
// Copy mode: a tier pool is memory of that tier the client holds for as long
// as it is connected, and every block it admits there holds its write lease
// from the start. So the pool itself must respect the quotas: a tier pool
// of a capped tier holds no more than what the caps of the client's uid and
// client account leave after their other pools of that tier, and tier 0's
// pools leave room for every other uid's guarantee.
#pragma once

#include <cstdint>
#include <map>
#include <optional>

#include "cxltier/wire.h"
#include "engine/engine.h"
#include "service/client_table.h"
#include "service/config.h"

namespace cxltier::service {

class Quotas {
 public:
  // Sets `engine`'s quotas from `config` and the connected clients: every
  // account whose quota changed since the last call, an account no longer
  // named losing its quota; byte figures become the engine's blocks.
  void Apply(engine::Engine& engine, const DaemonConfig& config, const ClientTable& clients);
  // The engine was rebuilt: it has no quota yet.
  void Clear() { applied_.clear(); }
  // The quota applied to `account` (unlimited: none).
  engine::Quota Of(uint64_t account) const;

  // What a new tier pool of client `c` may hold (REQUIRES: m.tier is one of
  // `engine`'s tiers, and `c` has no pool of it yet).
  struct Grant {
    uint32_t blocks = 0;
    Status refusal;  // not ok: no block, or an import that does not fit whole
  };
  // A tier with a budget (every tier but the last): at most m.blocks, what
  // is left of the budget after every other client's pool of the tier and,
  // in tier 0, the room other uids' guarantees keep (each guarantee less
  // its uid's tier-0 pools), and what the caps of c's uid and client account
  // leave after their tier pools of that tier. The last tier: m.blocks (every
  // block must fit there; ClientTable::CheckTierPoolBytes bounds its bytes).
  Grant TierPool(const Client& c, const wire::CreateTierPool& m, const engine::Engine& engine,
                 const ClientTable& clients) const;

 private:
  std::map<uint64_t, engine::Quota> applied_;  // by account, as set in the engine
};

}  // namespace cxltier::service
