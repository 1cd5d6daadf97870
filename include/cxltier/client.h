// libcxltier: what a serving engine links to talk to cxltierd.
//
//   Client::Options o{.socket_path = DefaultSocketPath(), .model = kLlama3_70B,
//                     .max_blocks = 8192, .name = "engine-0"};
//   Status st;
//   auto c = Client::Connect(o, &st);                 // hello; maps the state segment
//   c->RegisterMemfdPool(fd, bytes, stride, blocks, &pool);
//   c->Admit(pool, {{key, block_index}, ...}, &results);  // results[i].slot
//   c->Observe(slot, mass);                           // every step: shared memory, no syscall
//   c->TierOf(slot);                                  // where the daemon placed it
//   c->Hint(sequence, HintKind::kIdle, keys);         // scheduler hints about a group
//
// Copy mode (pinned or device-DAX pools; cxltier/lease.h): a pool per tier,
// made by the daemon, and blocks moved between them by copy.
//   c->CreateTierPools(8192);                         // maps both; pin them if you like
//   c->Admit(c->tier_pool(0), {{key, 0}}, &results);  // the daemon places the block
//   c->BeginWrite(slot, &p); memcpy(p, ...); c->EndWrite(slot);   // fill it
//   auto r = c->NewReader(&st);                       // one per reading thread
//   r->Acquire(slot, &lease); DMA from lease.data; r->Release(lease);
//
// Thread-safety: Observe (one writer thread per slot), TierOf, BeginWrite and
// EndWrite (one writer per slot) and each Reader (one thread each) may be
// used from any thread; every other method needs external serialisation.
// Reconnect needs it from all of them too: it replaces the state segment
// they read and write, so nothing else may run on the client meanwhile.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/lease.h"
#include "cxltier/model.h"
#include "cxltier/socket_path.h"  // DefaultSocketPath(): where the daemon listens
#include "cxltier/status.h"       // Status: what every call that can fail returns
#include "cxltier/wire.h"

namespace cxltier {

class Client {
 public:
  struct Options {
    std::string socket_path;
    ModelGeometry model;
    uint32_t max_blocks = 0;  // slots in the state segment
    std::string name;
  };

  // Connects, says hello and maps the state segment. nullptr and *status on failure.
  static std::unique_ptr<Client> Connect(const Options& options, Status* status);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // A pool whose bytes live in `memfd` (the daemon maps it too; the library keeps a
  // duplicate of the fd to register again after a reconnect). The daemon takes
  // only a memfd sealed against shrinking, so this first adds F_SEAL_SHRINK to
  // `memfd` itself (fcntl F_ADD_SEALS; a side effect on the caller's file: it
  // can grow but never shrink again). Create it with
  // memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING); without
  // MFD_ALLOW_SEALING the seal cannot be added and the daemon refuses the pool
  // (kBadPool).
  Status RegisterMemfdPool(int memfd, uint64_t length, uint64_t stride, uint32_t blocks,
                           uint32_t* pool_id);
  // A pool in this process's own address space. The daemon answers where its
  // new pages should go (its last tier, when it moves pages), and this sets
  // that as the range's memory policy (mbind, MPOL_PREFERRED): a page this
  // process faults in after it lands there, and only the daemon's planner
  // puts the block in tier 0, within its budget. Only what is mapped now is
  // steered: a range unmapped at registration, or mapped again later, has
  // its pages land where first touched.
  Status RegisterRangePool(const void* address, uint64_t length, uint64_t stride, uint32_t blocks,
                           uint32_t* pool_id);

  // Admission of one message is all or nothing. More entries than one
  // message holds (wire::kMaxEntriesPerMessage) go in parts: a failure
  // part-way leaves the earlier parts admitted and held (SlotOf finds them;
  // in copy mode each with its admission's write lease, WriteAddress) and
  // *results empty.
  Status Admit(uint32_t pool_id, std::span<const wire::AdmitEntry> entries,
               std::vector<wire::AdmitResult>* results);

