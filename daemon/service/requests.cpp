#include "service/requests.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "cxltier/segment.h"
#include "service/admin.h"
#include "service/copy_mode.h"
#include "service/snapshot.h"

namespace cxltier::service {

namespace asio = boost::asio;
using wire::Error;
using wire::ErrorCode;

namespace {

// Slots of a client that left released in one go on the I/O thread.
constexpr uint32_t kReleaseChunk = 1024;
// Cost units (about 11 ns each, service/cost_budget.h) per slot a `Stats
// blocks` looks at: BM_StatsBlocks (cxltier-bench) took 22 ns a slot at 64K
// and at 1M blocks (docs/protocol.md, "Stats").
constexpr uint64_t kStatsUnitsPerSlot = 2;
// Cost units per slot a Hello asks for: a fraction of what it costs (7 to
// 14 units a slot), so that a client of a million slots waits about 2 s
// after its hello, once, and a loop of such hellos gets one every 2 s.
constexpr uint64_t kHelloUnitsPerSlot = 2;
// Cost units per ghost a hello's new block size carries into a new engine
// (no client connected, no [engine] block_bytes): about 100 ns a ghost
// (BM_BlockSizeChange: 80 ns at 64K ghosts, 103 ns at 262K), charged in
// part as a hello's slots are: a loop of hellos alternating two sizes over
// a million ghosts gets one every 4 s.
constexpr uint64_t kRebuildUnitsPerGhost = 4;

}  // namespace

Client* Requests::Said(const server::Peer& peer) {
  Client* c = d_.clients.Find(peer.session_id);
  return c && c->hello ? c : nullptr;
}

void Requests::Charge(const server::Peer& peer, uint64_t units) {
  if (!d_.IsAdmin(peer)) d_.budgets.Spend(peer.uid, units, CostClock::now());
}

Status Requests::OnConnect(const server::Peer& peer) {
  if (Status refusal = d_.clients.CheckConnect(peer, d_.IsAdmin(peer), d_.config); !refusal.ok()) {
    d_.ClientWarning(peer, "connection refused: " + refusal.message);
    return refusal;
  }
  const Client& c = d_.clients.Connect(peer);
  spdlog::debug("client {} connected: pid {} uid {}", c.id, peer.pid, peer.uid);
  return Status::Ok();
}

void Requests::OnDisconnect(const server::Peer& peer) {
  Client* c = d_.clients.Find(peer.session_id);
  if (!c || c->leaving) return;
  d_.clients.MarkLeaving(*c);
  // Its released blocks' pages are its own again (its blocks keep their places).
  if (d_.engine) d_.moves.ForgetReleased(*d_.engine, peer.session_id);
  // Operator tools (status, top) say no hello: their comings and goings are
  // not news.
  if (c->hello) {
    d_.ClientInfo(peer,
                  fmt::format("client {} ('{}', pid {} uid {}) left; its {} blocks become ghosts",
                              c->id, c->name, peer.pid, peer.uid, c->live));
  }
  // Its client account loses its quota when it was the last connection of
  // its uid and name; the engine forgets it once its blocks are released.
  if (d_.config.ClientQuotaOf(peer.uid, c->name)) d_.ApplyQuotas();
  ReleaseLeaving(peer.session_id);
}

bool Requests::ReleaseChunk(Client& c, uint32_t* cursor, uint32_t pool, uint64_t* released) {
  for (uint32_t n = 0; *cursor < c.slots.size() && n < kReleaseChunk; ++n) {
    const uint32_t i = (*cursor)++;
    if (!c.slots[i].live || (pool != kAnyPool && c.slots[i].pool != pool)) continue;
    d_.ReleaseSlot(c, i);
    ++*released;
  }
  return *cursor == c.slots.size();
}

// A client that left is released kReleaseChunk slots at a time, the I/O
// thread serving other requests in between: a million blocks take seconds.
void Requests::ReleaseLeaving(uint64_t session) {
  Client* leaving = d_.clients.Find(session);
  if (!leaving) return;
  uint64_t released = 0;
  if (!ReleaseChunk(*leaving, &leaving->release_cursor, kAnyPool, &released)) {
    asio::post(d_.io, [this, session] { ReleaseLeaving(session); });
    return;
  }
  d_.clients.Remove(session);
}

void Requests::ReleaseDeadPool(uint64_t session, uint32_t pool, uint32_t from, uint64_t released) {
  Client* c = d_.clients.Find(session);
  if (!c || c->leaving) return;  // ReleaseLeaving releases every slot
  uint32_t i = from;
  if (!ReleaseChunk(*c, &i, pool, &released)) {
    asio::post(d_.io,
               [this, session, pool, i, released] { ReleaseDeadPool(session, pool, i, released); });
    return;
  }
  d_.ClientWarning(c->peer, fmt::format("client {}: the process that registered pool {} has "
                                        "exited; pool dropped, its {} blocks became ghosts",
                                        c->id, pool, released));
}

Result<wire::HelloOk> Requests::OnHello(const server::Peer& peer, const wire::Hello& m,
                                        int* segment_fd) {
  Client* c = d_.clients.Find(peer.session_id);
  if (!c) return Error{ErrorCode::kInternal, "unknown session"};
  if (c->hello) return Error{ErrorCode::kNotReady, "hello was already said on this connection"};
  if (Status st = d_.clients.CheckHello(*c, m, d_.config); !st.ok()) return st;
  uint64_t rebuilt = 0;
  if (Status st = d_.EnsureEngine(m.model.block_bytes(), &rebuilt); !st.ok()) return st;
  Charge(peer, rebuilt * kRebuildUnitsPerGhost);
  if (Status st = d_.clients.Open(*c, m.max_blocks, m.client_name.substr(0, 64)); !st.ok()) {
    return st;
  }
  // The daemon's tick from the first byte the client sees, not 0 until the
  // next tick: a client counting ticks from its hello (a lease's age, a
  // wait for n ticks) would see them jump by the daemon's whole age.
  c->segment.header()->daemon_ticks = d_.tick;
  c->model = m.model;
  // The engine's tables get room for every slot this client may fill now,
  // at its hello, instead of being copied in the middle of its admits
  // (other clients' requests wait behind a copy of a million-slot table).
  d_.engine->Reserve(d_.engine->live_blocks() + m.max_blocks);
  // Its segment and tables are written whole (BM_Hello: 72 ns a slot, 75 ms
  // for a million; 137 to 208 ms in a running daemon), so the slots it
  // asked for are charged to its uid, as hints are: a loop of large hellos
  // costs its sender its own latency (docs/protocol.md, "Hello"). Not root's
  // or the admin group's: a root engine's hello does not hold up the
  // operator's tools.
  Charge(peer, 1 + m.max_blocks * kHelloUnitsPerSlot);
  if (d_.config.ClientQuotaOf(peer.uid, c->name)) d_.ApplyQuotas();
  *segment_fd = c->segment.fd();
  d_.ClientInfo(peer,
                fmt::format("client {} hello: '{}' pid {} uid {}, {} slots, block {} bytes", c->id,
                            c->name, peer.pid, peer.uid, m.max_blocks, m.model.block_bytes()));
  return wire::HelloOk{c->id,
                       m.max_blocks,
                       kSegmentSlotOffset,
                       m.model.block_bytes(),
                       d_.config.tick_ms,
                       d_.engine->tiers()};
}

Result<wire::RegisterPoolOk> Requests::OnRegisterPool(const server::Peer& peer,
                                                      const wire::RegisterPool& m,
                                                      server::UniqueFd memfd) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  if (Status st = d_.clients.CheckPool(*c, d_.config); !st.ok()) return st;
  if (m.kind == wire::PoolKind::kMemfd) {
    // By default the host's memory, and at least 1 TiB: a sparse pool
    // larger than the memory is legitimate; the bound is for the address
    // space (47 bits: 128 TiB), which 64 connections' uids at 1 TiB leave.
    const uint64_t limit = d_.config.max_pool_bytes_per_uid
                               ? d_.config.max_pool_bytes_per_uid
                               : std::max(d_.HostMemoryBytes(), uint64_t{1} << 40);
    if (Status st = d_.clients.CheckPoolBytes(*c, uint64_t{m.blocks} * m.stride, limit); !st.ok()) {
      d_.ClientWarning(peer, "pool refused: " + st.message);
      return st;
    }
  }
  server::Pool pool;
  if (Status st =
          pool.Open(m, std::move(memfd), peer.pid, peer.uid, d_.engine->options().block_bytes);
      !st.ok()) {
    d_.ClientWarning(peer, "pool refused: " + st.message);
    return st;
  }
  // A pool's new pages land in the last tier (which always has room): a
  // memfd's shared policy, set through our mapping; an address range's,
  // which the client library sets from our answer. A block admitted before
  // its pages exist is then placed by the engine, in tier 0 while that has
  // room under its budget, and its range steered there (OnAdmit); a block
  // written before its admission is admitted in the last tier, and only the
  // planner puts it in tier 0 (docs/operations.md). Each move of a memfd
  // block sets its range's policy to its target (numa::MakeLinuxMigrator),
  // so a promoted block keeps faulting in tier 0; a range block's pages stay
  // where moved, and a page faulted later goes by the client's policy. Not
  // without page moves: no block could ever leave the last tier.
  std::string steered;
  wire::RegisterPoolOk ok;
  const numa::TierAssignment& tiers = d_.moves.tiers();
  const std::vector<int>& last = tiers.Nodes(tiers.count() - 1);
  if (m.kind == wire::PoolKind::kRange && d_.can_migrate) {
    for (unsigned t = 0; t < tiers.count() && t < ok.tier_nodes.size(); ++t) {
      for (int n : tiers.Nodes(t)) {
        if (n >= 0 && n < 64) ok.tier_nodes[t] |= uint64_t{1} << n;
      }
    }
    if (ok.tier_nodes[tiers.count() - 1] != 0) {
      pool.set_new_pages_tier(static_cast<int>(tiers.count() - 1));
      steered = fmt::format(", new pages asked on tier {}", tiers.count() - 1);
    } else {
      ok.tier_nodes = {};  // nodes past 63: the client cannot steer them
    }
  }
  if (m.kind == wire::PoolKind::kMemfd && d_.can_migrate) {
    if (Status st = numa::PreferNodes(*pool.mapping(), last); st.ok()) {
      pool.set_new_pages_tier(static_cast<int>(tiers.count() - 1));
      steered = fmt::format(", new pages on tier {} (nodes", tiers.count() - 1);
      for (int n : last) steered += fmt::format(" {}", n);
      steered += ")";
    } else {
      d_.ClientWarning(peer,
                       "memfd pool: its new pages cannot be steered to the last tier, so "
                       "they land where the client faults them and tier 0 may hold more "
                       "than its budget until the planner demotes: " +
                           st.message);
    }
  }
  ok.pool_id = d_.clients.AddPool(*c, std::move(pool));
  d_.ClientInfo(
      peer, fmt::format("client {} (uid {}): pool {} ({}, {} blocks, {}{})", c->id, peer.uid,
                        ok.pool_id, m.kind == wire::PoolKind::kMemfd ? "memfd" : "address range",
                        m.blocks, FormatBytes(m.length), steered));
  return ok;
}

