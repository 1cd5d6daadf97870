#include "trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <istream>
#include <ostream>
#include <unordered_map>

namespace cxltier::sim {
namespace {

constexpr char kMagic[8] = {'C', 'X', 'L', 'T', 'R', 'A', 'C', 'E'};
constexpr uint32_t kVersion = 1;        // no groups
constexpr uint32_t kVersionGroups = 2;  // a group number per key after the keys
// The daemon's moves recorded: the clock of step 0 (u64) after the header,
// then version 2's tables (the group table all 0 when there are no groups).
constexpr uint32_t kVersionMoves = 3;
constexpr uint32_t kHeaderBytes = 32;
constexpr uint32_t kLastKind = static_cast<uint32_t>(EventKind::kLeader);
// Refuse headers that promise more than this many records (a hostile or corrupt
// file must not make us allocate terabytes).
constexpr uint64_t kMaxRecords = uint64_t{1} << 32;

// Interns keys into dense indices.
class KeyTable {
 public:
  explicit KeyTable(Trace* t) : t_(t) {}
  uint32_t Index(const BlockKey& k) {
    auto [it, fresh] = index_.try_emplace(k, static_cast<uint32_t>(t_->keys.size()));
    if (fresh) t_->keys.push_back(k);
    return it->second;
  }

 private:
  Trace* t_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> index_;
};

void PutU32(std::ostream& out, uint32_t v) {
  unsigned char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
  out.write(reinterpret_cast<const char*>(b), 4);
}
void PutU64(std::ostream& out, uint64_t v) {
  PutU32(out, static_cast<uint32_t>(v));
  PutU32(out, static_cast<uint32_t>(v >> 32));
}
uint32_t GetU32(const unsigned char* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
uint64_t GetU64(const unsigned char* p) { return GetU32(p) | uint64_t{GetU32(p + 4)} << 32; }

std::string Where(std::string_view name, size_t line) {
  return std::string(name) + ":" + std::to_string(line) + ": ";
}

// A trace (or a trace spec) that does not match its format.
Status Malformed(std::string message) {
  return Status::Fail(wire::ErrorCode::kBadPayload, std::move(message));
}

}  // namespace

size_t Trace::touches() const {
  size_t n = 0;
  for (const TraceEvent& e : events) n += e.kind == EventKind::kTouch;
  return n;
}

Status Trace::Validate() const {
  if (block_tokens == 0) return Malformed("block_tokens is 0");
  if (!groups.empty() && groups.size() != keys.size()) return Malformed("not one group per key");
  uint32_t step = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const TraceEvent& e = events[i];
    if (static_cast<uint32_t>(e.kind) > kLastKind) {
      return Malformed("event " + std::to_string(i) + ": unknown kind");
    }
    if (IsMoveEvent(e.kind) && !recorded_moves) {
      return Malformed("event " + std::to_string(i) +
                       ": a recorded plan or move outcome in a trace that records no moves");
    }
    if (e.kind == EventKind::kHint) {
      if (e.key == 0) return Malformed("event " + std::to_string(i) + ": a hint names group 0");
      if (e.obs != 1.0f && e.obs != 2.0f && e.obs != 3.0f) {
        return Malformed("event " + std::to_string(i) + ": a hint's kind must be 1, 2 or 3");
      }
    } else if (e.kind == EventKind::kHeld) {
      // Its key is a count of blocks, its observation 0.
      if (e.obs != 0.0f) {
        return Malformed("event " + std::to_string(i) + ": a held count's observation must be 0");
      }
    } else if (e.kind == EventKind::kLeader) {
      // Its key is a candidate's place in the policy's spec (the replay
      // checks it against its policy), its observation 0.
      if (e.obs != 0.0f) {
        return Malformed("event " + std::to_string(i) +
                         ": a leader change's observation must be 0");
      }
      // The change made by the touch before it, or the leader at the start.
      if (i > 0 && events[i - 1].kind != EventKind::kTouch) {
        return Malformed("event " + std::to_string(i) +
                         ": a leader change follows a touch or opens the trace");
      }
    } else if (e.kind == EventKind::kPlan) {
      // Its key is the number of moves planned, its observation its budget
      // in blocks (0: the recording's migrate_bytes_per_tick).
      if (!(e.obs >= 0.0f && e.obs <= 16777216.0f && e.obs == std::floor(e.obs)))
        return Malformed("event " + std::to_string(i) +
                         ": a plan's budget must be a whole number of blocks, 0 to 2^24");
    } else if (e.key >= keys.size()) {
      return Malformed("event " + std::to_string(i) + ": key index out of range");
    }
    if (e.kind == EventKind::kOutcome && e.obs != 0.0f && e.obs != 1.0f) {
      return Malformed("event " + std::to_string(i) +
                       ": a move outcome must be 1 (done) or 0 (not done)");
    }
    if ((e.kind == EventKind::kAdmit || e.kind == EventKind::kPlace ||
         e.kind == EventKind::kRelocated) &&
        !(e.obs >= 0.0f && e.obs < kMaxTiers && e.obs == std::floor(e.obs))) {
      return Malformed("event " + std::to_string(i) + ": " +
                       (e.kind == EventKind::kRelocated ? "a relocation's" : "an admit's") +
                       " tier must be a whole number, 0 to " + std::to_string(kMaxTiers - 1));
    }
    if (!std::isfinite(e.obs) || e.obs < 0) {
      return Malformed("event " + std::to_string(i) + ": observation is not a finite number >= 0");
    }
    if (e.step < step) return Malformed("event " + std::to_string(i) + ": step goes backwards");
    step = e.step;
  }
  return Status::Ok();
}

Result<Trace> ReadMooncake(std::istream& in, std::string_view name) {
  Trace t;
  t.name = "mooncake";
  t.block_tokens = 512;
  KeyTable keys(&t);
  std::string line;
  size_t lineno = 0;
  uint32_t step = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Malformed(Where(name, lineno) + "not a JSON object");
    }
    const auto ids = j.find("hash_ids");
    if (ids == j.end() || !ids->is_array()) {
      return Malformed(Where(name, lineno) + "no \"hash_ids\" array");
    }
    for (const auto& id : *ids) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) {
        return Malformed(Where(name, lineno) + "hash id is not a non-negative integer");
      }
      const uint32_t k = keys.Index(BlockKey{kMooncakeKeySpace, id.get<uint64_t>()});
      t.events.push_back(TraceEvent{step, k, 1.0f, EventKind::kTouch});
    }
    if (step == UINT32_MAX) {
      return Malformed(Where(name, lineno) + "too many requests");
    }
    ++step;
  }
  if (lineno == 0) return Malformed(std::string(name) + ": empty trace");
  return t;
}