  // ---- copy mode ----
  struct TierPoolOptions {
    uint32_t blocks = 0;         // blocks this client holds in copy mode at most
    uint64_t stride = 0;         // 0: the block size rounded up to a page
    std::string devdax_path;     // "": the daemon makes the last tier's pool too; else /dev/daxX.Y
    uint64_t devdax_offset = 0;  // where this client's region of the device starts
  };
  // Asks the daemon for a pool per tier (tiers() of them) and maps each.
  // Every tier but the last holds what is left of that tier's budget, at most
  // `blocks`; the last, `blocks`. Admit with Admit(tier_pool(t), {{key, 0},
  // ...}): the daemon puts each new block in tier t while its pool has room,
  // else in the nearest slower tier with room, else the nearest faster one,
  // and the client holds the new block's write lease (BeginWrite's address is
  // valid at once): write its bytes, then EndWrite.
  Status CreateTierPools(const TierPoolOptions& options);
  // The same with the defaults: `blocks` blocks, every pool from the daemon.
  Status CreateTierPools(uint32_t blocks) {
    TierPoolOptions o;
    o.blocks = blocks;
    return CreateTierPools(o);
  }
  // Pool id of tier t's pool (UINT32_MAX: none, or one the daemon made that
  // this client could not map: the next CreateTierPools maps that one, with
  // the options of the call that made it), its mapping and length.
  uint32_t tier_pool(uint8_t tier) const;
  uint8_t* tier_pool_base(uint8_t tier) const;
  uint64_t tier_pool_bytes(uint8_t tier) const;
  uint64_t tier_pool_stride() const { return tier_stride_; }
  // Where the daemon last published slot's bytes to be (no lease: may change).
  Location LocationOf(uint32_t slot) const;

  // The write lease of a slot in copy mode: its bytes stay at *data until
  // EndWrite, and no copy of them is published meanwhile (a copy under way is
  // dropped). Never waits. kNoLease: the slot has no block in copy mode;
  // kBusy: the write lease is held already.
  Status BeginWrite(uint32_t slot, uint8_t** data);
  // kNoLease when the write lease was not held.
  Status EndWrite(uint32_t slot);
  // Where a slot's bytes are while this client holds its write lease (as
  // right after Admit into a tier pool); nullptr when it does not.
  uint8_t* WriteAddress(uint32_t slot) const;

  // A read lease reads what is in the block's place: while its write lease
  // is held (just admitted into a tier pool, or being written), that is
  // whatever the writer has put there so far, and before the first write the
  // bytes of the place's previous block. Take read leases on blocks whose
  // writer has finished (EndWrite).
  //
  // Read leases, for one thread: while held, the block's bytes stay at
  // lease.data and the daemon neither moves nor reuses them. Two atomic
  // stores and two loads; no syscall.
  class Reader {
   public:
    struct Lease {
      const uint8_t* data = nullptr;
      uint32_t slot = UINT32_MAX;
      uint32_t entry = UINT32_MAX;
      Tier tier = Tier::kNone;
    };
    ~Reader();
    Reader(const Reader&) = delete;
    Reader& operator=(const Reader&) = delete;
    // kNoLease: the slot holds no block in copy mode; kBusy: this reader
    // holds kLeasesPerRow leases already.
    Status Acquire(uint32_t slot, Lease* lease);
    // kNoLease when `lease` is not one this reader holds. A lease taken
    // before a Reconnect is released here as any other (its slot may differ
    // from the block's slot now; the entry and the bytes are the same).
    Status Release(const Lease& lease);
    uint32_t held() const { return static_cast<uint32_t>(__builtin_popcount(used_)); }

   private:
    friend class Client;
    Reader(Client* c, uint32_t row) : client_(c), row_(row) {}
    Client* client_;
    uint32_t row_;
    uint32_t used_ = 0;                                 // entries of the row in use, a bit each
    std::array<const uint8_t*, kLeasesPerRow> data_{};  // by entry: the bytes it holds
  };
  // A reader with its own row of the lease table; nullptr and *status (kBusy)
  // when kLeaseRows readers exist. It must not outlive the client.
  std::unique_ptr<Reader> NewReader(Status* status);
  Status Release(std::span<const BlockKey> keys, wire::ReleaseOk* result = nullptr);

  // A scheduler hint about one of this client's groups of blocks (a sequence
  // or request; `group` is the client's own nonzero number for it, which no
  // other client sees): kIdle (it waits for its user), kSoon (it runs again
  // shortly), kDone (it finished). `keys`, blocks this client admitted, join
  // the group first (out of any other group of this client; a key this client
  // does not hold is counted in result->unknown and changes nothing); then the
  // hint applies to every block of the group. Keys need be sent once: a hint
  // with no keys applies to the blocks that joined before. A released block
  // leaves its group. Longer lists than wire::kMaxEntriesPerMessage go as
  // several messages, each applying the hint, the last with every key joined;
  // *result sums them (applied: the last one's).
  //
  // Advice only: the daemon moves the group's blocks out of tier 0 ahead of
  // other blocks (idle, done) or back into it ahead of use (soon, the blocks
  // hottest before the group went idle or done, at most as many as it then
  // had there), and only ever at the cost of this client's user's blocks or
  // of blocks idle or done hints gave up (docs/protocol.md, "Hints").
  // A restarted daemon knows no group: Reconnect sends each group's last hint
  // again with the keys of it this client still holds. Errors: kBadPayload
  // for a kind other than 1 to 3 or group 0 (the daemon says so; nothing
  // changes).
  //   c->Hint(seq, HintKind::kIdle, seq_keys);   // the turn ended; the user reads
  //   c->Hint(seq, HintKind::kSoon);             // the user answered: it runs next
  //   c->Hint(seq, HintKind::kDone);  c->Release(seq_keys);  // finished
  Status Hint(uint32_t group, HintKind kind, std::span<const BlockKey> keys = {},
              wire::HintOk* result = nullptr);

