// The clients the daemon serves and every block they hold: per connection its
// segment, pools and slots with their key index; per engine slot the client
// slot that holds it; per uid what all its connections hold (the per-uid
// limits). Bind and Unbind are the only ways a slot changes, so these hold
// after every call:
//   slots[i].live == live_slots[i] == (by_key.Find(slots[i].key) == i)
//     == (HolderOf(slots[i].engine_slot) is {client, i})
//   Client::live == live slots; UidUsage::blocks == live slots of its clients.
// The engine is not here: the daemon admits and releases in the engine and
// records the result here.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/key_index.h"
#include "numa/topology.h"
#include "server/pool.h"
#include "server/segment.h"
#include "server/server.h"
#include "service/copy_state.h"
#include "service/engine_keys.h"

namespace cxltier::service {

struct DaemonConfig;

// The secret that keys this process's key indexes (the engine's, through
// EngineOptions::key_hash_seed, and each client's by_key): drawn once with
// getrandom, so that no client can choose keys that collide there.
uint64_t KeyHashSeed();

// A request naming more blocks than one message may (Admit, Release, Hint,
// QueryTiers: wire::kMaxEntriesPerMessage): `limit`, "<request> may name
// at most N blocks; split it". Ok otherwise.
Status CheckEntryCount(size_t entries, const char* request);

// One segment slot: the block a client admitted there.
struct SegSlot {
  bool live = false;
  engine::Slot engine_slot = engine::kNoSlot;
  uint32_t pool = 0;
  uint32_t block = 0;
  BlockKey key;                 // as the client named it
  uint32_t socket_touches = 0;  // socket reports since the last fold
  double socket_mass = 0;
};

// What the fold reads for every slot every tick, kept apart from SegSlot so
// the scan of a million slots touches 8 bytes here and the client's line.
struct FoldState {
  uint32_t seen_touches = 0;  // the client's running totals at the last fold
  uint32_t seen_mass_q16 = 0;
};

// One connection.
struct Client {
  server::Peer peer;
  uint64_t id = 0;
  std::string name;
  bool hello = false;
  ModelGeometry model;
  server::Segment segment;
  std::vector<server::Pool> pools;
  std::vector<SegSlot> slots;
  std::vector<uint8_t> live_slots;  // slots[i].live, packed for the fold's scan
  std::vector<FoldState> fold;
  std::vector<uint64_t> socket_dirty;  // slots with socket reports to fold, a bit each
  std::vector<uint32_t> free_slots;
  // Key -> segment slot, reading the key from slots (16 to 32 bytes a key;
  // a std::unordered_map took 59).
  engine::BasicKeyIndex<SegSlot> by_key{&slots, KeyHashSeed()};
  uint64_t live = 0;
  // It held ClientTable::kTrimSlots blocks at once: removing it gives the
  // heap's free memory back (a hello alone, admitting nothing, does not).
  bool trim_when_removed = false;
  bool leaving = false;         // disconnected; its slots are being released
  uint32_t release_cursor = 0;  // slots before it are released
  uint64_t bad_observations = 0;
  uint64_t observations = 0;
  // Its client account (engine::kClientAccount | n), set at hello and
  // shared by every connection of its uid that said hello with its name
  // (another connection of that name is no way around a client quota);
  // admits pass it to the engine, which counts blocks in it only while it
  // has a quota ([[quotas.client]] names its uid and name), so it costs
  // nothing otherwise and a quota set later applies to the blocks it holds.
  uint64_t account = engine::kNoAccount;
  CopyState copy;  // copy mode: tier pools and places
  // Page mode: the pool blocks (pool << 32 | block) whose moves came back
  // stale since the last tick; the tick finds their holders in one scan
  // (MoveDispatch::ResolveStale). At most the moves that were in flight.
  std::vector<uint64_t> stale_blocks;
};

// What one uid holds, over all its connections.
struct UidUsage {
  uint32_t connections = 0;
  uint64_t blocks = 0;
  uint32_t pools = 0;
  uint64_t segment_bytes = 0;
  uint64_t tier_pool_bytes = 0;  // copy mode: the tier pools the daemon made
  uint64_t pool_bytes = 0;       // page mode: its memfd pools' bytes the daemon maps
  // Copy mode, by tier: the blocks of its tier pools (any source), and the
  // bytes of those the daemon made.
  std::array<uint64_t, kMaxTiers> tier_pool_blocks{};
  std::array<uint64_t, kMaxTiers> tier_pool_bytes_on{};
};

class ClientTable {
 public:
  // Removing a client that held at least this many blocks at once returns
  // the heap's free memory to the system (malloc_trim).
  static constexpr size_t kTrimSlots = 65536;

  // Sessions by id: connected ones and ones leaving.
  using Map = std::map<uint64_t, Client>;

  // The engine's name for `key` of a client of `uid`: keys live in one
  // namespace per user (service/engine_keys.h).
  BlockKey EngineKey(const BlockKey& key, uid_t uid) const { return engine_keys_.Of(key, uid); }
  // At the daemon's start, before any client: the secret kept in state_dir.
  void set_engine_keys(const EngineKeys& keys) { engine_keys_ = keys; }

  // Connection caps (max_clients, the admin reserve, per uid): the refusal, or
  // ok if `peer` may connect.
  Status CheckConnect(const server::Peer& peer, bool admin, const DaemonConfig& config) const;
  // A new connection, numbered from 1.
  Client& Connect(const server::Peer& peer);
  // It disconnected: no longer counted as connected; its slots are released
  // by the daemon (Unbind), then Remove.
  void MarkLeaving(Client& c);
  // Forgets a leaving client whose slots are all unbound.
  void Remove(uint64_t session);