Result<wire::CreateTierPoolOk> Requests::OnCreateTierPool(const server::Peer& peer,
                                                          const wire::CreateTierPool& m,
                                                          server::UniqueFd fd, int* pool_fd) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  if (Status st = d_.clients.CheckPool(*c, d_.config); !st.ok()) return st;
  if (Status refusal = d_.clients.CheckTierPool(*c, m, *d_.engine, d_.moves.tiers());
      !refusal.ok()) {
    d_.ClientWarning(peer, "tier pool refused: " + refusal.message);
    return refusal;
  }
  // What the budget, the caps and other users' guarantees leave it (a tier
  // with a budget counts it in blocks), and for the last tier the bytes of
  // its pools one uid may have the daemon make: the memory of its nodes.
  const Quotas::Grant grant = d_.quotas.TierPool(*c, m, *d_.engine, d_.clients);
  const bool last = m.tier + 1u >= d_.engine->tiers();
  const ClientTable::TierBound bound{
      last ? d_.TierMemoryBytes(m.tier) : 0,
      "the memory of tier " + std::to_string(m.tier) + "'s nodes (the last tier's budget)"};
  Status refusal = grant.refusal;
  if (refusal.ok()) refusal = d_.clients.CheckTierPoolBytes(*c, m, grant.blocks, bound, d_.config);
  if (!refusal.ok()) {
    d_.ClientWarning(peer, "tier pool refused: " + refusal.message);
    return refusal;
  }
  if (m.source == wire::TierPoolSource::kImport && fd.valid() &&
      d_.clients.TierMemoryInUse(fd.get())) {
    // Its old connection is still releasing its blocks (or a copy of it still
    // runs), or it is another connection's pool: two owners would hand out
    // the same places.
    return Error{ErrorCode::kBusy,
                 "this tier pool is still in use by the connection it came from (its blocks are "
                 "being released, or a copy is running); try again"};
  }
  const uint32_t blocks = grant.blocks;
  static const std::vector<int> kNoNodes;
  const std::vector<int>& nodes =
      m.tier < d_.moves.tiers().count() ? d_.moves.tiers().Nodes(m.tier) : kNoNodes;
  server::Pool pool;
  if (Status st = pool.OpenTier(m.tier, blocks, m.stride, d_.engine->options().block_bytes, nodes,
                                m.source, std::move(fd), m.offset);
      !st.ok()) {
    d_.ClientWarning(peer, "tier pool refused: " + st.message);
    return st;
  }
  if (pool.devdax_region().device != 0) {
    // Mapped, nothing written: if refused, the mapping goes with `pool`.
    if (Status st = d_.devdax.Claim(pool.devdax_region(), peer, pool.mapping()); !st.ok()) {
      return st;
    }
  }
  const uint32_t id = d_.clients.AddTierPool(*c, std::move(pool));
  const server::Pool& p = c->pools[id];
  *pool_fd = p.tier_fd();
  static constexpr const char* kSources[] = {"memfd", "device-DAX", "imported memfd"};
  d_.ClientInfo(
      peer,
      fmt::format("client {} (uid {}): tier {} pool {} ({}, {} blocks of {} asked, {}, node {})",
                  c->id, peer.uid, int{m.tier}, id, kSources[static_cast<int>(m.source)], blocks,
                  m.blocks, FormatBytes(p.length()), p.node()));
  return wire::CreateTierPoolOk{id, blocks, p.length(), p.node()};
}