  // Shared-memory fast path: adds one observation to a slot. No syscall, no
  // atomic read-modify-write. One thread per slot (different slots may be
  // written from different threads). Returns false, writing nothing, for a
  // slot out of range or a mass that is NaN, infinite, negative or above 65535.
  bool Observe(uint32_t slot, float mass);
  // Socket path for clients that cannot map shared memory. Sent in parts of
  // wire::kMaxObservationsPerReport; on an error the parts before it were
  // applied, and `result` counts them (do not send those again).
  Status Report(std::span<const wire::Observation> observations, wire::ReportOk* result = nullptr);

  // The tier the daemon last published for a slot (shared memory).
  Tier TierOf(uint32_t slot) const;
  // The whole slot as the daemon last wrote it.
  const BlockState* SlotState(uint32_t slot) const;
  // The slot of an admitted key, or UINT32_MAX.
  uint32_t SlotOf(const BlockKey& key) const;

  Status QueryTiers(std::span<const BlockKey> keys, std::vector<Tier>* tiers);
  // JSON text: what = status, tiers, clients or blocks.
  Status Stats(const std::string& what, std::string* json);

  // Asks a daemon for stats without saying hello (operator tools).
  static Status DaemonStats(const std::string& socket_path, const std::string& what,
                            std::string* json);
  // An operator request (reload, policy set, config show, record); *text is
  // the answer. All but config show need root or the daemon's admin group
  // (kDenied). *fd (when given): an fd passed with the answer (record stop's
  // trace), owned by the caller; -1 when none came.
  static Status DaemonAdmin(const std::string& socket_path, wire::AdminOp op,
                            const std::string& arg, std::string* text, int* fd = nullptr);

  // After the daemon restarted (or dropped this connection): connect again,
  // say hello, register the same pools, admit every key this client holds,
  // and hint each group that holds some of them as last hinted (with those
  // keys). Slots may change: use SlotOf.
  //
  // Copy mode: the tier pools are handed to the new daemon as they are (it
  // checks that each is a pool a daemon made: docs/protocol.md, "Reconnect in
  // copy mode"), and every block is admitted again at the place the old
  // daemon last published, so no byte is copied or changed. Read leases held
  // across it stay valid (lease.data, its bytes) and are carried into the new
  // state segment; a write lease held across it stays held, on the block's
  // new slot (EndWrite(SlotOf(key))). A lease on an old place of a block
  // (one that moved or was released under it) keeps that place from reuse
  // under a key of the library's own, released by the first Admit or Release
  // after the lease ends. No Reader may be used while this runs (the
  // external serialisation above).
  Status Reconnect(uint64_t* restored = nullptr);
  // The slot a held key has now (slots change across Reconnect); false if not held.
  bool SlotOf(const BlockKey& key, uint32_t* slot) const;

