// The wire codec. Each message's layout is written once, as a Fields()
// function that a Writer and a Reader both walk, so encoding and decoding
// cannot drift apart.
#include "cxltier/wire.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <type_traits>

namespace cxltier::wire {
namespace {

// Fields are little-endian on the wire: a memcpy on little-endian hosts.
template <typename T>
T ToLittle(T v) {
  if constexpr (std::endian::native == std::endian::big) {
    T r = 0;
    for (size_t i = 0; i < sizeof(T); ++i) r = static_cast<T>((r << 8) | ((v >> (8 * i)) & 0xff));
    return r;
  }
  return v;
}

class Writer {
 public:
  explicit Writer(std::vector<uint8_t>& out) : out_(out) {}
  static constexpr bool kReading = false;

  template <typename T>
  void U(T v) {
    static_assert(std::is_unsigned_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    v = ToLittle(v);
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void Field(uint8_t& v) { U(v); }
  void Field(uint16_t& v) { U(v); }
  void Field(uint32_t& v) { U(v); }
  void Field(uint64_t& v) { U(v); }
  void Field(float& v) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    U(bits);
  }
  void Field(BlockKey& k) {
    U(k.hi);
    U(k.lo);
  }
  void Field(Tier& t) { U(static_cast<uint8_t>(t)); }
  // Strings: u32 length then bytes (at most `max` bytes).
  void Str(std::string& s, size_t max) {
    const size_t n = std::min(s.size(), max);
    U(static_cast<uint32_t>(n));
    out_.insert(out_.end(), s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n));
  }
  template <typename T, typename Fn>
  void Vec(std::vector<T>& v, size_t elem_bytes, Fn&& fn) {
    out_.reserve(out_.size() + 4 + v.size() * elem_bytes);
    U(static_cast<uint32_t>(v.size()));
    for (T& e : v) fn(e);
  }
  // A vector whose elements' bytes in memory are their wire bytes.
  template <typename T>
  void PodVec(std::vector<T>& v) {
    U(static_cast<uint32_t>(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    out_.insert(out_.end(), p, p + v.size() * sizeof(T));
  }
  bool ok() const { return true; }

 private:
  std::vector<uint8_t>& out_;
};

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> in) : in_(in) {}
  static constexpr bool kReading = true;

