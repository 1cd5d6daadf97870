#include "service/client_table.h"

#include <malloc.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <unordered_map>
#include <unordered_set>

#include "service/config.h"
#include "service/status.h"

namespace cxltier::service {

using wire::Error;
using wire::ErrorCode;

uint64_t KeyHashSeed() {
  static const uint64_t seed = [] {
    uint64_t s = 0;
    // Blocks only before the kernel's pool is initialised (early boot); the
    // daemon starts later. Should it fail, the seed is the address of this
    // function and the time (ASLR and the clock: not secret, not fixed).
    if (getrandom(&s, sizeof(s), 0) != static_cast<ssize_t>(sizeof(s))) {
      s = reinterpret_cast<uintptr_t>(&KeyHashSeed) ^
          static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    }
    return s | 1;  // never 0, the unkeyed hash
  }();
  return seed;
}

Status ClientTable::CheckConnect(const server::Peer& peer, bool admin,
                                 const DaemonConfig& config) const {
  // Root and the admin group may always get in: max_clients counts everyone,
  // but they have admin_reserved_connections more, and no per-uid cap.
  const uint64_t cap = config.max_clients + (admin ? config.admin_reserved_connections : 0);
  if (connections_ >= cap) {
    return Error{ErrorCode::kLimit,
                 "too many clients (limit " + std::to_string(config.max_clients) + ")"};
  }
  if (admin) return Status::Ok();
  auto it = uids_.find(peer.uid);
  if (it != uids_.end() && it->second.connections >= config.max_connections_per_uid) {
    return Error{ErrorCode::kLimit, "too many connections of uid " + std::to_string(peer.uid) +
                                        " (limit " +
                                        std::to_string(config.max_connections_per_uid) + ")"};
  }
  return Status::Ok();
}

Client& ClientTable::Connect(const server::Peer& peer) {
  Client& c = clients_[peer.session_id];
  c.peer = peer;
  c.id = next_id_++;
  ++uids_[peer.uid].connections;
  ++connections_;
  return c;
}

void ClientTable::MarkLeaving(Client& c) {
  c.leaving = true;
  --connections_;
  --uids_[c.peer.uid].connections;
}

void ClientTable::Remove(uint64_t session) {
  auto it = clients_.find(session);
  if (it == clients_.end()) return;
  Client& c = it->second;
  UidUsage& u = uids_[c.peer.uid];
  u.pools -= static_cast<uint32_t>(c.pools.size());
  // A tier pool's memory is never punched or cleared here: the client may
  // still map it and read it under its leases, and a reconnect hands it to
  // the next daemon. Our mapping and fd go with the pool; the pages go when
  // the client unmaps and closes its own.
  for (server::Pool& p : c.pools) {
    if (!p.is_tier()) {
      if (p.mapping()) u.pool_bytes -= p.mapping()->length_bytes();
      continue;
    }
    if (p.daemon_memory()) {
      u.tier_pool_bytes -= p.length();
      u.tier_pool_bytes_on[p.tier()] -= p.length();
    }
    u.tier_pool_blocks[p.tier()] -= p.blocks();
    tier_pool_blocks_[p.tier()] -= p.blocks();
  }
  if (c.hello) {
    u.segment_bytes -= SegmentBytes(static_cast<uint32_t>(c.slots.size()));
    auto a = accounts_.find({c.peer.uid, c.name});
    if (a != accounts_.end() && --a->second.connections == 0) accounts_.erase(a);
  }
  if (u.connections == 0 && u.blocks == 0 && u.pools == 0 && u.segment_bytes == 0 &&
      u.tier_pool_bytes == 0) {
    uids_.erase(c.peer.uid);
  }
  const bool large = c.trim_when_removed;
  clients_.erase(it);
  // A large client's tables (slots, key map, fold state, free list)
  // went back to the allocator, in the middle of the heap where free() does
  // not return them to the system: give them back now, so that a uid that
  // left does not leave its peak behind (docs/security.md, "Hostile
  // clients"). Once per such client: a uid churning connections of
  // kTrimSlots blocks makes the daemon trim once per connection, each after
  // admitting that many blocks: it pays for a trim with 64 admits of its own
  // (a hello alone, or a large segment left empty, does not trim; what a
  // trim costs on a large heap is not measured yet).
  if (large) malloc_trim(0);
}

Status ClientTable::CheckHello(const Client& c, const wire::Hello& m,
                               const DaemonConfig& config) const {
  if (Status st = m.model.Validate(); !st.ok()) return st.Context("model geometry: ");
  if (m.max_blocks == 0) return Error{ErrorCode::kLimit, "max_blocks must be at least 1"};
  if (m.max_blocks > config.max_blocks_per_client) {
    return Error{ErrorCode::kLimit, "max_blocks " + std::to_string(m.max_blocks) +
                                        " exceeds the limit of " +
                                        std::to_string(config.max_blocks_per_client)};
  }
  if (m.model.block_bytes() > kMaxBlockBytes) {
    return Error{ErrorCode::kGeometry, "blocks of " + std::to_string(m.model.block_bytes()) +
                                           " bytes are larger than the " +
                                           FormatBytes(kMaxBlockBytes) + " this daemon places"};
  }
  const uint32_t slots = m.max_blocks;
  auto it = uids_.find(c.peer.uid);
  const uint64_t held = it == uids_.end() ? 0 : it->second.segment_bytes;
  const uint64_t bytes = SegmentBytes(slots);
  if (held + bytes > config.max_segment_bytes_per_uid) {
    return Error{ErrorCode::kLimit, "a segment of " + std::to_string(slots) + " slots (" +
                                        FormatBytes(bytes) + ") would take uid " +
                                        std::to_string(c.peer.uid) + " past its " +
                                        FormatBytes(config.max_segment_bytes_per_uid) +
                                        " of state segments (limits.max_segment_bytes_per_uid)"};
  }
  return Status::Ok();
}

Status ClientTable::Open(Client& c, uint32_t slots, std::string name) {
  if (Status st = c.segment.Create(slots, c.id); !st.ok()) return st.Context("state segment: ");
  c.hello = true;
  c.name = std::move(name);
  AccountRef& a = accounts_[{c.peer.uid, c.name}];
  if (a.connections++ == 0) a.id = engine::kClientAccount | next_account_++;
  c.account = a.id;
  uids_[c.peer.uid].segment_bytes += SegmentBytes(slots);
  c.slots.assign(slots, SegSlot{});
  c.live_slots.assign(slots, 0);
  c.socket_dirty.assign(SegmentDirtyWords(slots), 0);
  c.fold.assign(slots, FoldState{});
  c.copy.version.assign(slots, 0);
  c.copy.write_refused_since.assign(slots, 0);
  c.copy.write_overdue.assign(slots, 0);
  c.copy.copying.assign(slots, 0);
  c.copy.word_kept.assign(slots, 0);
  c.free_slots.clear();
  for (uint32_t i = slots; i-- > 0;) c.free_slots.push_back(i);
  return Status::Ok();
}

Status ClientTable::CheckPool(const Client& c, const DaemonConfig& config) const {
  if (c.pools.size() >= config.max_pools_per_client) {
    return Error{ErrorCode::kLimit,
                 "too many pools (limit " + std::to_string(config.max_pools_per_client) + ")"};
  }
  auto it = uids_.find(c.peer.uid);
  if (it != uids_.end() && it->second.pools >= config.max_pools_per_uid) {
    return Error{ErrorCode::kLimit, "too many pools of uid " + std::to_string(c.peer.uid) +
                                        " (limit " + std::to_string(config.max_pools_per_uid) +
                                        ")"};
  }
  return Status::Ok();
}

Status ClientTable::CheckPoolBytes(const Client& c, uint64_t bytes, uint64_t limit) const {
  auto it = uids_.find(c.peer.uid);
  const uint64_t held = it == uids_.end() ? 0 : it->second.pool_bytes;
  if (bytes > limit || held > limit - bytes) {
    return Error{ErrorCode::kLimit, "a pool of " + FormatBytes(bytes) + " would take uid " +
                                        std::to_string(c.peer.uid) + " past " + FormatBytes(limit) +
                                        " of memfd pools (limits.max_pool_bytes_per_uid; it has " +
                                        FormatBytes(held) + ")"};
  }
  return Status::Ok();
}

uint32_t ClientTable::AddPool(Client& c, server::Pool pool) {
  UidUsage& u = uids_[c.peer.uid];
  if (!pool.is_tier() && pool.mapping()) u.pool_bytes += pool.mapping()->length_bytes();
  c.pools.push_back(std::move(pool));
  ++u.pools;
  return static_cast<uint32_t>(c.pools.size() - 1);
}

Status ClientTable::CheckTierPool(const Client& c, const wire::CreateTierPool& m,
                                  const engine::Engine& engine,
                                  const numa::TierAssignment& tiers) const {
  if (m.tier >= engine.tiers()) {
    return Error{ErrorCode::kBadPool, "this daemon has " + std::to_string(engine.tiers()) +
                                          " tiers: there is no tier " + std::to_string(m.tier)};
  }
  if (c.copy.pool[m.tier] >= 0) {
    return Error{ErrorCode::kBadPool, "tier " + std::to_string(m.tier) + " already has pool " +
                                          std::to_string(c.copy.pool[m.tier])};
  }
  if (m.source != wire::TierPoolSource::kDevdax &&
      (m.tier >= tiers.count() || tiers.Nodes(m.tier).empty())) {
    return Error{ErrorCode::kBadPool,
                 "this daemon has no tier " + std::to_string(m.tier) + " nodes ([tiers])"};
  }
  if (m.blocks == 0) return Error{ErrorCode::kBadPool, "a tier pool needs at least one block"};
  if (m.blocks > c.slots.size()) {
    return Error{ErrorCode::kLimit, "a tier pool of " + std::to_string(m.blocks) +
                                        " blocks is more than the client's " +
                                        std::to_string(c.slots.size()) + " slots"};
  }
  if (m.stride > (uint64_t{1} << 32)) {
    return Error{ErrorCode::kLimit, "a tier pool's stride is at most 4 GiB"};
  }
  return Status::Ok();
}

Status ClientTable::CheckTierPoolBytes(const Client& c, const wire::CreateTierPool& m,
                                       uint32_t blocks, const TierBound& bound,
                                       const DaemonConfig& config) const {
  if (m.source == wire::TierPoolSource::kDevdax) return Status::Ok();  // the client's memory
  auto it = uids_.find(c.peer.uid);
  const UidUsage none;
  const UidUsage& u = it == uids_.end() ? none : it->second;
  const uint64_t bytes = uint64_t{blocks} * m.stride;  // stride <= 4 GiB: no overflow
  const std::string uid = std::to_string(c.peer.uid);
  if (bound.bytes && u.tier_pool_bytes_on[m.tier] + bytes > bound.bytes) {
    return Error{ErrorCode::kLimit,
                 "a tier-" + std::to_string(m.tier) + " pool of " + FormatBytes(bytes) +
                     " would take uid " + uid + "'s tier-" + std::to_string(m.tier) +
                     " pools past " + FormatBytes(bound.bytes) + ", " + bound.what +
                     ": one uid's tier pools of a tier never exceed its budget (it holds " +
                     FormatBytes(u.tier_pool_bytes_on[m.tier]) + " of them already)"};
  }
  if (config.max_tier_pool_bytes_per_uid &&
      u.tier_pool_bytes + bytes > config.max_tier_pool_bytes_per_uid) {
    return Error{ErrorCode::kLimit,
                 "a tier pool of " + FormatBytes(bytes) + " would take uid " + uid + " past its " +
                     FormatBytes(config.max_tier_pool_bytes_per_uid) +
                     " of tier pools the daemon creates (limits.max_tier_pool_bytes_per_uid)"};
  }
  return Status::Ok();
}

uint64_t ClientTable::UidTierPoolBlocks(uid_t uid, unsigned tier) const {
  auto it = uids_.find(uid);
  return it == uids_.end() ? 0 : it->second.tier_pool_blocks[tier];
}

uint64_t ClientTable::AccountTierPoolBlocks(uint64_t account, unsigned tier) const {
  uint64_t n = 0;
  for (const auto& [session, c] : clients_) {
    if (c.account != account || c.copy.pool[tier] < 0) continue;
    n += c.pools[static_cast<size_t>(c.copy.pool[tier])].blocks();
  }
  return n;
}

uint32_t ClientTable::AddTierPool(Client& c, server::Pool pool) {
  const uint8_t tier = pool.tier();
  tier_pool_blocks_[tier] += pool.blocks();
  if (pool.memory_id() != std::pair<uint64_t, uint64_t>{0, 0}) {
    std::erase_if(tier_memory_, [](const auto& m) { return m.second.expired(); });
    tier_memory_[pool.memory_id()] = pool.mapping();
  }
  UidUsage& u = uids_[c.peer.uid];
  u.tier_pool_blocks[tier] += pool.blocks();
  if (pool.daemon_memory()) {
    u.tier_pool_bytes += pool.length();
    u.tier_pool_bytes_on[tier] += pool.length();
  }
  const uint32_t id = AddPool(c, std::move(pool));
  c.copy.pool[tier] = static_cast<int32_t>(id);
  return id;
}

bool ClientTable::TierMemoryInUse(int fd) const {
  struct stat st {};
  if (fstat(fd, &st) != 0) return false;  // AdoptTierMemory says what it is
  const auto it = tier_memory_.find({st.st_dev, st.st_ino});
  return it != tier_memory_.end() && !it->second.expired();
}

Status CheckEntryCount(size_t entries, const char* request) {
  if (entries <= wire::kMaxEntriesPerMessage) return Status::Ok();
  return Error{ErrorCode::kLimit, std::string(request) + " may name at most " +
                                      std::to_string(wire::kMaxEntriesPerMessage) +
                                      " blocks; split it"};
}

Status ClientTable::CheckAdmit(const Client& c, const wire::Admit& m, const engine::Engine& engine,
                               const DaemonConfig& config, const TierRoomCheck& tier_room) const {
  if (m.pool_id >= c.pools.size()) {
    return Error{ErrorCode::kBadPool, "no pool " + std::to_string(m.pool_id)};
  }
  if (Status st = CheckEntryCount(m.entries.size(), "an admit"); !st.ok()) return st;
  const server::Pool& pool = c.pools[m.pool_id];
  if (pool.dead()) {
    return Error{ErrorCode::kBadPool,
                 "the process that registered pool " + std::to_string(m.pool_id) + " has exited"};
  }
  uint64_t fresh = 0;
  // A key named twice in one admit must name the same block both times.
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> named;
  named.reserve(m.entries.size());
  std::unordered_set<uint32_t> places;  // tier pool: the places named (kAdmitAtPlace)
  for (const wire::AdmitEntry& e : m.entries) {
    const bool at_place = pool.is_tier() && (e.block_index & wire::kAdmitAtPlace);
    const uint32_t place = e.block_index & ~wire::kAdmitAtPlace;
    if (pool.is_tier() && !at_place && e.block_index != 0) {
      return Error{ErrorCode::kBadSlot,
                   "an admit into a tier pool takes block index 0 (the daemon places the "
                   "block) or kAdmitAtPlace | a place, not " +
                       std::to_string(e.block_index)};
    }
    if (at_place && (place >= pool.blocks() || !places.insert(place).second)) {
      return Error{ErrorCode::kBadSlot,
                   "place " + std::to_string(place) + " of tier pool " + std::to_string(m.pool_id) +
                       (place >= pool.blocks()
                            ? " is outside it (" + std::to_string(pool.blocks()) + " blocks)"
                            : " is named twice")};
    }
    if (!pool.is_tier() && e.block_index >= pool.blocks()) {
      return Error{ErrorCode::kBadSlot, "block index " + std::to_string(e.block_index) +
                                            " is outside pool " + std::to_string(m.pool_id) + " (" +
                                            std::to_string(pool.blocks()) + " blocks)"};
    }
    if (const auto [at, first] = named.try_emplace(e.key, e.block_index); !first) {
      if (at->second == e.block_index) continue;  // counted at its first naming
      return Error{ErrorCode::kBadSlot, "key " + e.key.ToString() + " is named twice, at blocks " +
                                            std::to_string(at->second) + " and " +
                                            std::to_string(e.block_index)};
    }
    if (const uint32_t held = c.by_key.Find(e.key); held != engine::kNoSlot) {
      // Held already: admitting it again returns its slot, and only where it
      // is (the daemon would go on moving the block it was admitted at).
      const SegSlot& s = c.slots[held];
      const bool same = at_place         ? s.pool == m.pool_id && s.block == place
                        : pool.is_tier() ? c.pools[s.pool].is_tier()
                                         : s.pool == m.pool_id && s.block == e.block_index;
      if (!same) {
        return Error{ErrorCode::kBadSlot,
                     "key " + e.key.ToString() + " is held at pool " + std::to_string(s.pool) +
                         " block " + std::to_string(s.block) +
                         ": release it before admitting it at " +
                         (pool.is_tier() ? "a tier pool"
                                         : "pool " + std::to_string(m.pool_id) + " block " +
                                               std::to_string(e.block_index))};
      }
      continue;
    }
    if (at_place && !pool.IsFree(place)) {
      return Error{ErrorCode::kBadSlot, "place " + std::to_string(place) + " of tier pool " +
                                            std::to_string(m.pool_id) +
                                            " holds another block, or is not free yet"};
    }
    if (engine.Find(EngineKey(e.key, c.peer.uid)) != engine::kNoSlot) {
      return Error{ErrorCode::kDenied,
                   "key " + e.key.ToString() + " is admitted by another client of this user"};
    }
    ++fresh;
  }
  if (pool.is_tier()) {
    if (Status st = tier_room(fresh); !st.ok()) return st;
  }
  if (fresh > c.free_slots.size()) {
    return Error{ErrorCode::kLimit, "admitting " + std::to_string(fresh) +
                                        " blocks needs more than the " +
                                        std::to_string(c.free_slots.size()) + " free slots"};
  }
  auto it = uids_.find(c.peer.uid);
  const uint64_t held = it == uids_.end() ? 0 : it->second.blocks;
  if (held + fresh > config.max_blocks_per_uid) {
    return Error{ErrorCode::kLimit, "admitting " + std::to_string(fresh) +
                                        " blocks would take uid " + std::to_string(c.peer.uid) +
                                        " past its limit of " +
                                        std::to_string(config.max_blocks_per_uid) +
                                        " blocks (limits.max_blocks_per_uid)"};
  }
  return Status::Ok();
}

uint32_t ClientTable::Bind(Client& c, engine::Slot es, uint32_t pool, uint32_t block,
                           const BlockKey& key) {
  const uint32_t seg = c.free_slots.back();
  c.free_slots.pop_back();
  if (owners_.size() <= es) owners_.resize(es + 1);
  owners_[es] = Owner{c.peer.session_id, seg};
  c.slots[seg] = SegSlot{true, es, pool, block, key};
  c.live_slots[seg] = 1;
  c.fold[seg] = FoldState{};
  c.by_key.Insert(key, seg);
  if (++c.live >= kTrimSlots) c.trim_when_removed = true;
  ++uids_[c.peer.uid].blocks;
  BlockState* slot = c.segment.slot(seg);
  *slot = BlockState{};
  slot->key = key;
  return seg;
}

void ClientTable::Unbind(Client& c, uint32_t seg) {
  SegSlot& s = c.slots[seg];
  if (!s.live) return;
  owners_[s.engine_slot] = Owner{};
  c.by_key.Erase(s.key);
  s = SegSlot{};
  c.live_slots[seg] = 0;
  *c.segment.slot(seg) = BlockState{};
  c.free_slots.push_back(seg);
  --c.live;
  --uids_[c.peer.uid].blocks;
}

std::optional<ClientTable::Holder> ClientTable::HolderOf(engine::Slot es) {
  if (es >= owners_.size()) return std::nullopt;
  const Owner& o = owners_[es];
  Client* c = Find(o.session);
  if (!c) return std::nullopt;
  return Holder{c, o.seg_slot};
}

Client* ClientTable::Find(uint64_t session) {
  auto it = clients_.find(session);
  return it == clients_.end() ? nullptr : &it->second;
}

bool ClientTable::AnyHello() const {
  return std::any_of(clients_.begin(), clients_.end(),
                     [](const auto& kv) { return kv.second.hello; });
}

}  // namespace cxltier::service