Result<Trace> ReadMooncakeFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::Internal(path + ": cannot open: " + std::strerror(errno));
  return ReadMooncake(in, path);
}

Status WriteBinary(const Trace& t, std::ostream& out) {
  if (!t.groups.empty() && t.groups.size() != t.keys.size()) {
    return Malformed("not one group per key");
  }
  out.write(kMagic, sizeof(kMagic));
  PutU32(out, t.recorded_moves ? kVersionMoves : t.groups.empty() ? kVersion : kVersionGroups);
  PutU32(out, t.block_tokens);
  PutU64(out, t.keys.size());
  PutU64(out, t.events.size());
  if (t.recorded_moves) PutU64(out, t.first_tick);
  for (const BlockKey& k : t.keys) {
    PutU64(out, k.hi);
    PutU64(out, k.lo);
  }
  if (!t.groups.empty()) {
    for (uint32_t g : t.groups) PutU32(out, g);
  } else if (t.recorded_moves) {
    for (size_t k = 0; k < t.keys.size(); ++k) PutU32(out, 0);
  }
  for (const TraceEvent& e : t.events) {
    uint32_t obs_bits;
    std::memcpy(&obs_bits, &e.obs, 4);
    PutU32(out, e.step);
    PutU32(out, e.key);
    PutU32(out, obs_bits);
    PutU32(out, static_cast<uint32_t>(e.kind));
  }
  return out ? Status::Ok() : Status::Internal("write failed");
}

