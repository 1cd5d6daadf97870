// The daemon's side of status: reads its tables into the plain structs of
// status.h, once per request; status.cpp and metrics.cpp render them.
#include <algorithm>

#include "service/snapshot.h"

#include "engine/policy.h"

namespace cxltier::service {

namespace {

std::vector<TierStatus> TierStatuses(const Shared& d) {
  std::vector<TierStatus> out;
  const uint64_t bb = d.engine ? d.engine->options().block_bytes : 0;
  const size_t tiers = std::max<size_t>(2, d.moves.tiers().count());
  for (size_t t = 0; t < tiers; ++t) {
    TierStatus ts;
    ts.tier = static_cast<int>(t);
    static const std::vector<int> kNoNodes;
    for (int n : t < d.moves.tiers().count() ? d.moves.tiers().Nodes(t) : kNoNodes) {
      NodeStatus ns;
      ns.node = n;
      if (const numa::NumaNode* node = d.topology.Find(n)) {
        ns.known = true;
        ns.memory_bytes = node->memory_bytes;
        ns.cpus = node->cpus.size();
        ns.read_latency_ns = node->read_latency_ns;
        ns.read_bandwidth_mib_s = node->read_bandwidth_mib_s;
        ns.kernel_memory_tier = node->kernel_memory_tier;
      }
      ts.nodes.push_back(ns);
    }
    ts.blocks = d.engine ? d.engine->tier_blocks(static_cast<Tier>(t)) : 0;
    ts.used_bytes = ts.blocks * bb;
    ts.budget_bytes = TierBudgetBytes(d.config, t, tiers, d.TierMemoryBytes(t));
    out.push_back(std::move(ts));
  }
  return out;
}

QuotaStatus QuotaStatuses(const Shared& d) {
  QuotaStatus out;
  const size_t tiers = d.TierCount();
  const uint64_t bb = d.engine ? d.engine->options().block_bytes : 0;
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
  // Where every live block sits, by its user (the engine keeps the counts
  // by owner, the uid) and, with a quota, its client (the engine's account
  // for it, below): no pass over the blocks, so a status costs the same
  // however many blocks the clients hold (a pass over every slot of every
  // client was 5 to 9 ms at a million, for any peer's status).
  for (const auto& [session, c] : d.clients.all()) {
    if (!d.engine) break;
    if (c.hello && !c.leaving && d.config.ClientQuotaOf(c.peer.uid, c.name)) {
      // One row per uid and name: its connections share the account (the
      // first connection's id names it).
      auto [it, first] = clients.try_emplace(c.account, blank(c.peer.uid));
      if (first) it->second.client_id = c.id;
      it->second.client_name = c.name;
    }
    if (c.live == 0) continue;
    auto [it, first] = users.try_emplace(c.peer.uid, blank(c.peer.uid));
    if (!first) continue;
    const std::array<size_t, kMaxTiers> n = d.engine->TierBlocksOf(c.peer.uid);
    for (unsigned t = 0; t < tiers && t < kMaxTiers; ++t) it->second.tier_blocks[t] = n[t];
  }
  // The quotas: as the engine enforces them, or, before there is an engine,
  // none in blocks yet (the users are listed with no blocks).
  for (const UserQuota& q : EffectiveUserQuotas(d.config)) {
    AccountStatus& u = users.try_emplace(q.uid, blank(q.uid)).first->second;
    if (bb) set_quota(u, ToEngineQuota(q.quota, bb, true));
    u.has_quota = true;
  }
  if (d.engine) {
    for (const engine::AccountUsage& a : d.engine->Accounts()) {
      AccountStatus* row = nullptr;
      if (a.account & engine::kClientAccount) {
        auto it = clients.find(a.account);
        if (it != clients.end()) row = &it->second;
      } else if (a.account <= UINT32_MAX) {
        auto it = users.find(static_cast<uint32_t>(a.account));
        if (it != users.end()) row = &it->second;
      }
      if (!row) continue;  // a leaving client's, or a uid with no live block
      if (a.account & engine::kClientAccount) {
        for (unsigned t = 0; t < tiers && t < kMaxTiers; ++t)
          row->tier_blocks[t] = a.tier_blocks[t];
      }
      set_quota(*row, a.quota);
      row->in_set = a.in_set;
      row->quota_evictions = a.quota_evictions;
    }
    out.quota_evictions = d.engine->counters().quota_evictions;
  }
  // Released blocks' pages in tier 0 charged to each row's cap.
  for (auto& [uid, a] : users) a.held_blocks = d.moves.ReleasedHeldOf(uid);
  for (auto& [account, a] : clients) a.held_blocks = d.moves.ReleasedHeldOf(account);
  for (auto& [uid, a] : users) out.users.push_back(std::move(a));
  for (auto& [account, a] : clients) out.clients.push_back(std::move(a));
  std::sort(
      out.clients.begin(), out.clients.end(),
      [](const AccountStatus& a, const AccountStatus& b) { return a.client_id < b.client_id; });
  return out;
}

std::vector<ClientStatus> ClientStatuses(const Shared& d, std::optional<uid_t> only) {
  std::vector<ClientStatus> out;
  for (const auto& [session, c] : d.clients.all()) {
    if (!c.hello || c.leaving) continue;  // operator tools, clients connecting or gone
    if (only && c.peer.uid != *only) continue;
    out.push_back({c.id, c.name, c.peer.pid, c.peer.uid, c.live, c.slots.size(), c.pools.size(),
                   c.observations, c.bad_observations});
  }
  return out;
}

// The hottest and coldest BlockRanking::kShown of the live blocks `only` may
// see, kept in two bounded heaps as the slots go by: one pass, no sort of
// them all. Ties go to the lower client id, then slot, so the answer does
// not depend on the order clients are walked in. `*scanned` counts the
// slots looked at: what the request cost.
BlockRanking RankBlocks(const Shared& d, std::optional<uid_t> only, uint64_t* scanned) {
  struct Ranked {
    double score;
    uint64_t client;
    uint32_t seg;
    const Client* c;
  };
  const auto hotter = [](const Ranked& a, const Ranked& b) {
    if (a.score != b.score) return a.score > b.score;
    return a.client != b.client ? a.client < b.client : a.seg < b.seg;
  };
  const auto colder = [&hotter](const Ranked& a, const Ranked& b) { return hotter(b, a); };
  // `hot`'s top is the coldest it keeps, `cold`'s the hottest.
  std::vector<Ranked> hot, cold;
  constexpr size_t kShown = BlockRanking::kShown;
  const auto keep = [](std::vector<Ranked>& heap, const Ranked& r, const auto& before) {
    if (heap.size() < kShown) {
      heap.push_back(r);
      std::push_heap(heap.begin(), heap.end(), before);
    } else if (before(r, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), before);
      heap.back() = r;
      std::push_heap(heap.begin(), heap.end(), before);
    }
  };
  BlockRanking out;
  *scanned = 0;
  for (const auto& [session, c] : d.clients.all()) {
    if (only && c.peer.uid != *only) continue;
    *scanned += c.slots.size();
    for (uint32_t i = 0; i < c.slots.size(); ++i) {
      if (!c.slots[i].live) continue;
      const Ranked r{d.engine->state(c.slots[i].engine_slot).score, c.id, i, &c};
      ++out.blocks;
      keep(hot, r, hotter);
      keep(cold, r, colder);
    }
  }
  std::sort_heap(hot.begin(), hot.end(), hotter);    // hottest first
  std::sort_heap(cold.begin(), cold.end(), colder);  // coldest first
  auto row = [&d](const Ranked& r) {
    const SegSlot& s = r.c->slots[r.seg];
    const BlockState& st = d.engine->state(s.engine_slot);
    return BlockRanking::Row{s.key.ToString(), r.c->id, r.seg, st.score, st.touch_count, st.tier};
  };
  for (const Ranked& r : hot) out.hottest.push_back(row(r));
  for (const Ranked& r : cold) out.coldest.push_back(row(r));
  return out;
}

}  // namespace