Result<wire::AdmitOk> Requests::OnAdmit(const server::Peer& peer, const wire::Admit& m) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  const auto copy_room = [&](uint64_t fresh) { return CheckCopyRoom(*c, fresh, *d_.engine); };
  if (Status st = d_.clients.CheckAdmit(*c, m, *d_.engine, d_.config, copy_room); !st.ok()) {
    return st;
  }
  if (c->pools[m.pool_id].is_tier()) return AdmitCopy(*c, m);
  wire::AdmitOk ok;
  ok.results.reserve(m.entries.size());
  for (const wire::AdmitEntry& e : m.entries) {
    if (const uint32_t held = c->by_key.Find(e.key); held != engine::kNoSlot) {
      const BlockState& st = d_.engine->state(c->slots[held].engine_slot);
      ok.results.push_back({held, st.tier, 0});
      continue;
    }
    bool chosen = false;
    const engine::Slot es = AdmitPage(*c, m.pool_id, e, &chosen);
    const Tier where = d_.engine->state(es).tier;
    d_.recorder.Admit(d_.EventTick(), peer.uid, d_.engine->state(es).key, where, chosen);
    const uint32_t seg = d_.clients.Bind(*c, es, m.pool_id, e.block_index, e.key);
    WriteBack(*d_.engine, *c, seg);
    const bool restored = d_.engine->state(es).flags & kFlagRestored;
    spdlog::debug("client {} admitted {} in pool {} block {} as slot {} ({})", c->id,
                  e.key.ToString(), m.pool_id, e.block_index, seg, TierName(where));
    ok.results.push_back({seg, where, static_cast<uint8_t>(restored)});
  }
  return ok;
}

