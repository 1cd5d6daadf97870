#include "daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <utility>

#include "admin.h"
#include "checkpoint.h"
#include "cxltier/segment.h"

namespace cxltier::service {

namespace asio = boost::asio;
using wire::Error;
using wire::ErrorCode;

namespace {

// More observations than this for one block in one tick is not a real client.
constexpr uint64_t kMaxTouchesPerTick = 1u << 20;
// Every this many ticks the fold reads every live slot, not only the dirty
// ones: the bound on how long a dirty-bit race can leave totals unfolded.
constexpr uint64_t kFullFoldTicks = 10;
// Slots of a client that left released in one go on the I/O thread.
constexpr uint32_t kReleaseChunk = 16384;
// Slots folded together, their cache lines prefetched first.
constexpr size_t kFoldBatch = 32;

// The tick a restart resumes at when `config`'s periodic checkpoint taken at
// `tick` is the last one on disk. After a SIGKILL the clock had run on past
// it, up to the tick the next periodic one was due at (the crash came before
// that one was on disk), and clients saw those ticks in daemon_ticks and in
// their slots. Resuming at `tick` would repeat them, an old block's time
// could then be ahead of now, and restored blocks would decay less than they
// really did; resuming where the next checkpoint was due keeps the clock
// monotonic and counts at most one interval of decay that did not happen,
// the same for every restored block, so their order among themselves holds.
// (A write still in flight at the crash, or one that failed, leaves the file
// older; its states are still in the past, only the clock repeats some ticks.)
uint64_t ResumeTickAfterCrash(const DaemonConfig& config, uint64_t tick) {
  if (config.checkpoint_interval_s == 0 || config.tick_ms == 0) return tick;
  const uint64_t interval_ms = config.checkpoint_interval_s * 1000ull;
  return tick + (interval_ms + config.tick_ms - 1) / config.tick_ms;
}

}  // namespace

Daemon::Daemon(asio::io_context& io, DaemonConfig config, numa::Topology topology,
               numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator,
               bool can_migrate)
    : io_(io),
      config_(std::move(config)),
      topology_(std::move(topology)),
      tiers_(std::move(tiers)),
      can_migrate_(can_migrate && config_.migrate && tiers_.has_slow()),
      migrator_(std::move(migrator)),
      timer_(io) {
  mover_ =
      std::make_unique<Mover>(migrator_, config_.migrate_rate_mib_s << 20, [this](MoveDone done) {
        asio::post(io_, [this, d = std::move(done)]() mutable { OnMoveDone(std::move(d)); });
      });
}

Daemon::~Daemon() { Stop(); }

std::string Daemon::GhostPath() const {
  return (std::filesystem::path(config_.state_dir) / "ghosts.bin").string();
}

std::string Daemon::Start() {
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  if (ec) return "state dir " + config_.state_dir + ": " + ec.message();
  if (config_.persist) {
    LoadedGhosts loaded = LoadGhosts(GhostPath());
    if (!loaded.error.empty()) spdlog::error("ghost checkpoint: {}", loaded.error);
    if (loaded.found && loaded.error.empty()) {
      spdlog::info("loaded {} ghosts from {}", loaded.ghosts.size(), GhostPath());
    }
    if (loaded.version == 1 && !loaded.ghosts.empty()) {
      spdlog::info("checkpoint of version 1: its {} ghosts share one owner's ghost share",
                   loaded.ghosts.size());
    }
    pending_ghosts_ = std::move(loaded.ghosts);
    pending_ghost_owners_ = std::move(loaded.owners);
    restored_from_checkpoint_ = pending_ghosts_.size();
    // The states' touch times are ticks of the previous run's clock: this
    // run's continues it, so that they are in the past (EMA decays by the
    // ticks since; recency orders see them as older than what comes next).
    tick_ = last_checkpoint_tick_ = loaded.clock.resume_tick;
    if (loaded.found && loaded.error.empty()) {
      spdlog::info("clock resumes at tick {} (checkpoint taken at tick {})", tick_,
                   loaded.clock.tick);
    }
    // Periodic checkpoints are written on a thread of their own: a million
    // states are 64 MiB to write and fsync, which must not stall the clients.
    try {
      checkpoint_writer_ = std::make_unique<CheckpointWriter>([this](const std::string& err) {
        asio::post(io_, [this, err] {
          if (err.empty()) {
            last_checkpoint_error_.clear();
          } else if (err != last_checkpoint_error_) {
            spdlog::error("ghost checkpoint not written: {}", err);
            last_checkpoint_error_ = err;
          }
        });
      });
    } catch (const std::exception& e) {  // no thread: checkpoints are written inline
      spdlog::warn("checkpoint writer thread not started ({}): writing checkpoints inline",
                   e.what());
    }
  }
  if (config_.block_bytes) {
    if (std::string err = EnsureEngine(config_.block_bytes); !err.empty()) return err;
  }
  ScheduleTick();
  return {};
}

std::string Daemon::EnsureEngine(uint64_t block_bytes) {
  if (engine_ && engine_->options().block_bytes != block_bytes) {
    // Without [engine] block_bytes, the first hello set the size, but only
    // for as long as a client that said hello is connected: one client's
    // first word must not decide it for everyone for good.
    const bool in_use = std::any_of(clients_.begin(), clients_.end(),
                                    [](const auto& kv) { return kv.second.hello; });
    if (config_.block_bytes || in_use || moves_in_flight_ > 0) {
      return "this daemon places blocks of " + std::to_string(engine_->options().block_bytes) +
             " bytes; the model's blocks are " + std::to_string(block_bytes) + " bytes" +
             (config_.block_bytes ? " ([engine] block_bytes)"
                                  : " (set by a connected client; set [engine] block_bytes to "
                                    "fix it for every client)");
    }
    spdlog::info("block size {} -> {} bytes: no client holds blocks of the old size; ghosts kept",
                 engine_->options().block_bytes, block_bytes);
    GhostSnapshot kept = CollectGhosts();
    pending_ghosts_ = std::move(kept.states);
    pending_ghost_owners_ = std::move(kept.owners);
    engine_.reset();
    owners_.clear();
  }
  if (engine_) return {};
  engine::EngineOptions o;
  o.block_bytes = block_bytes;
  o.tier0_budget_bytes = config_.tier0_budget_bytes;
  o.persistence = config_.persist ? engine::Persistence::kPersist : engine::Persistence::kReset;
  o.mode = engine::Mode::kTick;
  o.ghost_capacity = config_.ghost_capacity;
  // Every uid, root and admins too, gets the same share of the ghost store.
  o.ghost_capacity_per_owner = config_.max_ghosts_per_uid;
  o.migrate_bytes_per_tick = MigrateBytesPerTick(config_, block_bytes);
  o.hysteresis_ticks = config_.hysteresis_ticks;
  std::string err;
  auto policy = engine::MakePolicy(config_.policy, &err);
  if (!policy) return err;
  engine_ = std::make_unique<engine::Engine>(o, std::move(policy));
  for (size_t i = 0; i < pending_ghosts_.size(); ++i) {
    engine_->RestoreGhost(pending_ghosts_[i], i < pending_ghost_owners_.size()
                                                  ? pending_ghost_owners_[i]
                                                  : kUnknownOwner);
  }
  pending_ghosts_.clear();
  pending_ghost_owners_.clear();
  spdlog::info("engine: policy {}, {}, block {} bytes, tier-0 budget {} ({} blocks)",
               config_.policy, config_.persist ? "persist" : "reset", block_bytes,
               FormatBytes(config_.tier0_budget_bytes), engine_->capacity_blocks());
  return {};
}

void Daemon::Stop() {
  if (stopped_) return;
  stopped_ = true;
  timer_.cancel();
  mover_->Stop();  // finishes the move in flight; queued ones come back as not done
  // Flush what the mover posted, then turn every live block into a ghost.
  for (auto& [id, c] : clients_) {
    for (uint32_t i = 0; i < c.slots.size(); ++i) {
      if (c.slots[i].live) ReleaseSlot(c, i);
    }
  }
  Checkpoint();
}

void Daemon::Reload(const DaemonConfig& config) {
  config_.tick_ms = config.tick_ms;
  config_.migrate_rate_mib_s = config.migrate_rate_mib_s;
  config_.log_level = config.log_level;
  config_.checkpoint_interval_s = config.checkpoint_interval_s;
  config_.max_pending_moves = config.max_pending_moves;
  config_.admin_group = config.admin_group;
  mover_->set_rate(config_.migrate_rate_mib_s << 20);
  // The planner's budget follows the new tick and rate (no engine yet: the
  // first hello builds it from config_).
  if (engine_) {
    engine_->set_migrate_bytes_per_tick(
        MigrateBytesPerTick(config_, engine_->options().block_bytes));
  }
  if (config.policy != config_.policy) {
    if (std::string err = SetPolicy(config.policy); !err.empty()) {
      spdlog::error("reload: policy {} refused: {}", config.policy, err);
    }
  }
  spdlog::set_level(spdlog::level::from_str(config_.log_level));
  spdlog::info("configuration reloaded (tick {} ms, migration {} MiB/s)", config_.tick_ms,
               config_.migrate_rate_mib_s);
}

std::string Daemon::SetPolicy(const std::string& name) {
  if (name == "min") return "policy min needs the future; it exists only in cxltier-sim";
  std::string err;
  auto policy = engine::MakePolicy(name, &err);
  if (!policy) return err;
  const std::string old = config_.policy;
  config_.policy = name;
  // No engine yet: the first client's hello builds it with the new policy.
  if (engine_) engine_->SetPolicy(std::move(policy));
  spdlog::info("policy {} -> {}", old, name);
  return {};
}

server::Answer<wire::AdminOk> Daemon::OnAdmin(const server::Peer& peer, const wire::Admin& m) {
  if (m.op == wire::AdminOp::kShowConfig) return wire::AdminOk{ToToml(config_)};
  const char* what = m.op == wire::AdminOp::kReload ? "reload" : "policy set";
  if (!IsAdmin(peer, config_.admin_group)) {
    ClientWarning(peer, fmt::format("denied {}: not root nor in group '{}' (gid {})", what,
                                    config_.admin_group, peer.gid));
    return Error{ErrorCode::kDenied, std::string(what) + " needs root or membership of group '" +
                                         config_.admin_group + "'"};
  }
  spdlog::info("{} requested by pid {} uid {}", what, peer.pid, peer.uid);
  if (m.op == wire::AdminOp::kSetPolicy) {
    if (std::string err = SetPolicy(m.arg); !err.empty()) {
      return Error{ErrorCode::kBadPayload, err};
    }
    return wire::AdminOk{"policy " + m.arg};
  }
  std::string err;
  if (reload_hook_) {
    err = reload_hook_();
  } else {
    Reload(config_);
  }
  if (!err.empty()) return Error{ErrorCode::kBadPayload, "reload refused: " + err};
  return wire::AdminOk{"configuration reloaded"};
}

void Daemon::ClientWarning(const server::Peer& peer, const std::string& what) {
  const server::LogLimiter::Verdict v =
      warnings_.Allow(peer.session_id, std::chrono::steady_clock::now());
  if (v.suppressed) {
    spdlog::warn("client pid {} uid {}: {} more warnings were suppressed in the last {} s",
                 peer.pid, peer.uid, v.suppressed,
                 std::chrono::duration_cast<std::chrono::seconds>(warnings_.window()).count());
  }
  if (v.log) spdlog::warn("client pid {} uid {}: {}", peer.pid, peer.uid, what);
}

Daemon::Client* Daemon::Find(const server::Peer& peer) {
  auto it = clients_.find(peer.session_id);
  return it == clients_.end() ? nullptr : &it->second;
}

BlockKey Daemon::EngineKey(const BlockKey& key, uid_t uid) const {
  // Keys live in one namespace per user: clients of different users can never
  // collide, read or release each other's blocks by key.
  return BlockKey{key.hi ^ (0x9e3779b97f4a7c15ULL * (uint64_t{uid} + 1)), key.lo};
}

Tier Daemon::TierOfNode(int node) const {
  if (std::count(tiers_.fast_nodes.begin(), tiers_.fast_nodes.end(), node)) return Tier::kFast;
  if (std::count(tiers_.slow_nodes.begin(), tiers_.slow_nodes.end(), node)) return Tier::kSlow;
  return Tier::kFast;  // a node we do not manage counts as fast: it is not CXL memory we know of
}

Tier Daemon::WhereIs(const numa::PageRange& range) {
  std::map<int, size_t> count;
  for (int n : migrator_->Where(range)) {
    if (n >= 0) ++count[n];
  }
  if (count.empty()) return Tier::kFast;  // not faulted in yet: it will be, locally
  const int node = std::max_element(count.begin(), count.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
  return TierOfNode(node);
}

std::optional<Error> Daemon::CheckConnectionLimits(const server::Peer& peer, bool admin) const {
  // Root and the admin group may always get in: max_clients counts everyone,
  // but they have admin_reserved_connections more, and no per-uid cap.
  const uint64_t cap = config_.max_clients + (admin ? config_.admin_reserved_connections : 0);
  if (connections_ >= cap) {
    return Error{ErrorCode::kLimit,
                 "too many clients (limit " + std::to_string(config_.max_clients) + ")"};
  }
  if (admin) return std::nullopt;
  auto it = uids_.find(peer.uid);
  if (it != uids_.end() && it->second.connections >= config_.max_connections_per_uid) {
    return Error{ErrorCode::kLimit, "too many connections of uid " + std::to_string(peer.uid) +
                                        " (limit " +
                                        std::to_string(config_.max_connections_per_uid) + ")"};
  }
  return std::nullopt;
}

std::optional<Error> Daemon::OnConnect(const server::Peer& peer) {
  if (auto refusal = CheckConnectionLimits(peer, IsAdmin(peer, config_.admin_group))) {
    ClientWarning(peer, "connection refused: " + refusal->message);
    return refusal;
  }
  Client& c = clients_[peer.session_id];
  c.peer = peer;
  c.id = next_client_id_++;
  ++uids_[peer.uid].connections;
  ++connections_;
  spdlog::debug("client {} connected: pid {} uid {}", c.id, peer.pid, peer.uid);
  return std::nullopt;
}

void Daemon::OnDisconnect(const server::Peer& peer) {
  Client* c = Find(peer);
  if (!c || c->leaving) return;
  c->leaving = true;
  --connections_;
  --uids_[peer.uid].connections;
  spdlog::info("client {} ({}, pid {}) left; its {} blocks become ghosts", c->id, c->name, peer.pid,
               c->live);
  if (const uint64_t held = warnings_.Forget(peer.session_id)) {
    spdlog::warn("client pid {} uid {}: {} more warnings were suppressed", peer.pid, peer.uid,
                 held);
  }
  ReleaseLeaving(peer.session_id);
}

// A client that left is released kReleaseChunk slots at a time, the I/O
// thread serving other requests in between: a million blocks take seconds.
void Daemon::ReleaseLeaving(uint64_t session) {
  auto it = clients_.find(session);
  if (it == clients_.end()) return;
  Client& c = it->second;
  for (uint32_t n = 0; c.release_cursor < c.slots.size() && n < kReleaseChunk; ++n) {
    const uint32_t i = c.release_cursor++;
    if (c.slots[i].live) ReleaseSlot(c, i);
  }
  if (c.release_cursor < c.slots.size()) {
    asio::post(io_, [this, session] { ReleaseLeaving(session); });
    return;
  }
  UidUsage& u = uids_[c.peer.uid];
  u.pools -= static_cast<uint32_t>(c.pools.size());
  if (c.hello) u.segment_bytes -= SegmentBytes(static_cast<uint32_t>(c.slots.size()));
  if (u.connections == 0 && u.blocks == 0 && u.pools == 0 && u.segment_bytes == 0) {
    uids_.erase(c.peer.uid);
  }
  clients_.erase(it);
}

server::Answer<wire::HelloOk> Daemon::OnHello(const server::Peer& peer, const wire::Hello& m,
                                              int* segment_fd) {
  Client* c = Find(peer);
  if (!c) return Error{ErrorCode::kInternal, "unknown session"};
  if (c->hello) return Error{ErrorCode::kNotReady, "hello was already said on this connection"};
  if (const std::string err = m.model.Validate(); !err.empty()) {
    return Error{ErrorCode::kGeometry, "model geometry: " + err};
  }
  if (m.max_blocks == 0) return Error{ErrorCode::kLimit, "max_blocks must be at least 1"};
  if (m.max_blocks > config_.max_blocks_per_client) {
    return Error{ErrorCode::kLimit, "max_blocks " + std::to_string(m.max_blocks) +
                                        " exceeds the limit of " +
                                        std::to_string(config_.max_blocks_per_client)};
  }
  if (m.model.block_bytes() > kMaxBlockBytes) {
    return Error{ErrorCode::kGeometry, "blocks of " + std::to_string(m.model.block_bytes()) +
                                           " bytes are larger than the " +
                                           FormatBytes(kMaxBlockBytes) + " this daemon places"};
  }
  UidUsage& usage = uids_[peer.uid];
  const uint64_t segment_bytes = SegmentBytes(m.max_blocks);
  if (usage.segment_bytes + segment_bytes > config_.max_segment_bytes_per_uid) {
    return Error{ErrorCode::kLimit, "a segment of " + std::to_string(m.max_blocks) + " slots (" +
                                        FormatBytes(segment_bytes) + ") would take uid " +
                                        std::to_string(peer.uid) + " past its " +
                                        FormatBytes(config_.max_segment_bytes_per_uid) +
                                        " of state segments (limits.max_segment_bytes_per_uid)"};
  }
  if (std::string err = EnsureEngine(m.model.block_bytes()); !err.empty()) {
    return Error{ErrorCode::kGeometry, err};
  }
  if (std::string err = c->segment.Create(m.max_blocks, c->id); !err.empty()) {
    return Error{ErrorCode::kInternal, "state segment: " + err};
  }
  c->hello = true;
  c->model = m.model;
  usage.segment_bytes += segment_bytes;
  // Counted against max_clients from here on too; the check at connect keeps
  // half-open connections bounded as well.
  c->name = m.client_name.substr(0, 64);
  c->slots.assign(m.max_blocks, SegSlot{});
  c->live_slots.assign(m.max_blocks, 0);
  c->socket_dirty.assign(SegmentDirtyWords(m.max_blocks), 0);
  c->fold.assign(m.max_blocks, FoldState{});
  c->free_slots.clear();
  for (uint32_t i = m.max_blocks; i-- > 0;) c->free_slots.push_back(i);
  *segment_fd = c->segment.fd();
  spdlog::info("client {} hello: '{}' pid {} uid {}, {} slots, block {} bytes", c->id, c->name,
               peer.pid, peer.uid, m.max_blocks, m.model.block_bytes());
  return wire::HelloOk{c->id, m.max_blocks, kSegmentSlotOffset, m.model.block_bytes(),
                       config_.tick_ms};
}

server::Answer<wire::RegisterPoolOk> Daemon::OnRegisterPool(const server::Peer& peer,
                                                            const wire::RegisterPool& m,
                                                            server::UniqueFd memfd) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (c->pools.size() >= config_.max_pools_per_client) {
    return Error{ErrorCode::kLimit,
                 "too many pools (limit " + std::to_string(config_.max_pools_per_client) + ")"};
  }
  if (uids_[peer.uid].pools >= config_.max_pools_per_uid) {
    return Error{ErrorCode::kLimit, "too many pools of uid " + std::to_string(peer.uid) +
                                        " (limit " + std::to_string(config_.max_pools_per_uid) +
                                        ")"};
  }
  server::Pool pool;
  if (std::string err =
          pool.Open(m, std::move(memfd), peer.pid, peer.uid, engine_->options().block_bytes);
      !err.empty()) {
    ClientWarning(peer, "pool refused: " + err);
    return Error{ErrorCode::kBadPool, err};
  }
  c->pools.push_back(std::move(pool));
  ++uids_[peer.uid].pools;
  const uint32_t id = static_cast<uint32_t>(c->pools.size() - 1);
  spdlog::info("client {}: pool {} ({}, {} blocks, {})", c->id, id,
               m.kind == wire::PoolKind::kMemfd ? "memfd" : "address range", m.blocks,
               FormatBytes(m.length));
  return wire::RegisterPoolOk{id};
}

server::Answer<wire::AdmitOk> Daemon::OnAdmit(const server::Peer& peer, const wire::Admit& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (m.pool_id >= c->pools.size()) {
    return Error{ErrorCode::kBadPool, "no pool " + std::to_string(m.pool_id)};
  }
  if (m.entries.size() > wire::kMaxEntriesPerMessage) {
    return Error{ErrorCode::kLimit, "an admit may name at most " +
                                        std::to_string(wire::kMaxEntriesPerMessage) +
                                        " blocks; split it"};
  }
  const server::Pool& pool = c->pools[m.pool_id];
  if (pool.dead()) {
    return Error{ErrorCode::kBadPool,
                 "the process that registered pool " + std::to_string(m.pool_id) + " has exited"};
  }
  // Validate the whole batch before changing anything.
  size_t fresh = 0;
  for (const wire::AdmitEntry& e : m.entries) {
    if (e.block_index >= pool.blocks()) {
      return Error{ErrorCode::kBadSlot, "block index " + std::to_string(e.block_index) +
                                            " is outside pool " + std::to_string(m.pool_id) + " (" +
                                            std::to_string(pool.blocks()) + " blocks)"};
    }
    if (c->by_key.count(e.key)) continue;
    const engine::Slot other = engine_->Find(EngineKey(e.key, peer.uid));
    if (other != engine::kNoSlot) {
      return Error{ErrorCode::kDenied,
                   "key " + e.key.ToString() + " is admitted by another client of this user"};
    }
    ++fresh;
  }
  if (fresh > c->free_slots.size()) {
    return Error{ErrorCode::kLimit, "admitting " + std::to_string(fresh) +
                                        " blocks needs more than the " +
                                        std::to_string(c->free_slots.size()) + " free slots"};
  }
  UidUsage& usage = uids_[peer.uid];
  if (usage.blocks + fresh > config_.max_blocks_per_uid) {
    return Error{ErrorCode::kLimit, "admitting " + std::to_string(fresh) +
                                        " blocks would take uid " + std::to_string(peer.uid) +
                                        " past its limit of " +
                                        std::to_string(config_.max_blocks_per_uid) +
                                        " blocks (limits.max_blocks_per_uid)"};
  }
  wire::AdmitOk ok;
  ok.results.reserve(m.entries.size());
  for (const wire::AdmitEntry& e : m.entries) {
    if (auto it = c->by_key.find(e.key); it != c->by_key.end()) {
      const BlockState& st = engine_->state(c->slots[it->second].engine_slot);
      ok.results.push_back({it->second, st.tier, 0});
      continue;
    }
    const uint32_t seg = c->free_slots.back();
    c->free_slots.pop_back();
    const Tier where = WhereIs(pool.Range(e.block_index));
    const engine::Slot es = engine_->Admit(EngineKey(e.key, peer.uid), where, peer.uid);
    if (owners_.size() <= es) owners_.resize(es + 1);
    owners_[es] = Owner{peer.session_id, seg};
    c->slots[seg] = SegSlot{true, es, m.pool_id, e.block_index, e.key};
    c->live_slots[seg] = 1;
    c->fold[seg] = FoldState{};
    c->by_key[e.key] = seg;
    ++c->live;
    ++usage.blocks;
    BlockState* slot = c->segment.slot(seg);
    *slot = BlockState{};
    slot->key = e.key;
    WriteBack(*c, seg);
    const bool restored = engine_->state(es).flags & kFlagRestored;
    spdlog::debug("client {} admitted {} in pool {} block {} as slot {} ({})", c->id,
                  e.key.ToString(), m.pool_id, e.block_index, seg, TierName(where));
    ok.results.push_back({seg, where, static_cast<uint8_t>(restored)});
  }
  return ok;
}

void Daemon::WriteBack(Client& c, uint32_t seg) {
  const SegSlot& s = c.slots[seg];
  BlockState* slot = c.segment.slot(seg);
  const BlockState& st = engine_->state(s.engine_slot);
  slot->score = st.score;
  slot->touch_time = st.touch_time;
  slot->touch_count = st.touch_count;
  slot->touch_seq = st.touch_seq;
  slot->flags = st.flags;
  slot->generation = st.generation;
  server::WriteTier(slot, st.tier);
}

void Daemon::ReleaseSlot(Client& c, uint32_t seg) {
  SegSlot& s = c.slots[seg];
  if (!s.live) return;
  const BlockState& st = engine_->state(s.engine_slot);
  if (st.flags & kFlagMigrating) mover_->Cancel(s.engine_slot, st.generation);
  engine_->Release(s.engine_slot);
  owners_[s.engine_slot] = Owner{};
  c.by_key.erase(s.key);
  s = SegSlot{};
  c.live_slots[seg] = 0;
  BlockState* slot = c.segment.slot(seg);
  *slot = BlockState{};
  c.free_slots.push_back(seg);
  --c.live;
  --uids_[c.peer.uid].blocks;
}

server::Answer<wire::ReleaseOk> Daemon::OnRelease(const server::Peer& peer,
                                                  const wire::Release& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (m.keys.size() > wire::kMaxEntriesPerMessage) {
    return Error{ErrorCode::kLimit, "a release may name at most " +
                                        std::to_string(wire::kMaxEntriesPerMessage) +
                                        " blocks; split it"};
  }
  wire::ReleaseOk ok;
  for (const BlockKey& k : m.keys) {
    auto it = c->by_key.find(k);
    if (it == c->by_key.end()) {
      ++ok.unknown;
      continue;
    }
    ReleaseSlot(*c, it->second);
    ++ok.released;
  }
  return ok;
}

server::Answer<wire::ReportOk> Daemon::OnReport(const server::Peer& peer, const wire::Report& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  wire::ReportOk ok;
  for (const wire::Observation& o : m.observations) {
    if (o.slot >= c->slots.size() || !c->slots[o.slot].live || !std::isfinite(o.mass) ||
        o.mass < 0) {
      ++ok.rejected;
      continue;
    }
    // Kept here, not in the segment: the client is the segment's only writer.
    ++c->slots[o.slot].socket_touches;
    c->slots[o.slot].socket_mass += o.mass;
    c->socket_dirty[o.slot / 64] |= uint64_t{1} << (o.slot % 64);
    ++ok.accepted;
  }
  c->bad_observations += ok.rejected;
  return ok;
}

server::Answer<wire::QueryTiersOk> Daemon::OnQueryTiers(const server::Peer& peer,
                                                        const wire::QueryTiers& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  wire::QueryTiersOk ok;
  ok.tiers.reserve(m.keys.size());
  for (const BlockKey& k : m.keys) {
    auto it = c->by_key.find(k);
    ok.tiers.push_back(it == c->by_key.end()
                           ? Tier::kNone
                           : engine_->state(c->slots[it->second].engine_slot).tier);
  }
  return ok;
}

server::Answer<wire::StatsOk> Daemon::OnStats(const server::Peer& peer, const wire::Stats& m) {
  nlohmann::json j;
  // Keys are often hashes of prompt prefixes: a peer sees only its own uid's
  // clients and blocks; root and the admin group see everyone's.
  const std::optional<uid_t> only =
      m.what == "clients" || m.what == "blocks"
          ? (IsAdmin(peer, config_.admin_group) ? std::nullopt : std::optional<uid_t>(peer.uid))
          : std::nullopt;
  if (m.what == "status") {
    j = StatusJson();
  } else if (m.what == "tiers") {
    j = TiersToJson(TierStatuses());
  } else if (m.what == "clients") {
    j = ClientsToJson(ClientStatuses(only));
  } else if (m.what == "blocks") {
    j = BlocksToJson(RankBlocks(only));
  } else {
    return Error{ErrorCode::kBadPayload,
                 "unknown stats '" + m.what + "'; known: status, tiers, clients, blocks"};
  }
  return wire::StatsOk{j.dump()};
}

void Daemon::ScheduleTick() {
  if (stopped_) return;
  timer_.expires_after(std::chrono::milliseconds(config_.tick_ms));
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    Tick();
    ScheduleTick();
  });
}

