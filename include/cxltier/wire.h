// The cxltier wire protocol: versioned, length-framed binary messages over a
// Unix stream socket. Byte layouts: docs/protocol.md. The codec is pure (no I/O)
// and shared by the daemon and the client library.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/model.h"
#include "cxltier/status.h"

namespace cxltier {

// A scheduler hint about a group of blocks (one sequence or request) that the
// client names (docs/protocol.md, "Hints"). Advice: the daemon may ignore it,
// and a wrong one costs only the sender's own blocks.
enum class HintKind : uint8_t {
  kIdle = 1,  // the group waits (for its user): its blocks may leave tier 0 first
  kSoon = 2,  // the group runs again soon: its hottest blocks come back ahead of use
  kDone = 3,  // the request finished: its blocks leave tier 0 before idle ones
};

}  // namespace cxltier

namespace cxltier::wire {

inline constexpr uint32_t kMagic = 0x544c5843;  // "CXLT" as little-endian bytes
// 2: HelloOk.tiers, tier pools on any tier, imports; 3: RegisterPoolOk.new_pages_nodes;
// 4: RegisterPoolOk.tier_nodes (an address range's blocks steered at admission)
inline constexpr uint16_t kVersion = 4;
inline constexpr size_t kHeaderBytes = 16;
// A frame's payload at most, unless [limits] max_message_bytes says otherwise:
// what one frame may cost the I/O thread to read and decode (a Report of 1 MiB
// is 131,072 observations, about 4 ms; the largest request the library sends
// is a Report of kMaxObservationsPerReport, 512 KiB).
inline constexpr uint32_t kDefaultMaxPayload = 1u << 20;
// Observations of one Report at most that the client library sends; it
// splits longer lists.
inline constexpr uint32_t kMaxObservationsPerReport = 65536;
// Entries of one Admit, Release or Hint at most: each costs the daemon's I/O thread
// a few microseconds, so one request stays short for everyone else. The client
// library splits longer lists.
inline constexpr uint32_t kMaxEntriesPerMessage = 1024;

enum class MsgType : uint16_t {
  kHello = 1,
  kHelloOk = 2,
  kRegisterPool = 3,
  kRegisterPoolOk = 4,
  kAdmit = 5,
  kAdmitOk = 6,
  kRelease = 7,
  kReleaseOk = 8,
  kReport = 9,
  kReportOk = 10,
  kQueryTiers = 11,
  kQueryTiersOk = 12,
  kStats = 13,
  kStatsOk = 14,
  kError = 15,
  kAdmin = 16,
  kAdminOk = 17,
  kCreateTierPool = 18,
  kCreateTierPoolOk = 19,
  kHint = 20,
  kHintOk = 21,
};

struct Header {
  uint32_t magic = kMagic;
  uint16_t version = kVersion;
  MsgType type = MsgType::kError;
  uint32_t payload_bytes = 0;
  uint32_t request_id = 0;  // echoed in the reply
};

// ---- payloads ----

struct Hello {
  ModelGeometry model;      // name is not sent
  uint32_t max_blocks = 0;  // slots wanted in the state segment
  std::string client_name;  // for logs and `cxltierctl clients`, at most 255 bytes
};

struct HelloOk {
  uint64_t client_id = 0;
  uint32_t slots = 0;        // slots in the segment (the fd comes with this message)
  uint32_t slot_offset = 0;  // byte offset of slot 0 in the segment
  uint64_t block_bytes = 0;  // the daemon's block size (must equal the model's)
  uint32_t tick_ms = 0;
  uint32_t tiers = 0;  // the daemon's tiers (copy mode: a tier pool for each)
};

enum class PoolKind : uint8_t {
  kMemfd = 0,  // the memfd travels with the message (SCM_RIGHTS); the daemon maps it
  kRange = 1,  // an address range of the client's own process (pid from SO_PEERCRED)
};

struct RegisterPool {
  PoolKind kind = PoolKind::kMemfd;
  uint64_t address = 0;  // kRange: start address in the client; kMemfd: 0
  uint64_t length = 0;   // bytes of the pool
  uint64_t stride = 0;   // bytes from one block's start to the next (>= block bytes)
  uint32_t blocks = 0;   // block slots in the pool
};

struct RegisterPoolOk {
  uint32_t pool_id = 0;
  // An address-range pool: for each tier (below HelloOk.tiers), the nodes
  // (bit n: node n, nodes 0 to 63) a block there should fault its pages on.
  // The client library sets them as memory policies (mbind, MPOL_PREFERRED):
  // the last tier's on the whole range at registration, and each admitted
  // block's tier's on that block's range when Admit answers. All 0: leave
  // the policy alone. A memfd pool's the daemon sets itself, so they are
  // always 0 for those.
  std::array<uint64_t, kMaxTiers> tier_nodes{};
};

// Copy mode: one pool per tier, and blocks move between them by copy.
enum class TierPoolSource : uint8_t {
  kDaemon = 0,  // the daemon creates a memfd on the tier's nodes and passes it back
  kDevdax = 1,  // the client's device-DAX fd travels with the message (SCM_RIGHTS)
  // Reconnect: the memfd a daemon made for this tier travels with the message
  // and the new daemon adopts it, bytes and all, once it has checked that it
  // is one it would make (docs/protocol.md, "Reconnect in copy mode").
  kImport = 2,
};

struct CreateTierPool {
  uint8_t tier = 0;  // below HelloOk.tiers
  TierPoolSource source = TierPoolSource::kDaemon;
  uint32_t blocks = 0;  // blocks the client will hold in copy mode, all tiers together
  uint64_t stride = 0;  // bytes from one block's start to the next (>= block bytes)
  uint64_t offset = 0;  // kDevdax: where this pool starts in the device
};

struct CreateTierPoolOk {
  uint32_t pool_id = 0;
  uint32_t blocks = 0;  // blocks in this pool (the daemon sizes it from the tier's budget)
  uint64_t bytes = 0;   // the pool's length (the fd comes with this message for kDaemon)
  int32_t node = -1;    // the node its pages are on (the first, with several)
};

struct AdmitEntry {
  BlockKey key;
  // Which block of the pool holds this key's bytes. 0 for a tier pool: the
  // daemon places the block and publishes where in the segment;
  // kAdmitAtPlace | i: the block is at place i of this tier pool already
  // (a reconnect re-admitting what an imported pool holds).
  uint32_t block_index = 0;
};
inline constexpr uint32_t kAdmitAtPlace = 0x8000'0000u;

struct Admit {
  uint32_t pool_id = 0;
  std::vector<AdmitEntry> entries;
};

struct AdmitResult {
  uint32_t slot = 0;  // the key's slot in the client's state segment
  Tier tier = Tier::kNone;
  uint8_t restored = 0;  // 1 when a ghost's state came back
};

struct AdmitOk {
  std::vector<AdmitResult> results;
};

struct Release {
  std::vector<BlockKey> keys;
};

struct ReleaseOk {
  uint32_t released = 0;
  uint32_t unknown = 0;  // keys this client had not admitted
};

struct Observation {
  uint32_t slot = 0;
  float mass = 0;
};

struct Report {
  std::vector<Observation> observations;
};

struct ReportOk {
  uint32_t accepted = 0;
  uint32_t rejected = 0;  // bad slot, NaN, infinite or negative
};

struct QueryTiers {
  std::vector<BlockKey> keys;
};

struct QueryTiersOk {
  std::vector<Tier> tiers;  // Tier::kNone for keys this client has not admitted
};

struct Stats {
  std::string what;  // "status", "tiers", "clients", "blocks", "quotas"
};

struct StatsOk {
  std::string json;
};

// A hint about group `group` of this client. `keys` (this client's admitted
// blocks, at most kMaxEntriesPerMessage) join the group first, out of any
// other group of this client; then the hint applies to every block of the
// group. Empty keys: to the blocks that joined before.
struct Hint {
  HintKind kind = HintKind::kIdle;  // 1, 2 or 3; anything else does not decode
  uint32_t group = 0;               // the client's own name for it; nonzero
  std::vector<BlockKey> keys;
};

struct HintOk {
  uint32_t grouped = 0;  // keys put in the group
  uint32_t unknown = 0;  // keys this client has not admitted
  uint8_t applied = 0;   // 1 when the group had live blocks for the hint to apply to
};

// The Error message is a failed Status: its code (never kOk) and message.
using Error = Status;

// Operator requests: only root or members of the daemon's admin group.
enum class AdminOp : uint8_t {
  kReload = 1,      // re-read the configuration file (as SIGHUP does)
  kSetPolicy = 2,   // arg: a policy name ("lfu", "ema:0.01", ...)
  kShowConfig = 3,  // the effective configuration as TOML (no privilege needed)
  // What-if recording (cxltierctl record). Start: arg "SECONDS" or
  // "SECONDS:MAX_EVENTS"; the recording stops by itself after that. Stop: ends
  // it if still on, and answers with a JSON summary and, passed with
  // SCM_RIGHTS, a sealed memfd holding the trace (docs/workloads.md).
  kRecordStart = 4,
  kRecordStop = 5,
  // A user's or a client's quota (docs/operations.md, "Quotas"), until the
  // next reload. Arg: "uid=1001 tier0=8GiB guarantee=4GiB", "user=alice
  // tiers=8GiB,16GiB", "client=vllm-0 tier0=1GiB", or "uid=1001 none" to
  // remove it; the quota replaces the account's whole quota.
  kSetQuota = 6,
};

struct Admin {
  AdminOp op = AdminOp::kShowConfig;
  std::string arg;
};

struct AdminOk {
  std::string text;  // what was done, or the configuration
};

// ---- encoding: appends header + payload to `out` ----

void Encode(const Hello& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const HelloOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const RegisterPool& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const RegisterPoolOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Admit& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const AdmitOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Release& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const ReleaseOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Report& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const ReportOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const QueryTiers& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const QueryTiersOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Stats& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const StatsOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Error& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Admin& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const AdminOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const CreateTierPool& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const CreateTierPoolOk& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const Hint& m, uint32_t request_id, std::vector<uint8_t>& out);
void Encode(const HintOk& m, uint32_t request_id, std::vector<uint8_t>& out);

// ---- decoding ----

// Parses the 16-byte header. nullopt unless `bytes` holds at least kHeaderBytes.
std::optional<Header> DecodeHeader(std::span<const uint8_t> bytes);

// Checks a header before its payload is read: magic, version, type, size.
// Ok when acceptable, else the error to answer with.
Status CheckHeader(const Header& h, uint32_t max_payload);

// Each fails (kBadPayload, saying why) when the payload does not match the
// layout exactly: short, long, counts that do not fit, bad enum values, an
// Error whose code is kOk, a Hint of kind 0 or above 3 or of group 0, a
// HintOk whose applied is neither 0 nor 1.
Status Decode(std::span<const uint8_t> p, Hello* m);
Status Decode(std::span<const uint8_t> p, HelloOk* m);
Status Decode(std::span<const uint8_t> p, RegisterPool* m);
Status Decode(std::span<const uint8_t> p, RegisterPoolOk* m);
Status Decode(std::span<const uint8_t> p, Admit* m);
Status Decode(std::span<const uint8_t> p, AdmitOk* m);
Status Decode(std::span<const uint8_t> p, Release* m);
Status Decode(std::span<const uint8_t> p, ReleaseOk* m);
Status Decode(std::span<const uint8_t> p, Report* m);
Status Decode(std::span<const uint8_t> p, ReportOk* m);
Status Decode(std::span<const uint8_t> p, QueryTiers* m);
Status Decode(std::span<const uint8_t> p, QueryTiersOk* m);
Status Decode(std::span<const uint8_t> p, Stats* m);
Status Decode(std::span<const uint8_t> p, StatsOk* m);
Status Decode(std::span<const uint8_t> p, Error* m);
Status Decode(std::span<const uint8_t> p, Admin* m);
Status Decode(std::span<const uint8_t> p, AdminOk* m);
Status Decode(std::span<const uint8_t> p, CreateTierPool* m);
Status Decode(std::span<const uint8_t> p, CreateTierPoolOk* m);
Status Decode(std::span<const uint8_t> p, Hint* m);
Status Decode(std::span<const uint8_t> p, HintOk* m);

}  // namespace cxltier::wire