// Page mode: a block whose pages exist is admitted where they are (tier 0
// may then hold more than its budget: the planner demotes the excess first).
// One with no page yet, in a pool whose new pages are steered, the engine
// places (tier 0 while it has room under its budget and the uid's caps,
// counting the promotions in flight), and its pages are steered there before
// the client writes them: a memfd's range by us, an address range's by the
// client library from our answer's tier. Costs a few system calls per entry.
engine::Slot Requests::AdmitPage(Client& c, uint32_t pool_id, const wire::AdmitEntry& e,
                                 bool* chosen) {
  const server::Pool& pool = c.pools[pool_id];
  const numa::PageRange range = pool.Range(e.block_index);
  const Tier steered = MoveDispatch::NewPagesTier(pool);
  const BlockKey key = d_.clients.EngineKey(e.key, c.peer.uid);
  // Pages a released block left in tier 0 count as this block's from now.
  d_.moves.Reusing(*d_.engine, c, pool_id, e.block_index);
  if (const Tier found = d_.moves.WhereIs(range, steered); found != Tier::kNone) {
    return d_.engine->Admit(key, found, c.peer.uid, c.account);
  }
  if (pool.new_pages_tier() < 0) {  // not steered: first touch, by the client's CPUs
    return d_.engine->Admit(key, steered, c.peer.uid, c.account);
  }
  const engine::Slot es = d_.engine->Admit(key, c.peer.uid, c.account);
  const Tier placed = d_.engine->state(es).tier;
  *chosen = true;
  if (pool.kind() == wire::PoolKind::kMemfd) {
    if (Status st = d_.moves.Steer(range, placed); !st.ok()) {
      // Its pages will fault where the pool's policy says: count it there
      // (recorded as found there, as Relocated leaves it).
      spdlog::debug("client {}: block {} of pool steered nowhere ({}): admitted in {}", c.id,
                    e.block_index, st.message, TierName(steered));
      d_.engine->Relocated(es, steered);
      *chosen = placed == steered;
    }
  }
  return es;
}