StatusSnapshot Snapshot(const Shared& d) {
  const engine::EngineCounters c = d.engine ? d.engine->counters() : engine::EngineCounters{};
  StatusSnapshot s;
  // Clients that left count their blocks and observations until they are released.
  for (const auto& [id, cl] : d.clients.all()) {
    s.clients += cl.hello && !cl.leaving;
    s.leaving += cl.leaving;
    s.blocks += cl.live;
    s.observations += cl.observations;
    s.bad_observations += cl.bad_observations;
  }
  s.connections = d.clients.connections();
  s.ghosts = d.engine ? d.engine->ghosts().size() : d.pending_ghosts.states.size();
  s.ghosts_loaded_at_start = d.restored_from_checkpoint;
  s.ghost_restores = c.ghost_restores;
  s.policy = d.config.policy;
  if (d.engine) {
    if (const auto v = engine::ViewShards(d.engine->policy())) {
      s.shards =
          ShardsStatus{v->leader_name, v->switches, v->rate, v->sampled_touches, v->sampled_keys};
    }
  }
  s.persist = d.config.persist;
  s.block_bytes = d.engine ? d.engine->options().block_bytes : 0;
  s.per_uid_metrics = d.config.metrics_per_uid;
  s.ticks = d.tick;
  s.tick_ms = d.config.tick_ms;
  s.lease_timeout_s = d.config.lease_timeout_s;
  s.touches = c.touches;
  s.hits = c.hits;
  s.hints = HintStatus{.requests = d.hints.requests(),
                       .unknown_keys = d.hints.unknown_keys(),
                       .applied = c.hints,
                       .prefetched = c.hint_prefetched,
                       .displaced = c.hint_displaced,
                       .prefetch_hits = c.hint_prefetch_hits,
                       .units = d.hints.units(),
                       .throttled = d.budgets.throttled(),
                       .work = c.hint_work,
                       .deferred = c.hint_deferred,
                       .max_units = d.hints.max_units(),
                       .slice_units = d.engine ? d.engine->options().hint_slice_units : 0,
                       .budget_units = d.budgets.limits().burst_units,
                       .budget_units_per_second = d.budgets.limits().units_per_second};
  s.warnings_logged = d.peer_log.logged();
  s.warnings_suppressed = d.peer_log.suppressed();
  if (d.server_counters) s.server = d.server_counters();
  s.tick_seconds = d.tick_seconds.Summary();
  s.memory = ReadProcessMemory();
  s.metrics_endpoint = d.metrics_endpoint;
  s.tiers = TierStatuses(d);
  s.quotas = QuotaStatuses(d);
  MigrationStatus& m = s.migrations;
  m.enabled = d.can_migrate;
  m.promotions = c.promotions;
  m.demotions = c.demotions;
  m.promoted_bytes = c.promoted_bytes;
  m.demoted_bytes = c.demoted_bytes;
  m.pending = d.moves.mover().pending();
  m.budget_bytes_per_tick = d.engine ? d.engine->options().migrate_bytes_per_tick : 0;
  m.max_budget_bytes_per_tick =
      d.engine ? PlanCapBytes(d.config, d.engine->options().block_bytes) : 0;
  m.moves = d.moves.stats();
  for (const auto& [id, cl] : d.clients.all()) {
    m.places_draining += cl.copy.draining.size();
    for (const CopyState::Drain& drain : cl.copy.draining) {
      if (!drain.mover_reads)
        m.oldest_drain_ticks = std::max(m.oldest_drain_ticks, d.tick - drain.since_tick);
    }
  }
  return s;
}

std::optional<nlohmann::json> StatsJson(const Shared& d, const std::string& what,
                                        std::optional<uid_t> only, uint64_t* slots_scanned) {
  *slots_scanned = 0;
  if (what == "status") {
    StatusSnapshot s = Snapshot(d);
    if (only) s.quotas.KeepOnly(*only);
    return StatusToJson(s);
  }
  if (what == "quotas") {
    QuotaStatus q = QuotaStatuses(d);
    if (only) q.KeepOnly(*only);
    return QuotasToJson(q, d.engine ? d.engine->options().block_bytes : 0);
  }
  if (what == "tiers") return TiersToJson(TierStatuses(d));
  if (what == "clients") return ClientsToJson(ClientStatuses(d, only));
  if (what == "blocks") return BlocksToJson(RankBlocks(d, only, slots_scanned));
  return std::nullopt;
}

}  // namespace cxltier::service