void Daemon::Tick() {
  const auto t0 = std::chrono::steady_clock::now();
  RunTick();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tick_seconds_.Add(s);
}

void Daemon::RunTick() {
  ++tick_;
  if (!engine_) return;
  DropGonePools();
  // Fold: one touch per slot per tick with the mass observed since the last
  // one, for the slots the client (dirty bitmap) or a socket report marked;
  // every kFullFoldTicks ticks, every live slot (see segment.h).
  const bool full = tick_ % kFullFoldTicks == 0;
  for (auto& [id, c] : clients_) {
    if (!c.hello || c.leaving) continue;
    const uint32_t n = static_cast<uint32_t>(c.slots.size());
    uint64_t* dirty = c.segment.dirty();
    fold_batch_.clear();
    for (uint32_t w = 0; w < c.socket_dirty.size(); ++w) {
      uint64_t bits = server::TakeDirty(dirty, w) | std::exchange(c.socket_dirty[w], 0);
      if (full) bits = ~uint64_t{0};
      while (bits) {
        const uint32_t i = w * 64 + static_cast<uint32_t>(std::countr_zero(bits));
        bits &= bits - 1;
        if (i >= n || !c.live_slots[i]) continue;
        fold_batch_.push_back(i);
        if (fold_batch_.size() == kFoldBatch) FoldBatch(c);
      }
    }
    FoldBatch(c);
    c.segment.header()->daemon_ticks = tick_;
  }
  // Plan and hand the moves to the mover, unless it is still busy.
  if (can_migrate_ && mover_->pending() < config_.max_pending_moves) {
    for (const engine::Move& mv : engine_->Plan()) {
      const Owner& o = owners_[mv.slot];
      auto it = clients_.find(o.session);
      if (it == clients_.end()) {
        engine_->Complete(mv, false);
        continue;
      }
      const SegSlot& s = it->second.slots[o.seg_slot];
      const int node = mv.to == Tier::kFast ? tiers_.fast_nodes.front() : tiers_.slow_nodes.front();
      ++moves_in_flight_;
      mover_->Submit(MoveJob{mv, it->second.pools[s.pool].Range(s.block), node, o.session,
                             o.seg_slot, s.pool, s.block});
    }
  }
  if (config_.persist && config_.checkpoint_interval_s > 0 &&
      (tick_ - last_checkpoint_tick_) * config_.tick_ms >=
          config_.checkpoint_interval_s * 1000ull) {
    Checkpoint();
  }
}