// Copy mode: the daemon places each new block (CheckCopyRoom counted the room),
// or takes the place a reconnect names (its bytes are there already), and the
// client holds its write lease until it has written the bytes (or, after a
// reconnect, carried its read leases over).
Result<wire::AdmitOk> Requests::AdmitCopy(Client& c, const wire::Admit& m) {
  wire::AdmitOk ok;
  ok.results.reserve(m.entries.size());
  // No new block goes over a cap (CheckCopyRoom counted the room): it holds its
  // write lease, so nothing could move it down while the client keeps it.
  TierRoom room = AdmitRoom(c, *d_.engine);
  for (const wire::AdmitEntry& e : m.entries) {
    if (const uint32_t held = c.by_key.Find(e.key); held != engine::kNoSlot) {
      const BlockState& st = d_.engine->state(c.slots[held].engine_slot);
      ok.results.push_back({held, st.tier, 0});
      continue;
    }
    uint32_t pool = m.pool_id, index = e.block_index & ~wire::kAdmitAtPlace;
    if (e.block_index & wire::kAdmitAtPlace) {
      c.pools[pool].TakeAt(index);  // CheckAdmit found it free
    } else if (Status full = PlaceNew(c, m.pool_id, room, &pool, &index); !full.ok()) {
      return full;  // CheckCopyRoom counted
    }
    const Tier where = static_cast<Tier>(c.pools[pool].tier());
    const engine::Slot es =
        d_.engine->Admit(d_.clients.EngineKey(e.key, c.peer.uid), where, c.peer.uid, c.account);
    d_.recorder.Admit(d_.EventTick(), c.peer.uid, d_.engine->state(es).key, where);
    const uint32_t seg = d_.clients.Bind(c, es, pool, index, e.key);
    PublishAdmitted(c, seg);
    WriteBack(*d_.engine, c, seg);
    const bool restored = d_.engine->state(es).flags & kFlagRestored;
    ok.results.push_back({seg, where, static_cast<uint8_t>(restored)});
  }
  return ok;
}

