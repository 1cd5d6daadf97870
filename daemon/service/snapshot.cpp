// The daemon's side of status: reads its tables into the plain structs of
// status.h, once per request; status.cpp and metrics.cpp render them.
#include <algorithm>

#include "service/daemon.h"
#include "service/status.h"

namespace cxltier::service {

std::optional<nlohmann::json> Daemon::StatsJson(const std::string& what,
                                                std::optional<uid_t> only) const {
  if (what == "status") {
    StatusSnapshot s = Snapshot();
    if (only) s.quotas.KeepOnly(*only);
    return StatusToJson(s);
  }
  if (what == "quotas") {
    QuotaStatus q = QuotaStatuses();
    if (only) q.KeepOnly(*only);
    return QuotasToJson(q, engine_ ? engine_->options().block_bytes : 0);
  }
  if (what == "tiers") return TiersToJson(TierStatuses());
  if (what == "clients") return ClientsToJson(ClientStatuses(only));
  if (what == "blocks") return BlocksToJson(RankBlocks(only));
  return std::nullopt;
}

uint64_t Daemon::TierMemoryBytes(size_t tier) const {
  uint64_t bytes = 0;
  if (tier >= moves_.tiers().count()) return 0;
  for (int n : moves_.tiers().Nodes(tier)) {
    if (const numa::NumaNode* node = topology_.Find(n)) bytes += node->memory_bytes;
  }
  return bytes;
}

std::vector<uint64_t> Daemon::LowerTierBudgets() const {
  std::vector<uint64_t> out;
  const size_t tiers = moves_.tiers().count();
  for (size_t k = 1; k + 1 < tiers; ++k) {
    out.push_back(TierBudgetBytes(config_, k, tiers, TierMemoryBytes(k)));
  }
  return out;
}

std::vector<TierStatus> Daemon::TierStatuses() const {
  std::vector<TierStatus> out;
  const uint64_t bb = engine_ ? engine_->options().block_bytes : 0;
  const size_t tiers = std::max<size_t>(2, moves_.tiers().count());
  for (size_t t = 0; t < tiers; ++t) {
    TierStatus ts;
    ts.tier = static_cast<int>(t);
    static const std::vector<int> kNoNodes;
    for (int n : t < moves_.tiers().count() ? moves_.tiers().Nodes(t) : kNoNodes) {
      NodeStatus ns;
      ns.node = n;
      if (const numa::NumaNode* node = topology_.Find(n)) {
        ns.known = true;
        ns.memory_bytes = node->memory_bytes;
        ns.cpus = node->cpus.size();
        ns.read_latency_ns = node->read_latency_ns;
        ns.read_bandwidth_mib_s = node->read_bandwidth_mib_s;
        ns.kernel_memory_tier = node->kernel_memory_tier;
      }
      ts.nodes.push_back(ns);
    }
    ts.blocks = engine_ ? engine_->tier_blocks(static_cast<Tier>(t)) : 0;
    ts.used_bytes = ts.blocks * bb;
    ts.budget_bytes = TierBudgetBytes(config_, t, tiers, TierMemoryBytes(t));
    out.push_back(std::move(ts));
  }
  return out;
}

StatusSnapshot Daemon::Snapshot() const {
  const engine::EngineCounters c = engine_ ? engine_->counters() : engine::EngineCounters{};
  StatusSnapshot s;
  // Clients that left count their blocks and observations until they are released.
  for (const auto& [id, cl] : clients_.all()) {
    s.clients += cl.hello && !cl.leaving;
    s.blocks += cl.live;
    s.observations += cl.observations;
    s.bad_observations += cl.bad_observations;
  }
  s.connections = clients_.connections();
  s.ghosts = engine_ ? engine_->ghosts().size() : pending_ghosts_.size();
  s.ghosts_loaded_at_start = restored_from_checkpoint_;
  s.ghost_restores = c.ghost_restores;
  s.policy = config_.policy;
  s.persist = config_.persist;
  s.block_bytes = engine_ ? engine_->options().block_bytes : 0;
  s.per_uid_metrics = config_.metrics_per_uid;
  s.ticks = tick_;
  s.tick_ms = config_.tick_ms;
  s.lease_timeout_s = config_.lease_timeout_s;
  s.touches = c.touches;
  s.hits = c.hits;
  s.hints = HintStatus{.requests = hints_.requests(),
                       .unknown_keys = hints_.unknown_keys(),
                       .applied = c.hints,
                       .prefetched = c.hint_prefetched,
                       .displaced = c.hint_displaced,
                       .prefetch_hits = c.hint_prefetch_hits,
                       .units = hints_.units(),
                       .throttled = hints_.throttled(),
                       .work = c.hint_work,
                       .deferred = c.hint_deferred,
                       .max_units = hints_.max_units(),
                       .slice_units = engine_ ? engine_->options().hint_slice_units : 0,
                       .budget_units = hints_.limits().burst_units,
                       .budget_units_per_second = hints_.limits().units_per_second};
  s.warnings_logged = peer_log_.logged();
  s.warnings_suppressed = peer_log_.suppressed();
  if (server_counters_) s.server = server_counters_();
  s.tick_seconds = tick_seconds_.Summary();
  s.memory = ReadProcessMemory();
  s.metrics_endpoint = metrics_endpoint_;
  s.tiers = TierStatuses();
  s.quotas = QuotaStatuses();
  MigrationStatus& m = s.migrations;
  m.enabled = can_migrate_;
  m.promotions = c.promotions;
  m.demotions = c.demotions;
  m.promoted_bytes = c.promoted_bytes;
  m.demoted_bytes = c.demoted_bytes;
  m.pending = moves_.mover().pending();
  m.budget_bytes_per_tick = engine_ ? engine_->options().migrate_bytes_per_tick : 0;
  m.moves = moves_.stats();
  for (const auto& [id, cl] : clients_.all()) {
    m.places_draining += cl.copy.draining.size();
    for (const CopyState::Drain& d : cl.copy.draining) {
      if (!d.mover_reads)
        m.oldest_drain_ticks = std::max(m.oldest_drain_ticks, tick_ - d.since_tick);
    }
  }
  return s;
}

QuotaStatus Daemon::QuotaStatuses() const {
  QuotaStatus out;
  const size_t tiers = TierCount();
  const uint64_t bb = engine_ ? engine_->options().block_bytes : 0;
  std::map<uint32_t, AccountStatus> users;
  std::map<uint64_t, AccountStatus> clients;  // by account
  auto blank = [tiers](uint32_t uid) {
    AccountStatus a;
    a.uid = uid;
    a.tier_blocks.assign(tiers, 0);
    a.cap_blocks.assign(tiers, AccountStatus::kNoCapBlocks);
    return a;
  };
  auto set_quota = [&](AccountStatus& a, const engine::Quota& q) {
    a.has_quota = !q.Unlimited();
    for (size_t k = 0; k + 1 < tiers && k < q.cap.size(); ++k) {
      if (q.cap[k] != engine::kNoCap) a.cap_blocks[k] = q.cap[k];
    }
    a.guarantee_blocks = q.guarantee;
  };
  // Where every live block sits, by its user and (with a quota) its client:
  // one pass over the clients' slots.
  for (const auto& [session, c] : clients_.all()) {
    if (!engine_) break;
    AccountStatus* cl = nullptr;
    if (c.hello && !c.leaving && config_.ClientQuotaOf(c.peer.uid, c.name)) {
      // One row per uid and name: its connections share the account (the
      // first connection's id names it).
      auto [it, first] = clients.try_emplace(c.account, blank(c.peer.uid));
      cl = &it->second;
      if (first) cl->client_id = c.id;
      cl->client_name = c.name;
    }
    if (c.live == 0) continue;
    AccountStatus& u = users.try_emplace(c.peer.uid, blank(c.peer.uid)).first->second;
    for (const SegSlot& slot : c.slots) {
      if (!slot.live) continue;
      const unsigned t = TierIndex(engine_->state(slot.engine_slot).tier);
      if (t >= tiers) continue;
      ++u.tier_blocks[t];
      if (cl) ++cl->tier_blocks[t];
    }
  }
  // The quotas: as the engine enforces them, or, before there is an engine,
  // none in blocks yet (the users are listed with no blocks).
  for (const UserQuota& q : EffectiveUserQuotas(config_)) {
    AccountStatus& u = users.try_emplace(q.uid, blank(q.uid)).first->second;
    if (bb) set_quota(u, ToEngineQuota(q.quota, bb, true));
    u.has_quota = true;
  }
  if (engine_) {
    for (const engine::AccountUsage& a : engine_->Accounts()) {
      AccountStatus* row = nullptr;
      if (a.account & engine::kClientAccount) {
        auto it = clients.find(a.account);
        if (it != clients.end()) row = &it->second;
      } else if (a.account <= UINT32_MAX) {
        auto it = users.find(static_cast<uint32_t>(a.account));
        if (it != users.end()) row = &it->second;
      }
      if (!row) continue;  // a leaving client's, or a uid with no live block
      set_quota(*row, a.quota);
      row->in_set = a.in_set;
      row->quota_evictions = a.quota_evictions;
    }
    out.quota_evictions = engine_->counters().quota_evictions;
  }
  for (auto& [uid, a] : users) out.users.push_back(std::move(a));
  for (auto& [account, a] : clients) out.clients.push_back(std::move(a));
  std::sort(
      out.clients.begin(), out.clients.end(),
      [](const AccountStatus& a, const AccountStatus& b) { return a.client_id < b.client_id; });
  return out;
}

std::vector<ClientStatus> Daemon::ClientStatuses(std::optional<uid_t> only) const {
  std::vector<ClientStatus> out;
  for (const auto& [session, c] : clients_.all()) {
    if (!c.hello || c.leaving) continue;  // operator tools, clients connecting or gone
    if (only && c.peer.uid != *only) continue;
    out.push_back({c.id, c.name, c.peer.pid, c.peer.uid, c.live, c.slots.size(), c.pools.size(),
                   c.observations, c.bad_observations});
  }
  return out;
}

BlockRanking Daemon::RankBlocks(std::optional<uid_t> only) const {
  struct Ranked {
    double score;
    const Client* c;
    uint32_t seg;
  };
  std::vector<Ranked> ranked;
  for (const auto& [session, c] : clients_.all()) {
    if (only && c.peer.uid != *only) continue;
    for (uint32_t i = 0; i < c.slots.size(); ++i) {
      if (c.slots[i].live) ranked.push_back({engine_->state(c.slots[i].engine_slot).score, &c, i});
    }
  }
  std::sort(ranked.begin(), ranked.end(),
            [](const Ranked& a, const Ranked& b) { return a.score > b.score; });
  auto row = [this](const Ranked& r) {
    const SegSlot& s = r.c->slots[r.seg];
    const BlockState& st = engine_->state(s.engine_slot);
    return BlockRanking::Row{s.key.ToString(), r.c->id, r.seg, st.score, st.touch_count, st.tier};
  };
  BlockRanking out;
  out.blocks = ranked.size();
  for (size_t i = 0; i < ranked.size() && i < BlockRanking::kShown; ++i) {
    out.hottest.push_back(row(ranked[i]));
  }
  for (size_t i = 0; i < ranked.size() && i < BlockRanking::kShown; ++i) {
    out.coldest.push_back(row(ranked[ranked.size() - 1 - i]));
  }
  return out;
}

}  // namespace cxltier::service