// Folds the slots in fold_batch_. The slots are scattered over the segment,
// the daemon's tables and the engine's states, so their lines are asked for
// first, all of them, and the misses overlap instead of coming one by one.
void Daemon::FoldBatch(Client& c) {
  for (uint32_t i : fold_batch_) {
    __builtin_prefetch(c.segment.slot(i), 1);
    __builtin_prefetch(&c.fold[i], 1);
    __builtin_prefetch(&c.slots[i], 1);
  }
  for (uint32_t i : fold_batch_) engine_->Prefetch(c.slots[i].engine_slot);
  for (uint32_t i : fold_batch_) FoldSlot(c, i);
  fold_batch_.clear();
}

// The client's totals only grow (modulo 2^32); we fold the difference.
void Daemon::FoldSlot(Client& c, uint32_t i) {
  FoldState& f = c.fold[i];
  SegSlot& s = c.slots[i];
  const server::ClientTotals now = server::ReadTotals(c.segment.slot(i));
  if (now.touches == f.seen_touches && now.mass_q16 == f.seen_mass_q16 && s.socket_touches == 0) {
    return;
  }
  const uint32_t shm_touches = now.touches - f.seen_touches;
  const double shm_mass = static_cast<double>(now.mass_q16 - f.seen_mass_q16) / kMassUnit;
  f.seen_touches = now.touches;
  f.seen_mass_q16 = now.mass_q16;
  const uint64_t touches = uint64_t{shm_touches} + s.socket_touches;
  double mass = shm_mass + s.socket_mass;
  s.socket_touches = 0;
  s.socket_mass = 0;
  // Untrusted: totals that jump implausibly are counted and folded as nothing.
  if (touches == 0 || touches > kMaxTouchesPerTick ||
      mass > static_cast<double>(touches) * kMaxObservationMass) {
    ++c.bad_observations;
    if (touches == 0 || touches > kMaxTouchesPerTick) return;
    mass = 0;
  }
  c.observations += touches;
  engine_->Touch(s.engine_slot, engine::Touch{mass, tick_, engine::kNever});
  WriteBack(c, i);
}