Result<wire::ReleaseOk> Requests::OnRelease(const server::Peer& peer, const wire::Release& m) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  if (Status st = CheckEntryCount(m.keys.size(), "a release"); !st.ok()) return st;
  wire::ReleaseOk ok;
  for (const BlockKey& k : m.keys) {
    const uint32_t seg = c->by_key.Find(k);
    if (seg == engine::kNoSlot) {
      ++ok.unknown;
      continue;
    }
    d_.ReleaseSlot(*c, seg);
    ++ok.released;
  }
  return ok;
}

Result<wire::ReportOk> Requests::OnReport(const server::Peer& peer, const wire::Report& m) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  return AddReport(*c, m);
}

Result<wire::HintOk> Requests::OnHint(const server::Peer& peer, const wire::Hint& m) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  // The tick this hint belongs to: the next fold's, as for admits and
  // releases; the replay of a recording gives the engine the same clock.
  return d_.hints.Handle(*c, m, *d_.engine, d_.EventTick(), CostClock::now());
}

std::chrono::microseconds Requests::Throttle(const server::Peer& peer) {
  return d_.budgets.Throttle(peer.uid, CostClock::now());
}

Result<wire::QueryTiersOk> Requests::OnQueryTiers(const server::Peer& peer,
                                                  const wire::QueryTiers& m) {
  Client* c = Said(peer);
  if (!c) return Error{ErrorCode::kNotReady, "say hello first"};
  if (Status st = CheckEntryCount(m.keys.size(), "a query"); !st.ok()) return st;
  wire::QueryTiersOk ok;
  ok.tiers.reserve(m.keys.size());
  for (const BlockKey& k : m.keys) {
    const uint32_t seg = c->by_key.Find(k);
    ok.tiers.push_back(seg == engine::kNoSlot ? Tier::kNone
                                              : d_.engine->state(c->slots[seg].engine_slot).tier);
  }
  return ok;
}

Result<wire::StatsOk> Requests::OnStats(const server::Peer& peer, const wire::Stats& m) {
  // Keys are often hashes of prompt prefixes: a peer sees only its own uid's
  // clients, blocks and share (status's and quotas' users and clients); root
  // and the admin group see everyone's.
  const std::optional<uid_t> only =
      d_.IsAdmin(peer) ? std::nullopt : std::optional<uid_t>(peer.uid);
  uint64_t slots_scanned = 0;
  std::optional<nlohmann::json> j = StatsJson(d_, m.what, only, &slots_scanned);
  // What grows with the blocks it shows (`Stats blocks` looks at every slot
  // of them) is charged to the sender's uid, as hints are: a loop of them
  // costs its sender its own latency (docs/protocol.md, "Stats"). Not root's
  // or the admin group's: theirs covers every uid's blocks, and `cxltierctl
  // top` asks for it every second.
  if (slots_scanned > 0) Charge(peer, 1 + slots_scanned * kStatsUnitsPerSlot);
  if (!j) {
    return Error{ErrorCode::kBadPayload,
                 "unknown stats '" + m.what + "'; known: status, tiers, clients, blocks, quotas"};
  }
  return wire::StatsOk{j->dump()};
}

}  // namespace cxltier::service