  uint64_t client_id() const { return client_id_; }
  uint32_t slots() const { return slots_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t tick_ms() const { return tick_ms_; }
  // The daemon's tiers (copy mode: a tier pool each).
  uint32_t tiers() const { return tiers_; }
  uint64_t daemon_ticks() const;

 private:
  Client() = default;
  struct PoolRecord {
    wire::RegisterPool reg;
    int fd = -1;    // our duplicate, for memfd pools
    int tier = -1;  // a tier pool: its tier (tier_pools_ has the rest)
    // An address range whose blocks we steer: each tier's nodes (RegisterPoolOk).
    std::array<uint64_t, kMaxTiers> tier_nodes{};
  };
  struct MappedSegment {
    void* base = nullptr;
    uint64_t bytes = 0;
    uint32_t slots = 0;
  };
  struct Held {
    uint32_t pool;
    uint32_t block;
    uint32_t slot;
    uint32_t group = 0;  // the group its last hint put it in (0: none)
  };
  // Connects and says hello. *previous (when given) takes the state segment
  // mapped before, instead of it being unmapped.
  Status Open(MappedSegment* previous = nullptr);
  // Maps tier_pools_[tier], which the daemon made (CreateTierPool), through
  // its fd (the daemon's memfd, or the device-DAX device it checked).
  Status MapTierPool(uint8_t tier);
  // Reconnect's copy-mode steps (`old`: the previous segment).
  Status ReimportTierPool(PoolRecord& record, uint32_t* id);
  Status ReadmitCopyBlocks(const MappedSegment& old,
                           const std::unordered_map<BlockKey, Held, BlockKeyHash>& held,
                           uint64_t* restored);
  // Releases the parked keys no read lease holds any more.
  void ReleaseParked();
  Status ConnectSocket();
  Status CreateTierPool(uint8_t tier, const TierPoolOptions& o, uint64_t stride);
  bool copy_mode() const;
  uint64_t* location_words() const;
  // The address of a place in the tier pools; nullptr when it is outside them.
  uint8_t* PlaceAddress(const Location& where) const;
  LeaseEntry* lease_row(uint32_t row) const;
  // Registers a page-mode pool; *tier_nodes: what SteerAdmitted steers an
  // address range's blocks to (all 0: nothing).
  Status RegisterPool(const wire::RegisterPool& m, int fd, uint32_t* pool_id,
                      std::array<uint64_t, kMaxTiers>* tier_nodes);
  static void SteerNewPages(uint64_t address, uint64_t length, uint64_t nodes);
  void SteerAdmitted(uint32_t pool_id, std::span<const wire::AdmitEntry> entries,
                     const std::vector<wire::AdmitResult>& results);
  template <typename Req, typename Resp>
  Status Call(const Req& req, wire::MsgType want, Resp* resp, int send_fd = -1,
              int* recv_fd = nullptr);
  void Unmap();

  Options options_;
  int sock_ = -1;
  uint32_t next_request_ = 1;
  void* segment_ = nullptr;
  uint64_t segment_bytes_ = 0;
  uint32_t slots_ = 0;
  uint64_t client_id_ = 0;
  uint64_t block_bytes_ = 0;
  uint32_t tick_ms_ = 0;
  uint32_t tiers_ = 0;
  // Copy mode, during a Reconnect: the previous daemon's segment (its words
  // say where each block is, its lease table what readers hold), until every
  // block is admitted again. Kept across a Reconnect that fails half-way.
  MappedSegment carried_;
  // Places a read lease held across a Reconnect while no held block is at
  // them: a key of the library's own keeps each from reuse until the lease
  // entry (lease: its index in the table) no longer holds `held`.
  static constexpr uint64_t kParkedKeyHi = 0x6b7261706c746378;  // "cxltpark"
  struct Parked {
    BlockKey key;
    uint32_t lease = 0;
    uint64_t held = 0;
  };
  std::vector<Parked> parked_;
  std::vector<PoolRecord> pools_;
  std::unordered_map<BlockKey, Held, BlockKeyHash> held_;
  // Each group's last hint, sent again with its held keys after a Reconnect.
  std::unordered_map<uint32_t, HintKind> group_hints_;
  struct TierPoolMap {
    uint32_t id = UINT32_MAX;
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    uint32_t blocks = 0;
    // The daemon's memfd, or the device-DAX device this client opened and the
    // daemon checked; for a retried mapping and a reconnect.
    int fd = -1;
    std::string devdax_path;  // a device-DAX pool's device (for messages) and offset
    uint64_t devdax_offset = 0;
  };
  std::array<TierPoolMap, kMaxTiers> tier_pools_;
  uint64_t tier_stride_ = 0;
  std::mutex rows_mu_;
  uint64_t rows_used_ = 0;                     // GUARDED_BY(rows_mu_): lease rows given to readers
  std::array<Reader*, kLeaseRows> readers_{};  // GUARDED_BY(rows_mu_): by row
};

// ---- aggregating attention scores into one observation per block ----

enum class Reduce { kSum, kMean, kMax };

// The KV head a query head reads (GQA): query_head / group size.
uint32_t KvHeadOfQueryHead(const ModelGeometry& model, uint32_t query_head);

// Reduces one value per stream (layers x KV heads, layer-major: 640 for
// Llama-3 70B) to one observation. Non-finite values are skipped. Returns 0
// for an empty or wrongly sized input.
float AggregateStreams(const ModelGeometry& model, std::span<const float> per_stream, Reduce how);

// Folds per-query-head scores (layers x query heads, layer-major) onto their KV
// heads' streams (layers x KV heads) with `how` inside each GQA group.
// Returns false when the sizes do not match the model.
bool QueryHeadsToStreams(const ModelGeometry& model, std::span<const float> per_query_head,
                         std::span<float> per_stream, Reduce how);

}  // namespace cxltier
