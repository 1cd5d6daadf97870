#include "service/daemon.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "cxltier/segment.h"
#include "service/admin.h"

namespace cxltier::service {

namespace asio = boost::asio;
using wire::Error;
using wire::ErrorCode;

namespace {

// Slots of a client that left released in one go on the I/O thread.
constexpr uint32_t kReleaseChunk = 1024;

}  // namespace

Daemon::Daemon(asio::io_context& io, DaemonConfig config, numa::Topology topology,
               numa::TierAssignment tiers, std::unique_ptr<numa::Migrator> migrator,
               bool can_migrate)
    : io_(io),
      config_(std::move(config)),
      topology_(std::move(topology)),
      can_migrate_(can_migrate && config_.migrate && tiers.has_slow()),
      copy_moves_(config_.migrate),
      moves_(
          std::move(tiers), std::move(migrator), config_.migrate_rate_mib_s << 20,
          [this](MoveDone done) {
            asio::post(io_, [this, d = std::move(done)] {
              moves_.Complete(d, engine_.get(), clients_, ClientWarner(), tick_);
            });
          },
          &recorder_),
      checkpoints_(config_.state_dir,
                   [this](std::function<void()> f) { asio::post(io_, std::move(f)); }),
      timer_(io) {
  peer_log_.set_sink([](server::LogLevel level, const std::string& line) {
    spdlog::log(level == server::LogLevel::kError  ? spdlog::level::err
                : level == server::LogLevel::kWarn ? spdlog::level::warn
                : level == server::LogLevel::kInfo ? spdlog::level::info
                                                   : spdlog::level::debug,
                "{}", line);
  });
}

Daemon::~Daemon() { Stop(); }

Status Daemon::Start() {
  std::error_code ec;
  std::filesystem::create_directories(config_.state_dir, ec);
  if (ec)
    return Error{ErrorCode::kInternal, "state dir " + config_.state_dir + ": " + ec.message()};
  if (config_.persist) {
    LoadedGhosts loaded = checkpoints_.Load();
    pending_ghosts_ = std::move(loaded.ghosts);
    pending_ghost_owners_ = std::move(loaded.owners);
    restored_from_checkpoint_ = pending_ghosts_.size();
    // The states' touch times are ticks of the previous run's clock: this
    // run's continues it, so that they are in the past (EMA decays by the
    // ticks since; recency orders see them as older than what comes next).
    tick_ = last_checkpoint_tick_ = loaded.clock.resume_tick;
    checkpoints_.StartWriter();
  }
  if (config_.block_bytes) {
    if (Status st = EnsureEngine(config_.block_bytes); !st.ok()) return st;
  }
  moves_.set_lease_timeout_ticks(LeaseTimeoutTicks());
  ScheduleTick();
  return Status::Ok();
}

Status Daemon::EnsureEngine(uint64_t block_bytes) {
  if (engine_ && engine_->options().block_bytes != block_bytes) {
    // Without [engine] block_bytes, the first hello set the size, but only
    // for as long as a client that said hello is connected: one client's
    // first word must not decide it for everyone for good.
    if (config_.block_bytes || clients_.AnyHello() || moves_.stats().in_flight > 0) {
      return Error{
          ErrorCode::kGeometry,
          "this daemon places blocks of " + std::to_string(engine_->options().block_bytes) +
              " bytes; the model's blocks are " + std::to_string(block_bytes) + " bytes" +
              (config_.block_bytes ? " ([engine] block_bytes)"
                                   : " (set by a connected client; set [engine] block_bytes to "
                                     "fix it for every client)")};
    }
    spdlog::info("block size {} -> {} bytes: no client holds blocks of the old size; ghosts kept",
                 engine_->options().block_bytes, block_bytes);
    // A recording ends here: its replay has one block size.
    recorder_.Stop(tick_);
    GhostSnapshot kept = CollectGhosts(false);
    pending_ghosts_ = std::move(kept.states);
    pending_ghost_owners_ = std::move(kept.owners);
    engine_.reset();
    quotas_.Clear();
    clients_.ForgetEngineSlots();
  }
  if (engine_) return Status::Ok();
  auto policy = engine::MakePolicy(config_.policy);
  if (!policy.ok()) return policy.status();
  engine_ = std::make_unique<engine::Engine>(
      EngineOptionsFor(config_, block_bytes, LowerTierBudgets()), std::move(*policy));
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
  ApplyQuotas();
  return Status::Ok();
}

void Daemon::Stop() {
  if (stopped_) return;
  stopped_ = true;
  timer_.cancel();
  moves_.mover().Stop();  // finishes the move in flight; queued ones come back as not done
  recorder_.Discard();    // nobody can take it any more
  // Turn every live block into a ghost.
  for (auto& [id, c] : clients_.all()) {
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
  config_.lease_timeout_s = config.lease_timeout_s;
  moves_.set_lease_timeout_ticks(LeaseTimeoutTicks());
  moves_.mover().set_rate(config_.migrate_rate_mib_s << 20);
  // The planner's budget follows the new tick and rate (no engine yet: the
  // first hello builds it from config_).
  if (engine_) {
    engine_->set_migrate_bytes_per_tick(
        MigrateBytesPerTick(config_, engine_->options().block_bytes));
  }
  if (config.policy != config_.policy) {
    if (Status st = SetPolicy(config.policy); !st.ok()) {
      spdlog::error("reload: policy {} refused: {}", config.policy, st.message);
    }
  }
  // The file's quotas replace every quota, those `cxltierctl quota set` made too.
  if (config.user_quotas != config_.user_quotas || config.client_quotas != config_.client_quotas) {
    config_.user_quotas = config.user_quotas;
    config_.client_quotas = config.client_quotas;
    spdlog::info("quotas: {} user and {} client quotas", config_.user_quotas.size(),
                 config_.client_quotas.size());
  }
  ApplyQuotas();
  spdlog::set_level(spdlog::level::from_str(config_.log_level));
  spdlog::info("configuration reloaded (tick {} ms, migration {} MiB/s)", config_.tick_ms,
               config_.migrate_rate_mib_s);
}

size_t Daemon::TierCount() const { return std::max<size_t>(2, moves_.tiers().count()); }

Status Daemon::CheckReload(const DaemonConfig& config) const {
  return CheckQuotaTiers(config, TierCount());
}

void Daemon::ApplyQuotas() {
  if (engine_) quotas_.Apply(*engine_, config_, clients_);  // else the first hello's engine does
}

server::Answer<wire::AdminOk> Daemon::SetQuotaRequest(const std::string& arg) {
  QuotaTarget target;
  QuotaBytes quota;
  if (Status st = ParseQuotaArg(arg, &target, &quota); !st.ok()) return st;
  DaemonConfig next = config_;
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
  if (Status st = CheckQuotaTiers(next, TierCount()); !st.ok()) return st;
  config_.user_quotas = std::move(next.user_quotas);
  config_.client_quotas = std::move(next.client_quotas);
  ApplyQuotas();
  std::string text = who + ": " + DescribeQuota(quota);
  if (engine_ && !quota.Unlimited()) {
    const engine::Quota q = ToEngineQuota(quota, engine_->options().block_bytes, target.user);
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
                          FormatBytes(engine_->options().block_bytes));
    }
  }
  if (!target.user) {
    uint64_t connected = 0;
    for (const auto& [session, c] : clients_.all()) {
      connected += c.hello && !c.leaving && c.peer.uid == target.uid && c.name == target.client;
    }
    text += fmt::format("; {} connected client(s) of that uid and name", connected);
    // The uid's cap on top: without a user quota, the sum of its client quotas'.
    if (!config_.UserQuotaOf(target.uid)) {
      std::string sum = "no quota";
      for (const UserQuota& u : EffectiveUserQuotas(config_)) {
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

Status Daemon::SetPolicy(const std::string& name) {
  if (name == "min") {
    return Error{ErrorCode::kBadPayload,
                 "policy min needs the future; it exists only in cxltier-sim"};
  }
  auto policy = engine::MakePolicy(name);
  if (!policy.ok()) return policy.status();
  const std::string old = config_.policy;
  config_.policy = name;
  // No engine yet: the first client's hello builds it with the new policy.
  if (engine_) engine_->SetPolicy(std::move(*policy));
  spdlog::info("policy {} -> {}", old, name);
  return Status::Ok();
}

server::Answer<wire::AdminOk> Daemon::OnAdmin(const server::Peer& peer, const wire::Admin& m,
                                              server::UniqueFd* reply_fd) {
  if (m.op == wire::AdminOp::kShowConfig) {
    if (IsAdmin(peer, config_.admin_group)) return wire::AdminOk{ToToml(config_)};
    // Anyone may read the configuration, but of the quotas only their own
    // uid's (its user quota and its client quotas), as status shows them:
    // who else has a quota is the admins' to see.
    DaemonConfig mine = config_;
    std::erase_if(mine.user_quotas, [&](const UserQuota& u) { return u.uid != peer.uid; });
    std::erase_if(mine.client_quotas, [&](const ClientQuota& q) { return q.uid != peer.uid; });
    const std::string admins = config_.admin_group.empty()
                                   ? "root sees"
                                   : "root and group '" + config_.admin_group + "' see";
    return wire::AdminOk{ToToml(mine) + fmt::format("# [quotas]: yours only (uid {}); {} every "
                                                    "user's and client's\n",
                                                    peer.uid, admins)};
  }
  const char* what = m.op == wire::AdminOp::kReload        ? "reload"
                     : m.op == wire::AdminOp::kSetPolicy   ? "policy set"
                     : m.op == wire::AdminOp::kRecordStart ? "record start"
                     : m.op == wire::AdminOp::kSetQuota    ? "quota set"
                                                           : "record stop";
  if (!IsAdmin(peer, config_.admin_group)) {
    ClientWarning(peer, fmt::format("denied {}: not root nor in group '{}' (gid {})", what,
                                    config_.admin_group, peer.gid));
    return Error{ErrorCode::kDenied, std::string(what) + " needs root or membership of group '" +
                                         config_.admin_group + "'"};
  }
  ClientInfo(peer, fmt::format("{} requested by pid {} uid {}", what, peer.pid, peer.uid));
  if (m.op == wire::AdminOp::kSetPolicy) {
    if (Status st = SetPolicy(m.arg); !st.ok()) return st;
    return wire::AdminOk{"policy " + m.arg};
  }
  if (m.op == wire::AdminOp::kRecordStart) return StartRecording(m.arg);
  if (m.op == wire::AdminOp::kRecordStop) return StopRecording(reply_fd);
  if (m.op == wire::AdminOp::kSetQuota) return SetQuotaRequest(m.arg);
  Status st;
  if (reload_hook_) {
    st = reload_hook_();
  } else {
    Reload(config_);
  }
  if (!st.ok()) return st.Context("reload refused: ");
  return wire::AdminOk{"configuration reloaded"};
}

void Daemon::ClientWarning(const server::Peer& peer, const std::string& what) {
  peer_log_.Line(peer.uid, server::LogLevel::kWarn,
                 fmt::format("client pid {} uid {}: {}", peer.pid, peer.uid, what));
}

void Daemon::ClientInfo(const server::Peer& peer, const std::string& line) {
  peer_log_.Line(peer.uid, server::LogLevel::kInfo, line);
}

std::optional<Error> Daemon::OnConnect(const server::Peer& peer) {
  if (auto refusal = clients_.CheckConnect(peer, IsAdmin(peer, config_.admin_group), config_)) {
    ClientWarning(peer, "connection refused: " + refusal->message);
    return refusal;
  }
  const Client& c = clients_.Connect(peer);
  spdlog::debug("client {} connected: pid {} uid {}", c.id, peer.pid, peer.uid);
  return std::nullopt;
}

void Daemon::OnDisconnect(const server::Peer& peer) {
  Client* c = Find(peer);
  if (!c || c->leaving) return;
  clients_.MarkLeaving(*c);
  // Operator tools (status, top) say no hello: their comings and goings are
  // not news.
  if (c->hello) {
    ClientInfo(peer,
               fmt::format("client {} ('{}', pid {} uid {}) left; its {} blocks become ghosts",
                           c->id, c->name, peer.pid, peer.uid, c->live));
  }
  // Its client account loses its quota when it was the last connection of
  // its uid and name; the engine forgets it once its blocks are released.
  if (config_.ClientQuotaOf(peer.uid, c->name)) ApplyQuotas();
  ReleaseLeaving(peer.session_id);
}

// A client that left is released kReleaseChunk slots at a time, the I/O
// thread serving other requests in between: a million blocks take seconds.
void Daemon::ReleaseLeaving(uint64_t session) {
  Client* leaving = clients_.Find(session);
  if (!leaving) return;
  Client& c = *leaving;
  for (uint32_t n = 0; c.release_cursor < c.slots.size() && n < kReleaseChunk; ++n) {
    const uint32_t i = c.release_cursor++;
    if (c.slots[i].live) ReleaseSlot(c, i);
  }
  if (c.release_cursor < c.slots.size()) {
    asio::post(io_, [this, session] { ReleaseLeaving(session); });
    return;
  }
  clients_.Remove(session);
}

server::Answer<wire::HelloOk> Daemon::OnHello(const server::Peer& peer, const wire::Hello& m,
                                              int* segment_fd) {
  Client* c = Find(peer);
  if (!c) return Error{ErrorCode::kInternal, "unknown session"};
  if (c->hello) return Error{ErrorCode::kNotReady, "hello was already said on this connection"};
  if (auto refusal = clients_.CheckHello(*c, m, config_)) return *refusal;
  if (Status st = EnsureEngine(m.model.block_bytes()); !st.ok()) return st;
  if (auto err = clients_.Open(*c, m.max_blocks, m.client_name.substr(0, 64))) return *err;
  c->model = m.model;
  // The engine's tables get room for every slot this client may fill now,
  // at its hello, instead of being copied in the middle of its admits
  // (other clients' requests wait behind a copy of a million-slot table).
  engine_->Reserve(engine_->live_blocks() + m.max_blocks);
  if (config_.ClientQuotaOf(peer.uid, c->name)) ApplyQuotas();
  *segment_fd = c->segment.fd();
  ClientInfo(peer,
             fmt::format("client {} hello: '{}' pid {} uid {}, {} slots, block {} bytes", c->id,
                         c->name, peer.pid, peer.uid, m.max_blocks, m.model.block_bytes()));
  return wire::HelloOk{c->id,           m.max_blocks,    kSegmentSlotOffset, m.model.block_bytes(),
                       config_.tick_ms, engine_->tiers()};
}

server::Answer<wire::RegisterPoolOk> Daemon::OnRegisterPool(const server::Peer& peer,
                                                            const wire::RegisterPool& m,
                                                            server::UniqueFd memfd) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (auto refusal = clients_.CheckPool(*c, config_)) return *refusal;
  server::Pool pool;
  if (Status st =
          pool.Open(m, std::move(memfd), peer.pid, peer.uid, engine_->options().block_bytes);
      !st.ok()) {
    ClientWarning(peer, "pool refused: " + st.message);
    return st;
  }
  const uint32_t id = clients_.AddPool(*c, std::move(pool));
  ClientInfo(peer, fmt::format("client {} (uid {}): pool {} ({}, {} blocks, {})", c->id, peer.uid,
                               id, m.kind == wire::PoolKind::kMemfd ? "memfd" : "address range",
                               m.blocks, FormatBytes(m.length)));
  return wire::RegisterPoolOk{id};
}

MoveDispatch::Warn Daemon::ClientWarner() {
  return [this](const Client& c, const std::string& what) { ClientWarning(c.peer, what); };
}

server::Answer<wire::CreateTierPoolOk> Daemon::OnCreateTierPool(const server::Peer& peer,
                                                                const wire::CreateTierPool& m,
                                                                server::UniqueFd fd, int* pool_fd) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (auto refusal = clients_.CheckPool(*c, config_)) return *refusal;
  if (auto refusal = clients_.CheckTierPool(*c, m, *engine_, moves_.tiers())) {
    ClientWarning(peer, "tier pool refused: " + refusal->message);
    return *refusal;
  }
  // What the budget, the caps and other users' guarantees leave it (a tier
  // with a budget counts it in blocks), and for the last tier the bytes of
  // its pools one uid may have the daemon make: the memory of its nodes.
  const Quotas::Grant grant = quotas_.TierPool(*c, m, *engine_, clients_);
  const bool last = m.tier + 1u >= engine_->tiers();
  const ClientTable::TierBound bound{
      last ? TierMemoryBytes(m.tier) : 0,
      "the memory of tier " + std::to_string(m.tier) + "'s nodes (the last tier's budget)"};
  std::optional<Error> refusal = grant.refusal;
  if (!refusal) refusal = clients_.CheckTierPoolBytes(*c, m, grant.blocks, bound, config_);
  if (refusal) {
    ClientWarning(peer, "tier pool refused: " + refusal->message);
    return *refusal;
  }
  if (m.source == wire::TierPoolSource::kImport && fd.valid() &&
      clients_.TierMemoryInUse(fd.get())) {
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
      m.tier < moves_.tiers().count() ? moves_.tiers().Nodes(m.tier) : kNoNodes;
  server::Pool pool;
  if (Status st = pool.OpenTier(m.tier, blocks, m.stride, engine_->options().block_bytes, nodes,
                                m.source, std::move(fd), m.offset);
      !st.ok()) {
    ClientWarning(peer, "tier pool refused: " + st.message);
    return st;
  }
  const uint32_t id = clients_.AddTierPool(*c, std::move(pool));
  const server::Pool& p = c->pools[id];
  *pool_fd = p.tier_fd();
  static constexpr const char* kSources[] = {"memfd", "device-DAX", "imported memfd"};
  ClientInfo(
      peer,
      fmt::format("client {} (uid {}): tier {} pool {} ({}, {} blocks of {} asked, {}, node {})",
                  c->id, peer.uid, int{m.tier}, id, kSources[static_cast<int>(m.source)], blocks,
                  m.blocks, FormatBytes(p.length()), p.node()));
  return wire::CreateTierPoolOk{id, blocks, p.length(), p.node()};
}

server::Answer<wire::AdmitOk> Daemon::OnAdmit(const server::Peer& peer, const wire::Admit& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (auto refusal = clients_.CheckAdmit(*c, m, *engine_, config_)) return *refusal;
  if (c->pools[m.pool_id].is_tier()) return AdmitCopy(*c, m);
  const server::Pool& pool = c->pools[m.pool_id];
  wire::AdmitOk ok;
  ok.results.reserve(m.entries.size());
  for (const wire::AdmitEntry& e : m.entries) {
    if (const uint32_t held = c->by_key.Find(e.key); held != engine::kNoSlot) {
      const BlockState& st = engine_->state(c->slots[held].engine_slot);
      ok.results.push_back({held, st.tier, 0});
      continue;
    }
    const Tier where = moves_.WhereIs(pool.Range(e.block_index));
    const engine::Slot es = engine_->Admit(EngineKey(e.key, peer.uid), where, peer.uid, c->account);
    recorder_.Admit(EventTick(), peer.uid, engine_->state(es).key, where);
    const uint32_t seg = clients_.Bind(*c, es, m.pool_id, e.block_index, e.key);
    WriteBack(*engine_, *c, seg);
    const bool restored = engine_->state(es).flags & kFlagRestored;
    spdlog::debug("client {} admitted {} in pool {} block {} as slot {} ({})", c->id,
                  e.key.ToString(), m.pool_id, e.block_index, seg, TierName(where));
    ok.results.push_back({seg, where, static_cast<uint8_t>(restored)});
  }
  return ok;
}

// Copy mode: the daemon places each new block (CheckAdmit counted the room),
// or takes the place a reconnect names (its bytes are there already), and the
// client holds its write lease until it has written the bytes (or, after a
// reconnect, carried its read leases over).
server::Answer<wire::AdmitOk> Daemon::AdmitCopy(Client& c, const wire::Admit& m) {
  wire::AdmitOk ok;
  ok.results.reserve(m.entries.size());
  // No new block goes over a cap (CheckAdmit counted the room): it holds its
  // write lease, so nothing could move it down while the client keeps it.
  TierRoom room = AdmitRoom(c, *engine_);
  for (const wire::AdmitEntry& e : m.entries) {
    if (const uint32_t held = c.by_key.Find(e.key); held != engine::kNoSlot) {
      const BlockState& st = engine_->state(c.slots[held].engine_slot);
      ok.results.push_back({held, st.tier, 0});
      continue;
    }
    uint32_t pool = m.pool_id, index = e.block_index & ~wire::kAdmitAtPlace;
    if (e.block_index & wire::kAdmitAtPlace) {
      c.pools[pool].TakeAt(index);  // CheckAdmit found it free
    } else if (auto full = PlaceNew(c, m.pool_id, room, &pool, &index)) {
      return *full;  // CheckAdmit counted
    }
    const Tier where = static_cast<Tier>(c.pools[pool].tier());
    const engine::Slot es =
        engine_->Admit(EngineKey(e.key, c.peer.uid), where, c.peer.uid, c.account);
    recorder_.Admit(EventTick(), c.peer.uid, engine_->state(es).key, where);
    const uint32_t seg = clients_.Bind(c, es, pool, index, e.key);
    PublishAdmitted(c, seg);
    WriteBack(*engine_, c, seg);
    const bool restored = engine_->state(es).flags & kFlagRestored;
    ok.results.push_back({seg, where, static_cast<uint8_t>(restored)});
  }
  return ok;
}

void Daemon::ReleaseSlot(Client& c, uint32_t seg) {
  const SegSlot& s = c.slots[seg];
  if (!s.live) return;
  const BlockState& st = engine_->state(s.engine_slot);
  if (st.flags & kFlagMigrating) moves_.mover().Cancel(s.engine_slot, st.generation);
  // A client that left, or any client when the daemon stops, keeps the last
  // place of each block in its segment (docs/protocol.md, "Reconnect").
  const bool keep_place = c.leaving || stopped_;
  if (c.pools[s.pool].is_tier() && !Retire(c, seg, tick_, keep_place) && !keep_place) {
    ClientWarning(c.peer, fmt::format("slot {} was released while its write lease was held: "
                                      "writes after the release may land in a block that "
                                      "another of this client's blocks is given",
                                      seg));
  }
  recorder_.Release(EventTick(), c.peer.uid, st.key);
  engine_->Release(s.engine_slot);
  clients_.Unbind(c, seg);
}

server::Answer<wire::ReleaseOk> Daemon::OnRelease(const server::Peer& peer,
                                                  const wire::Release& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (auto refusal = CheckEntryCount(m.keys.size(), "a release")) return *refusal;
  wire::ReleaseOk ok;
  for (const BlockKey& k : m.keys) {
    const uint32_t seg = c->by_key.Find(k);
    if (seg == engine::kNoSlot) {
      ++ok.unknown;
      continue;
    }
    ReleaseSlot(*c, seg);
    ++ok.released;
  }
  return ok;
}

server::Answer<wire::ReportOk> Daemon::OnReport(const server::Peer& peer, const wire::Report& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  return AddReport(*c, m);
}

server::Answer<wire::HintOk> Daemon::OnHint(const server::Peer& peer, const wire::Hint& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  // The tick this hint belongs to: the next fold's, as for admits and
  // releases; the replay of a recording gives the engine the same clock.
  return hints_.Handle(*c, m, *engine_, EventTick(), CostClock::now());
}

std::chrono::microseconds Daemon::Throttle(const server::Peer& peer) {
  return hints_.Throttle(peer.uid, CostClock::now());
}

server::Answer<wire::QueryTiersOk> Daemon::OnQueryTiers(const server::Peer& peer,
                                                        const wire::QueryTiers& m) {
  Client* c = Find(peer);
  if (!c || !c->hello) return Error{ErrorCode::kNotReady, "say hello first"};
  if (auto refusal = CheckEntryCount(m.keys.size(), "a query")) return *refusal;
  wire::QueryTiersOk ok;
  ok.tiers.reserve(m.keys.size());
  for (const BlockKey& k : m.keys) {
    const uint32_t seg = c->by_key.Find(k);
    ok.tiers.push_back(seg == engine::kNoSlot ? Tier::kNone
                                              : engine_->state(c->slots[seg].engine_slot).tier);
  }
  return ok;
}

server::Answer<wire::StatsOk> Daemon::OnStats(const server::Peer& peer, const wire::Stats& m) {
  // Keys are often hashes of prompt prefixes: a peer sees only its own uid's
  // clients, blocks and share (status's and quotas' users and clients); root
  // and the admin group see everyone's.
  const std::optional<uid_t> only =
      IsAdmin(peer, config_.admin_group) ? std::nullopt : std::optional<uid_t>(peer.uid);
  std::optional<nlohmann::json> j = StatsJson(m.what, only);
  if (!j) {
    return Error{ErrorCode::kBadPayload,
                 "unknown stats '" + m.what + "'; known: status, tiers, clients, blocks, quotas"};
  }
  return wire::StatsOk{j->dump()};
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
  peer_log_.MaybeSweep(t0);
  RunTick();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  tick_seconds_.Add(s, config_.tick_ms / 1000.0);
}

void Daemon::RunTick() {
  ++tick_;
  if (!engine_) return;
  in_tick_ = true;
  DropGonePools();
  for (auto& [id, c] : clients_.all()) {
    if (!c.hello || c.leaving) continue;
    fold_.Run(c, *engine_, tick_);
    c.segment.header()->daemon_ticks = tick_;
  }
  recorder_.EndTick(tick_);
  moves_.DrainPlaces(clients_, tick_, LeaseTimeoutTicks(), ClientWarner());
  // Plan and hand the moves to the mover, unless it is still busy.
  // Page moves need a slow node and CAP_SYS_NICE; copies need neither (a
  // device-DAX tier 1 is no node at all).
  if ((can_migrate_ || copy_moves_) && moves_.mover().pending() < config_.max_pending_moves) {
    moves_.Dispatch(*engine_, clients_, tick_, can_migrate_);
  }
  if (config_.persist && config_.checkpoint_interval_s > 0 &&
      (tick_ - last_checkpoint_tick_) * config_.tick_ms >=
          config_.checkpoint_interval_s * 1000ull) {
    Checkpoint();
  }
  in_tick_ = false;
}

// An address-range pool names its process by pid; once that process has
// exited the pid may be anyone's, so the pool's blocks become ghosts (as on
// disconnect) and the pool takes no more admits. The pidfd tells, one poll each.
void Daemon::DropGonePools() {
  for (auto& [id, c] : clients_.all()) {
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
      ClientWarning(c.peer, fmt::format("client {}: the process that registered pool {} has "
                                        "exited; pool dropped, its {} blocks became ghosts",
                                        c.id, p, released));
    }
  }
}

uint64_t Daemon::LeaseTimeoutTicks() const {
  return uint64_t{config_.lease_timeout_s} * 1000 / std::max<uint32_t>(config_.tick_ms, 1);
}

GhostSnapshot Daemon::CollectGhosts(bool with_live) const {
  if (engine_) return CollectStates(*engine_, with_live ? &clients_ : nullptr);
  GhostSnapshot out;
  out.states = pending_ghosts_;
  out.owners = pending_ghost_owners_;
  out.owners.resize(out.states.size(), kUnknownOwner);
  return out;
}

void Daemon::Checkpoint() {
  last_checkpoint_tick_ = tick_;
  if (!config_.persist) return;
  // The ghosts, and the live blocks' states too: after a crash (SIGKILL, no
  // Stop), the live blocks of the last checkpoint come back as ghosts, and
  // their clients' re-admissions restore them.
  GhostSnapshot snap = CollectGhosts(true);
  // Stop's final checkpoint: the clock stops here and resumes here.
  snap.clock = {tick_, stopped_ ? tick_
                                : ResumeTickAfterCrash(config_.checkpoint_interval_s,
                                                       config_.tick_ms, tick_)};
  if (stopped_) {
    checkpoints_.SaveFinal(snap);
  } else {
    checkpoints_.Save(std::move(snap));
  }
}

}  // namespace cxltier::service