// An address-range pool names its process by pid; once that process has
// exited the pid may be anyone's, so the pool's blocks become ghosts (as on
// disconnect) and the pool takes no more admits. The pidfd tells, one poll each.
void Daemon::DropGonePools() {
  for (auto& [id, c] : clients_) {
    for (uint32_t p = 0; p < c.pools.size(); ++p) {
      server::Pool& pool = c.pools[p];
      if (pool.dead() || !pool.ProcessGone()) continue;
      uint64_t released = 0;
      for (uint32_t i = 0; i < c.slots.size(); ++i) {
        if (!c.slots[i].live || c.slots[i].pool != p) continue;
        ReleaseSlot(c, i);
        ++released;
      }
      pool.MarkDead();
      spdlog::warn(
          "client {} (pid {} uid {}): the process that registered pool {} has exited; pool "
          "dropped, its {} blocks became ghosts",
          c.id, c.peer.pid, c.peer.uid, p, released);
    }
  }
}

void Daemon::OnMoveDone(MoveDone d) {
  --moves_in_flight_;
  const bool done = d.result.done();
  pages_moved_ += d.result.on_target;
  pages_absent_ += d.result.absent;
  spdlog::debug("move of client session {} slot {} (engine slot {} gen {}) to node {}: {}",
                d.job.client_id, d.job.segment_slot, d.job.move.slot, d.job.move.generation,
                d.job.node, numa::Summarize(d.result));
  if (!done && d.result.call_errno != ECANCELED) {
    ++moves_failed_;
    pages_busy_ += d.result.busy;
    pages_elsewhere_ += d.result.elsewhere;
    for (auto [e, n] : d.result.errors) move_errors_[e] += n;
    if (d.result.call_errno) ++move_errors_[d.result.call_errno];
    // A client's own pool can fail every move (unmapped, pinned): its
    // warnings count against its rate, not everyone's journal.
    const std::string what =
        fmt::format("move to node {} not done: {}", d.job.node, numa::Summarize(d.result));
    if (auto owner = clients_.find(d.job.client_id); owner != clients_.end()) {
      ClientWarning(owner->second.peer, what);
    } else {
      spdlog::debug("{} (its client left)", what);
    }
  }
  if (!engine_) return;
  engine_->Complete(d.job.move, done);
  auto it = clients_.find(d.job.client_id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  const SegSlot& s = c.slots[d.job.segment_slot];
  const bool current = s.live && s.engine_slot == d.job.move.slot &&
                       engine_->state(s.engine_slot).generation == d.job.move.generation;
  if (current) {
    WriteBack(c, d.job.segment_slot);
    return;
  }
  // The block was released while its move was queued, and its memory may hold
  // another key by now: whatever owns that pool block, ask the kernel where it is.
  for (uint32_t i = 0; i < c.slots.size(); ++i) {
    const SegSlot& o = c.slots[i];
    if (!o.live || o.pool != d.job.pool || o.block != d.job.block) continue;
    const Tier actual = WhereIs(c.pools[o.pool].Range(o.block));
    spdlog::debug("stale move: slot {} now holds {} (engine {}); kernel says {}, engine says {}", i,
                  o.key.ToString(), o.engine_slot, TierName(actual),
                  TierName(engine_->state(o.engine_slot).tier));
    engine_->Relocated(o.engine_slot, actual);
    WriteBack(c, i);
  }
}

GhostSnapshot Daemon::CollectGhosts() const {
  GhostSnapshot out;
  if (!engine_) {
    out.states = pending_ghosts_;
    out.owners = pending_ghost_owners_;
    out.owners.resize(out.states.size(), kUnknownOwner);
    return out;
  }
  // Room for the live states Checkpoint() appends: one allocation, one copy.
  const size_t n = engine_->ghosts().size() + engine_->live_blocks();
  out.states.reserve(n);
  out.owners.reserve(n);
  engine_->ghosts().ForEach([&out](const BlockState& g, uint32_t owner) {
    out.states.push_back(g);
    out.owners.push_back(owner);
  });
  return out;
}

void Daemon::Checkpoint() {
  last_checkpoint_tick_ = tick_;
  if (!config_.persist) return;
  // The ghosts, and the live blocks' states too: after a crash (SIGKILL, no
  // Stop), the live blocks of the last checkpoint come back as ghosts, and
  // their clients' re-admissions restore them.
  GhostSnapshot snap = CollectGhosts();
  // Stop's final checkpoint: the clock stops here and resumes here.
  snap.clock = {tick_, stopped_ ? tick_ : ResumeTickAfterCrash(config_, tick_)};
  if (engine_) {
    for (const auto& [id, c] : clients_) {
      for (const SegSlot& s : c.slots) {
        if (!s.live) continue;
        snap.states.push_back(engine_->state(s.engine_slot));
        snap.owners.push_back(engine_->owner(s.engine_slot));
      }
    }
  }
  const size_t n = snap.states.size();
  if (checkpoint_writer_ && !stopped_) {
    // The I/O thread only copied the states; the writer thread writes them.
    if (!checkpoint_writer_->Submit(GhostPath(), std::move(snap))) {
      spdlog::debug("the previous checkpoint was still waiting for the disk: replaced");
    }
    spdlog::debug("{} block states (ghosts and live) handed to the checkpoint writer", n);
    return;
  }
  // Stop: the final checkpoint is written here, after the writer's last write
  // (which must not land after it), so a restart loses nothing.
  if (checkpoint_writer_) checkpoint_writer_->Stop();
  if (std::string err = SaveGhosts(GhostPath(), snap); !err.empty()) {
    if (err != last_checkpoint_error_) spdlog::error("ghost checkpoint not written: {}", err);
    last_checkpoint_error_ = err;
    return;
  }
  last_checkpoint_error_.clear();
  spdlog::debug("saved {} block states (ghosts and live) to {}", n, GhostPath());
}

}  // namespace cxltier::service