Result<Trace> ReadBinary(std::istream& in, std::string_view name) {
  Trace t;
  t.name = std::string(name);
  unsigned char h[kHeaderBytes];
  if (!in.read(reinterpret_cast<char*>(h), kHeaderBytes)) {
    return Malformed(std::string(name) + ": shorter than the 32-byte header");
  }
  if (std::memcmp(h, kMagic, 8) != 0) {
    return Malformed(std::string(name) + ": not a cxltier trace (bad magic)");
  }
  const uint32_t version = GetU32(h + 8);
  if (version != kVersion && version != kVersionGroups && version != kVersionMoves) {
    return Malformed(std::string(name) + ": unsupported version " + std::to_string(GetU32(h + 8)) +
                     " (this reader knows versions 1 to 3)");
  }
  t.block_tokens = GetU32(h + 12);
  const uint64_t n_keys = GetU64(h + 16), n_events = GetU64(h + 24);
  if (n_keys > kMaxRecords || n_events > kMaxRecords) {
    return Malformed(std::string(name) + ": header claims an absurd number of records");
  }
  const bool grouped = version == kVersionGroups || version == kVersionMoves;
  t.recorded_moves = version == kVersionMoves;
  if (t.recorded_moves) {
    unsigned char clock[8];
    if (!in.read(reinterpret_cast<char*>(clock), sizeof(clock))) {
      return Malformed(std::string(name) + ": truncated in the clock of step 0");
    }
    t.first_tick = GetU64(clock);
  }
  // Read in chunks so a lying header cannot make us allocate before the bytes exist.
  unsigned char buf[16 * 4096];
  for (uint64_t done = 0; done < n_keys;) {
    const uint64_t n = std::min<uint64_t>(n_keys - done, 4096);
    if (!in.read(reinterpret_cast<char*>(buf), static_cast<std::streamsize>(16 * n))) {
      return Malformed(std::string(name) + ": truncated in the key table");
    }
    for (uint64_t i = 0; i < n; ++i)
      t.keys.push_back({GetU64(buf + 16 * i), GetU64(buf + 16 * i + 8)});
    done += n;
  }
  for (uint64_t done = 0; grouped && done < n_keys;) {
    const uint64_t n = std::min<uint64_t>(n_keys - done, 4096);
    if (!in.read(reinterpret_cast<char*>(buf), static_cast<std::streamsize>(4 * n))) {
      return Malformed(std::string(name) + ": truncated in the group table");
    }
    for (uint64_t i = 0; i < n; ++i) t.groups.push_back(GetU32(buf + 4 * i));
    done += n;
  }
  for (uint64_t done = 0; done < n_events;) {
    const uint64_t n = std::min<uint64_t>(n_events - done, 4096);
    if (!in.read(reinterpret_cast<char*>(buf), static_cast<std::streamsize>(16 * n))) {
      return Malformed(std::string(name) + ": truncated in the events");
    }
    for (uint64_t i = 0; i < n; ++i) {
      const unsigned char* p = buf + 16 * i;
      TraceEvent e{GetU32(p), GetU32(p + 4), 0.0f, EventKind::kTouch};
      const uint32_t obs_bits = GetU32(p + 8);
      std::memcpy(&e.obs, &obs_bits, 4);
      const uint32_t kind = GetU32(p + 12);
      if (kind > kLastKind ||
          (kind > static_cast<uint32_t>(EventKind::kHint) && version != kVersionMoves)) {
        return Malformed(std::string(name) + ": event " + std::to_string(done + i) +
                         ": unknown kind " + std::to_string(kind) + " for a version " +
                         std::to_string(version) + " trace");
      }
      e.kind = static_cast<EventKind>(kind);
      t.events.push_back(e);
    }
    done += n;
  }
  if (in.peek() != std::char_traits<char>::eof()) {
    return Malformed(std::string(name) + ": trailing bytes after the last event");
  }
  // Version 3 always has the table: all 0 is no groups.
  if (version == kVersionMoves &&
      std::all_of(t.groups.begin(), t.groups.end(), [](uint32_t g) { return g == 0; })) {
    t.groups.clear();
  }
  if (Status st = t.Validate(); !st.ok()) return st.Context(std::string(name) + ": ");
  return t;
}

Status WriteCsv(const Trace& t, std::ostream& out) {
  if (!t.groups.empty())
    return Malformed("CSV carries no groups or hints: write the binary format");
  if (t.recorded_moves) {
    return Malformed(
        "CSV carries no recorded plans or move outcomes (cxltier-sim --moves recorded): write "
        "the binary format");
  }
  out << "# cxltier-trace v1 block_tokens=" << t.block_tokens << "\n";
  out << "step,key,kind,obs\n";
  char obs[32];
  for (const TraceEvent& e : t.events) {
    std::snprintf(obs, sizeof(obs), "%.9g", static_cast<double>(e.obs));
    out << e.step << ',' << t.keys[e.key].ToString() << ','
        << (e.kind == EventKind::kTouch     ? "touch"
            : e.kind == EventKind::kRelease ? "release"
                                            : "admit")
        << ',' << obs << '\n';
  }
  return out ? Status::Ok() : Status::Internal("write failed");
}

