// Block-touch traces: the in-memory form the simulator replays, and the formats
// it reads and writes (Mooncake JSONL, our binary format, CSV). docs/workloads.md
// specifies the formats byte by byte.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <string_view>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/status.h"

namespace cxltier::sim {

// kAdmit: the block was admitted with its pages in tier `obs` (0 .. 7),
// before its first touch; recordings of the daemon have them (cxltierctl
// record). A replay in tick mode places the block there (in its last tier
// when it has fewer); demand mode, and a trace without admits, admit a block
// at its first touch.
// kPlace (recordings, format version 3): the block was admitted before any of
// its pages existed, and the engine chose its tier (`obs`): a tick-mode
// replay admits it with its own engine's choice (Engine::Admit(key), which
// may land it in a landing room), and `--moves recorded` checks that choice
// is the recorded one.
// kHint: a scheduler hint about a group of blocks (engine::HintKind in `obs`:
// 1 idle, 2 soon, 3 done); its `key` is the group's number (Trace::groups),
// not a key index.
// The daemon's moves, in recordings that have them (Trace::recorded_moves,
// format version 3): kPlan, the daemon ran the engine's Plan(), which planned
// `key` moves (a count, not a key index) within a budget of `obs` blocks (0:
// the recording's migrate_bytes_per_tick; the daemon paces it); kOutcome, the engine was
// told the outcome of the move it planned for block `key` (`obs` 1 done, 0
// not done); kRelocated, the daemon found block `key`'s pages in tier `obs`
// without a move of its own (Engine::Relocated). `cxltier-sim --moves
// recorded` replays them; every other replay skips them. kHeld (format
// version 3, with the moves): from here on `key` blocks' worth of released
// blocks' pages (a count, not a key index) sit in tier 0 with no block of
// the engine holding them (Engine::set_held_blocks); a move event too.
// kLeader (format version 3, with the moves): the policy's leader became
// candidate `key` (its place in the policy's spec, not a key index) at the
// touch just before this event, or, as a recording's first event, was that
// candidate when the recording began (Policy::Leader: shards chooses among
// candidates); a move event too.
enum class EventKind : uint8_t {
  kTouch = 0,
  kRelease = 1,
  kAdmit = 2,
  kHint = 3,
  kPlan = 4,
  kOutcome = 5,
  kRelocated = 6,
  kPlace = 7,
  kHeld = 8,
  kLeader = 9,
};
// Kinds 4 to 6, 8 and 9: the daemon's moves.
constexpr bool IsMoveEvent(EventKind k) {
  return k == EventKind::kPlan || k == EventKind::kOutcome || k == EventKind::kRelocated ||
         k == EventKind::kHeld || k == EventKind::kLeader;
}

// One event. 16 bytes, the same as a record of the binary format.
struct TraceEvent {
  uint32_t step;  // workload clock; never decreases along a trace
  uint32_t key;   // index into Trace::keys (a hint's: its group number)
  float obs;      // observation (attention mass) of a touch; 0 for a release; an admit's tier
  EventKind kind;
  uint8_t pad[3] = {0, 0, 0};
};
static_assert(sizeof(TraceEvent) == 16);

struct Trace {
  std::string name;            // "mooncake", "attention", a file name...
  uint32_t block_tokens = 16;  // tokens per block of this trace
  std::vector<BlockKey> keys;  // distinct keys, indexed by TraceEvent::key
  // The group (sequence) of each key, for hints: empty (no groups), or one per
  // key, 0 for a key in no group.
  std::vector<uint32_t> groups;
  std::vector<TraceEvent> events;
  // A recording of the daemon's moves (version 3): every plan the daemon ran
  // and every outcome of a move planned during the recording is an event.
  bool recorded_moves = false;
  // The engine's clock at step 0 (a recording: the daemon's tick when it
  // began); a replay gives the engine first_tick + step as its clock.
  uint64_t first_tick = 0;

  uint32_t group_of(uint32_t key) const { return key < groups.size() ? groups[key] : 0; }

  size_t touches() const;
  // Ok when the trace is consistent; otherwise kBadPayload and the first
  // problem found.
  Status Validate() const;
};

// Errors: the readers return the trace, or a Status whose message names the
// file and the line or offset: kBadPayload for a malformed trace (or a spec
// whose format cannot be told), kInternal for a file that cannot be opened,
// created or written. A writer's kBadPayload: the trace cannot be written in
// that format.

// Mooncake JSONL: one request per line, {"timestamp": ms, "hash_ids": [...], ...}.
// Every hash id is one block of 512 tokens, touched in order (observation 1);
// one request is one step.
Result<Trace> ReadMooncake(std::istream& in, std::string_view name);
Result<Trace> ReadMooncakeFile(const std::string& path);

// Our binary format ("CXLTRACE"): version 1, version 2 when the trace has
// groups (a group number per key after the key table), version 3 when it
// records the daemon's moves (the clock of step 0 after the header, then
// version 2's tables).
Result<Trace> ReadBinary(std::istream& in, std::string_view name);
Status WriteBinary(const Trace& trace, std::ostream& out);

// CSV: "# cxltier-trace v1 block_tokens=N", then "step,key,kind,obs" rows.
Result<Trace> ReadCsv(std::istream& in, std::string_view name);
Status WriteCsv(const Trace& trace, std::ostream& out);

// Opens "mooncake:PATH", "bin:PATH", "csv:PATH", or a PATH whose extension
// (.jsonl, .bin/.cxlt, .csv) names the format.
Result<Trace> OpenTrace(std::string_view spec);
// Writes by extension (.csv or anything else = binary).
Status SaveTrace(const Trace& trace, const std::string& path);

// Key namespace of Mooncake hash ids: BlockKey{kMooncakeKeySpace, hash_id}.
inline constexpr uint64_t kMooncakeKeySpace = 0x6d6f6f6e63616b65ULL;  // "mooncake"

}  // namespace cxltier::sim