  template <typename T>
  void U(T& v) {
    v = 0;
    if (!Need(sizeof(T))) return;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    v = ToLittle(v);
    pos_ += sizeof(T);
  }
  void Field(uint8_t& v) { U(v); }
  void Field(uint16_t& v) { U(v); }
  void Field(uint32_t& v) { U(v); }
  void Field(uint64_t& v) { U(v); }
  void Field(float& v) {
    uint32_t bits = 0;
    U(bits);
    std::memcpy(&v, &bits, 4);
  }
  void Field(BlockKey& k) {
    U(k.hi);
    U(k.lo);
  }
  void Field(Tier& t) {
    uint8_t b = 0;
    U(b);
    // Tiers 0 .. kMaxTiers-1 (a host may have more than two), or none.
    if (b >= kMaxTiers && b != 0xff) Fail("bad tier value " + std::to_string(b));
    t = static_cast<Tier>(b);
  }
  void Str(std::string& s, size_t max) {
    uint32_t n = 0;
    U(n);
    if (n > max) return Fail("string longer than " + std::to_string(max) + " bytes");
    if (!Need(n)) return;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
  }
  template <typename T, typename Fn>
  void Vec(std::vector<T>& v, size_t elem_bytes, Fn&& fn) {
    uint32_t n = 0;
    U(n);
    // The count must fit in what is left before anything is allocated.
    if (!ok_ || uint64_t{n} * elem_bytes > in_.size() - pos_) {
      return Fail("element count " + std::to_string(n) + " does not fit the payload");
    }
    v.resize(n);
    for (T& e : v) fn(e);
  }
  template <typename T>
  void PodVec(std::vector<T>& v) {
    uint32_t n = 0;
    U(n);
    if (!ok_ || uint64_t{n} * sizeof(T) > in_.size() - pos_) {
      return Fail("element count " + std::to_string(n) + " does not fit the payload");
    }
    v.resize(n);
    if (n == 0) return;  // memcpy into an empty vector's null data() is undefined
    std::memcpy(v.data(), in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
  }
  void Fail(const std::string& why) {
    if (ok_) error_ = why;
    ok_ = false;
  }
  bool Done() {
    if (ok_ && pos_ != in_.size()) Fail(std::to_string(in_.size() - pos_) + " trailing bytes");
    return ok_;
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

 private:
  bool Need(size_t n) {
    if (!ok_) return false;
    if (in_.size() - pos_ < n) {
      Fail("payload too short");
      return false;
    }
    return true;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  bool ok_ = true;
  std::string error_;
};

constexpr size_t kMaxName = 255;
constexpr size_t kMaxText = 1u << 20;

template <typename Io>
void Fields(Io& io, Hello& m) {
  io.Field(m.model.layers);
  io.Field(m.model.query_heads);
  io.Field(m.model.kv_heads);
  io.Field(m.model.head_dim);
  io.Field(m.model.dtype_bytes);
  io.Field(m.model.block_tokens);
  io.Field(m.max_blocks);
  io.Str(m.client_name, kMaxName);
}
template <typename Io>
void Fields(Io& io, HelloOk& m) {
  io.Field(m.client_id);
  io.Field(m.slots);
  io.Field(m.slot_offset);
  io.Field(m.block_bytes);
  io.Field(m.tick_ms);
  io.Field(m.tiers);
}
template <typename Io>
void Fields(Io& io, RegisterPool& m) {
  uint8_t kind = static_cast<uint8_t>(m.kind);
  io.Field(kind);
  if constexpr (Io::kReading) {
    if (kind > 1) io.Fail("unknown pool kind " + std::to_string(kind));
    m.kind = static_cast<PoolKind>(kind);
  }
  io.Field(m.address);
  io.Field(m.length);
  io.Field(m.stride);
  io.Field(m.blocks);
}
template <typename Io>
void Fields(Io& io, RegisterPoolOk& m) {
  io.Field(m.pool_id);
  uint32_t reserved = 0;
  io.Field(reserved);
  if constexpr (Io::kReading) {
    if (reserved != 0) io.Fail("reserved bytes must be zero");
  }
  for (uint64_t& nodes : m.tier_nodes) io.Field(nodes);
}
template <typename Io>
void Fields(Io& io, CreateTierPool& m) {
  io.Field(m.tier);
  uint8_t source = static_cast<uint8_t>(m.source);
  io.Field(source);
  uint16_t reserved = 0;
  io.Field(reserved);
  if constexpr (Io::kReading) {
    if (m.tier >= kMaxTiers) {
      io.Fail("tier " + std::to_string(m.tier) + " does not exist (at most " +
              std::to_string(kMaxTiers) + " tiers)");
    }
    if (source > 2) io.Fail("unknown tier pool source " + std::to_string(source));
    if (reserved != 0) io.Fail("reserved bytes must be zero");
    m.source = static_cast<TierPoolSource>(source);
  }
  io.Field(m.blocks);
  io.Field(m.stride);
  io.Field(m.offset);
}
template <typename Io>
void Fields(Io& io, CreateTierPoolOk& m) {
  io.Field(m.pool_id);
  io.Field(m.blocks);
  io.Field(m.bytes);
  uint32_t node = static_cast<uint32_t>(m.node);
  io.Field(node);
  m.node = static_cast<int32_t>(node);
}
template <typename Io>
void Fields(Io& io, Admit& m) {
  io.Field(m.pool_id);
  io.Vec(m.entries, 20, [&io](AdmitEntry& e) {
    io.Field(e.key);
    io.Field(e.block_index);
  });
}
template <typename Io>
void Fields(Io& io, AdmitOk& m) {
  io.Vec(m.results, 6, [&io](AdmitResult& r) {
    io.Field(r.slot);
    io.Field(r.tier);
    io.Field(r.restored);
  });
}
template <typename Io>
void Fields(Io& io, Release& m) {
  io.Vec(m.keys, 16, [&io](BlockKey& k) { io.Field(k); });
}
template <typename Io>
void Fields(Io& io, ReleaseOk& m) {
  io.Field(m.released);
  io.Field(m.unknown);
}
template <typename Io>
void Fields(Io& io, Report& m) {
  // The hot message: on little-endian hosts an Observation's bytes are its
  // wire bytes (u32 slot, f32 mass), copied in one go.
  static_assert(sizeof(Observation) == 8 && offsetof(Observation, slot) == 0 &&
                offsetof(Observation, mass) == 4 && std::is_trivially_copyable_v<Observation>);
  if constexpr (std::endian::native == std::endian::little) return io.PodVec(m.observations);
  io.Vec(m.observations, 8, [&io](Observation& o) {
    io.Field(o.slot);
    io.Field(o.mass);
  });
}
template <typename Io>
void Fields(Io& io, ReportOk& m) {
  io.Field(m.accepted);
  io.Field(m.rejected);
}
template <typename Io>
void Fields(Io& io, QueryTiers& m) {
  io.Vec(m.keys, 16, [&io](BlockKey& k) { io.Field(k); });
}
template <typename Io>
void Fields(Io& io, QueryTiersOk& m) {
  io.Vec(m.tiers, 1, [&io](Tier& t) { io.Field(t); });
}
template <typename Io>
void Fields(Io& io, Hint& m) {
  uint8_t kind = static_cast<uint8_t>(m.kind);
  io.Field(kind);
  io.Field(m.group);
  if constexpr (Io::kReading) {
    if (kind < 1 || kind > 3) io.Fail("unknown hint kind " + std::to_string(kind) + " (1 to 3)");
    if (m.group == 0) io.Fail("a hint names group 0 (groups are nonzero)");
    m.kind = static_cast<HintKind>(kind);
  }
  io.Vec(m.keys, 16, [&io](BlockKey& k) { io.Field(k); });
}
template <typename Io>
void Fields(Io& io, HintOk& m) {
  io.Field(m.grouped);
  io.Field(m.unknown);
  io.Field(m.applied);
  if constexpr (Io::kReading) {
    if (m.applied > 1) io.Fail("applied must be 0 or 1");
  }
}
template <typename Io>
void Fields(Io& io, Stats& m) {
  io.Str(m.what, kMaxName);
}
template <typename Io>
void Fields(Io& io, StatsOk& m) {
  io.Str(m.json, kMaxText * 16);
}
template <typename Io>
void Fields(Io& io, Admin& m) {
  uint8_t op = static_cast<uint8_t>(m.op);
  io.Field(op);
  if constexpr (Io::kReading) {
    if (op < 1 || op > static_cast<uint8_t>(AdminOp::kSetQuota)) {
      io.Fail("unknown admin operation " + std::to_string(op));
    }
    m.op = static_cast<AdminOp>(op);
  }
  io.Str(m.arg, kMaxName);
}
template <typename Io>
void Fields(Io& io, AdminOk& m) {
  io.Str(m.text, kMaxText);
}
template <typename Io>
void Fields(Io& io, Error& m) {
  uint32_t code = static_cast<uint32_t>(m.code);
  io.Field(code);
  if constexpr (Io::kReading) {
    if (code == 0) io.Fail("an error message with code 0 (ok)");
    m.code = static_cast<ErrorCode>(code);
  }
  io.Str(m.message, kMaxText);
}

template <typename M>
void EncodeMessage(MsgType type, const M& msg, uint32_t request_id, std::vector<uint8_t>& out) {
  const size_t start = out.size();
  out.resize(start + kHeaderBytes);
  Writer w(out);
  Fields(w, const_cast<M&>(msg));  // the writer only reads
  const uint32_t payload = static_cast<uint32_t>(out.size() - start - kHeaderBytes);
  std::vector<uint8_t> head;
  Writer h(head);
  h.U(kMagic);
  h.U(kVersion);
  h.U(static_cast<uint16_t>(type));
  h.U(payload);
  h.U(request_id);
  std::memcpy(out.data() + start, head.data(), kHeaderBytes);
}

template <typename M>
Status DecodeMessage(std::span<const uint8_t> p, M* m) {
  Reader r(p);
  Fields(r, *m);
  if (!r.Done()) return Status::Fail(ErrorCode::kBadPayload, r.error());
  return Status::Ok();
}

}  // namespace

const char* ErrorName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk:
      return "ok";
    case ErrorCode::kBadFrame:
      return "bad-frame";
    case ErrorCode::kBadVersion:
      return "bad-version";
    case ErrorCode::kUnknownType:
      return "unknown-type";
    case ErrorCode::kTooLarge:
      return "too-large";
    case ErrorCode::kBadPayload:
      return "bad-payload";
    case ErrorCode::kNotReady:
      return "not-ready";
    case ErrorCode::kBadPool:
      return "bad-pool";
    case ErrorCode::kLimit:
      return "limit";
    case ErrorCode::kBadSlot:
      return "bad-slot";
    case ErrorCode::kDenied:
      return "denied";
    case ErrorCode::kInternal:
      return "internal";
    case ErrorCode::kGeometry:
      return "geometry";
    case ErrorCode::kNoLease:
      return "no-lease";
    case ErrorCode::kBusy:
      return "busy";
  }
  return "unknown-error";
}

#define CXLTIER_WIRE_MESSAGE(Type, Tag)                                        \
  void Encode(const Type& m, uint32_t request_id, std::vector<uint8_t>& out) { \
    EncodeMessage(MsgType::Tag, m, request_id, out);                           \
  }                                                                            \
  Status Decode(std::span<const uint8_t> p, Type* m) { return DecodeMessage(p, m); }
CXLTIER_WIRE_MESSAGE(Hello, kHello)
CXLTIER_WIRE_MESSAGE(HelloOk, kHelloOk)
CXLTIER_WIRE_MESSAGE(RegisterPool, kRegisterPool)
CXLTIER_WIRE_MESSAGE(RegisterPoolOk, kRegisterPoolOk)
CXLTIER_WIRE_MESSAGE(Admit, kAdmit)
CXLTIER_WIRE_MESSAGE(AdmitOk, kAdmitOk)
CXLTIER_WIRE_MESSAGE(Release, kRelease)
CXLTIER_WIRE_MESSAGE(ReleaseOk, kReleaseOk)
CXLTIER_WIRE_MESSAGE(Report, kReport)
CXLTIER_WIRE_MESSAGE(ReportOk, kReportOk)
CXLTIER_WIRE_MESSAGE(QueryTiers, kQueryTiers)
CXLTIER_WIRE_MESSAGE(QueryTiersOk, kQueryTiersOk)
CXLTIER_WIRE_MESSAGE(Stats, kStats)
CXLTIER_WIRE_MESSAGE(StatsOk, kStatsOk)
CXLTIER_WIRE_MESSAGE(Error, kError)
CXLTIER_WIRE_MESSAGE(Admin, kAdmin)
CXLTIER_WIRE_MESSAGE(AdminOk, kAdminOk)
CXLTIER_WIRE_MESSAGE(CreateTierPool, kCreateTierPool)
CXLTIER_WIRE_MESSAGE(CreateTierPoolOk, kCreateTierPoolOk)
CXLTIER_WIRE_MESSAGE(Hint, kHint)
CXLTIER_WIRE_MESSAGE(HintOk, kHintOk)
#undef CXLTIER_WIRE_MESSAGE

std::optional<Header> DecodeHeader(std::span<const uint8_t> bytes) {
  if (bytes.size() < kHeaderBytes) return std::nullopt;
  Reader r(bytes.first(kHeaderBytes));
  Header h;
  uint16_t type = 0;
  r.U(h.magic);
  r.U(h.version);
  r.U(type);
  r.U(h.payload_bytes);
  r.U(h.request_id);
  h.type = static_cast<MsgType>(type);
  return h;
}

Status CheckHeader(const Header& h, uint32_t max_payload) {
  if (h.magic != kMagic)
    return Status::Fail(ErrorCode::kBadFrame, "bad magic: not a cxltier frame");
  if (h.version != kVersion) {
    return Status::Fail(ErrorCode::kBadVersion, "protocol version " + std::to_string(h.version) +
                                                    " not supported; this daemon speaks " +
                                                    std::to_string(kVersion));
  }
  const uint16_t t = static_cast<uint16_t>(h.type);
  if (t < static_cast<uint16_t>(MsgType::kHello) || t > static_cast<uint16_t>(MsgType::kHintOk)) {
    return Status::Fail(ErrorCode::kUnknownType, "unknown message type " + std::to_string(t));
  }
  if (h.payload_bytes > max_payload) {
    return Status::Fail(ErrorCode::kTooLarge, "payload of " + std::to_string(h.payload_bytes) +
                                                  " bytes exceeds the limit of " +
                                                  std::to_string(max_payload));
  }
  return Status::Ok();
}

}  // namespace cxltier::wire