Result<Trace> ReadCsv(std::istream& in, std::string_view name) {
  Trace t;
  t.name = std::string(name);
  KeyTable keys(&t);
  std::string line;
  size_t lineno = 0;
  bool header_seen = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    if (line[0] == '#') {
      const auto at = line.find("block_tokens=");
      if (at != std::string::npos) {
        const char* b = line.data() + at + 13;
        const char* e = line.data() + line.size();
        uint32_t v = 0;
        auto [p, ec] = std::from_chars(b, e, v);
        if (ec != std::errc() || v == 0) {
          return Malformed(Where(name, lineno) + "bad block_tokens");
        }
        t.block_tokens = v;
      }
      continue;
    }
    if (!header_seen) {
      header_seen = true;
      if (line == "step,key,kind,obs") continue;
      return Malformed(Where(name, lineno) + "expected the header 'step,key,kind,obs'");
    }
    std::string_view f[4];
    size_t start = 0;
    int n = 0;
    for (; n < 4; ++n) {
      const size_t comma = line.find(',', start);
      if (n < 3 && comma == std::string::npos) break;
      f[n] = std::string_view(line).substr(start, n < 3 ? comma - start : std::string::npos);
      start = comma + 1;
    }
    if (n != 4 || f[3].find(',') != std::string_view::npos) {
      return Malformed(Where(name, lineno) + "expected 4 fields");
    }
    TraceEvent e{0, 0, 0.0f, EventKind::kTouch};
    if (auto [p, ec] = std::from_chars(f[0].data(), f[0].data() + f[0].size(), e.step);
        ec != std::errc() || p != f[0].data() + f[0].size()) {
      return Malformed(Where(name, lineno) + "bad step");
    }
    BlockKey k;
    if (!BlockKey::Parse(f[1], &k)) {
      return Malformed(Where(name, lineno) + "bad key (want 32 hex digits)");
    }
    e.key = keys.Index(k);
    if (f[2] == "touch") {
      e.kind = EventKind::kTouch;
    } else if (f[2] == "release") {
      e.kind = EventKind::kRelease;
    } else if (f[2] == "admit") {
      e.kind = EventKind::kAdmit;
    } else {
      return Malformed(Where(name, lineno) + "kind must be touch, release or admit");
    }
    double obs = 0;
    if (auto [p, ec] = std::from_chars(f[3].data(), f[3].data() + f[3].size(), obs);
        ec != std::errc() || p != f[3].data() + f[3].size()) {
      return Malformed(Where(name, lineno) + "bad obs");
    }
    e.obs = static_cast<float>(obs);
    t.events.push_back(e);
  }
  if (!header_seen) {
    return Malformed(std::string(name) + ": empty trace");
  }
  if (Status st = t.Validate(); !st.ok()) return st.Context(std::string(name) + ": ");
  return t;
}

Result<Trace> OpenTrace(std::string_view spec) {
  std::string format;
  std::string path(spec);
  if (const auto colon = spec.find(':'); colon != std::string_view::npos) {
    const std::string_view prefix = spec.substr(0, colon);
    if (prefix == "mooncake" || prefix == "bin" || prefix == "csv") {
      format = std::string(prefix);
      path = std::string(spec.substr(colon + 1));
    }
  }
  auto ends_with = [&path](std::string_view s) { return path.ends_with(s); };
  if (format.empty()) {
    if (ends_with(".jsonl"))
      format = "mooncake";
    else if (ends_with(".csv"))
      format = "csv";
    else if (ends_with(".bin") || ends_with(".cxlt"))
      format = "bin";
    else
      return Malformed(path + ": cannot tell the format; use mooncake:, bin: or csv:");
  }
  std::ifstream in(path, format == "bin" ? std::ios::binary : std::ios::in);
  if (!in) return Status::Internal(path + ": cannot open: " + std::strerror(errno));
  if (format == "mooncake") return ReadMooncake(in, path);
  if (format == "csv") return ReadCsv(in, path);
  return ReadBinary(in, path);
}

Status SaveTrace(const Trace& t, const std::string& path) {
  const bool csv = path.ends_with(".csv");
  std::ofstream out(path, csv ? std::ios::out : std::ios::binary);
  if (!out) return Status::Internal(path + ": cannot create: " + std::strerror(errno));
  const Status st = csv ? WriteCsv(t, out) : WriteBinary(t, out);
  out.close();
  if (!st.ok()) return st.Context(path + ": ");
  if (!out) return Status::Internal(path + ": write failed");
  return Status::Ok();
}

}  // namespace cxltier::sim