  // Hello: refuses a model geometry the daemon cannot place, more slots
  // than a client may have, or a segment that would take the uid past its limit.
  Status CheckHello(const Client& c, const wire::Hello& m, const DaemonConfig& config) const;
  // Hello: creates the segment, sizes the client's tables, names the client
  // and gives it the client account of its uid and name.
  Status Open(Client& c, uint32_t slots, std::string name);
  Status CheckPool(const Client& c, const DaemonConfig& config) const;
  // Page mode: a memfd pool of `bytes` mapped (blocks x stride) keeps c's
  // uid within `limit` bytes of such pools (the daemon's address space).
  Status CheckPoolBytes(const Client& c, uint64_t bytes, uint64_t limit) const;
  uint32_t AddPool(Client& c, server::Pool pool);
  // Copy mode: one pool per tier, a tier the daemon has nodes for, and
  // blocks no more than the client's slots. What the pool may hold is the
  // quotas' to say (Quotas::TierPool), then CheckTierPoolBytes.
  Status CheckTierPool(const Client& c, const wire::CreateTierPool& m, const engine::Engine& engine,
                       const numa::TierAssignment& tiers) const;
  // The most bytes of one tier's pools one uid may have the daemon make:
  // the tier's budget (the last tier's: the memory of its nodes), and what
  // an error calls it. 0 bytes: not known, no bound.
  struct TierBound {
    uint64_t bytes = 0;
    std::string what;
  };
  // Copy mode: a pool of `blocks` (the daemon's memory unless device-DAX)
  // keeps the uid's tier pools of that tier within `bound` and, when
  // limits.max_tier_pool_bytes_per_uid is set, all of its tier pools within
  // that.
  Status CheckTierPoolBytes(const Client& c, const wire::CreateTierPool& m, uint32_t blocks,
                            const TierBound& bound, const DaemonConfig& config) const;
  uint32_t AddTierPool(Client& c, server::Pool pool);
  // Copy mode: blocks of the tier pools of tier k of every client, of one
  // uid's clients, and of the clients of one client account.
  uint64_t tier_pool_blocks(unsigned tier) const { return tier_pool_blocks_[tier]; }
  uint64_t UidTierPoolBlocks(uid_t uid, unsigned tier) const;
  uint64_t AccountTierPoolBlocks(uint64_t account, unsigned tier) const;
  // Whether the memfd `fd` is a tier pool some connection of this daemon
  // has, or one a copy still reads or writes (its mapping is alive): an
  // import of it must wait (a connection that dropped is still releasing
  // its blocks, its last copy still running) or is another client's pool.
  bool TierMemoryInUse(int fd) const;
  // Checks a whole Admit before anything changes: its pool, every block
  // index, keys another client of the same uid holds in `engine`, the new
  // blocks against `tier_room` for a tier pool (copy mode: the free places
  // its quotas let it fill, CheckCopyRoom), then against the client's free
  // slots and its uid's limit.
  using TierRoomCheck = std::function<Status(uint64_t new_blocks)>;
  Status CheckAdmit(const Client& c, const wire::Admit& m, const engine::Engine& engine,
                    const DaemonConfig& config, const TierRoomCheck& tier_room) const;

  // Takes a free slot of `c` (CheckAdmit said there is one) for engine slot
  // `es`, holding pool block (pool, block) as `key`; clears its segment slot
  // to the key alone. Returns the segment slot.
  uint32_t Bind(Client& c, engine::Slot es, uint32_t pool, uint32_t block, const BlockKey& key);
  // Frees a live slot (the engine has released its block) and clears its
  // segment slot.
  void Unbind(Client& c, uint32_t seg);

  struct Holder {
    Client* client;
    uint32_t seg_slot;
  };
  // The client slot that holds engine slot `es`, if any.
  std::optional<Holder> HolderOf(engine::Slot es);
  // The engine was rebuilt with no live blocks: no engine slot is held.
  void ForgetEngineSlots() { owners_.clear(); }

  Client* Find(uint64_t session);
  const Map& all() const { return clients_; }
  Map& all() { return clients_; }
  uint64_t connections() const { return connections_; }
  // Some connected client said hello (holds the block size).
  bool AnyHello() const;

 private:
  EngineKeys engine_keys_;
  struct Owner {
    uint64_t session = 0;
    uint32_t seg_slot = 0;
  };
  Map clients_;
  // Every tier pool memfd handed out or adopted, by (st_dev, st_ino): alive
  // while a pool or a copy job holds its mapping.
  std::map<std::pair<uint64_t, uint64_t>, std::weak_ptr<const numa::Mapping>> tier_memory_;
  std::unordered_map<uid_t, UidUsage> uids_;  // of the clients in clients_
  std::vector<Owner> owners_;                 // by engine slot; session 0: none
  uint64_t connections_ = 0;                  // connected (clients_ also holds ones leaving)
  std::array<uint64_t, kMaxTiers> tier_pool_blocks_{};  // by tier: pool blocks of every client
  uint64_t next_id_ = 1;
  // Client accounts by (uid, hello name): the id and the connections that
  // hold it (said hello and not removed yet).
  struct AccountRef {
    uint64_t id = 0;
    uint32_t connections = 0;
  };
  std::map<std::pair<uid_t, std::string>, AccountRef> accounts_;
  uint64_t next_account_ = 1;
};

}  // namespace cxltier::service
