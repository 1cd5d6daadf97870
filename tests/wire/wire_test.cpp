// The wire codec: every message round-trips; hostile bytes are rejected with a reason.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "cxltier/client.h"
#include "cxltier/segment.h"
#include "cxltier/wire.h"
#include "server/segment.h"

namespace cxltier::wire {
namespace {

template <typename M>
M RoundTrip(const M& in, MsgType want_type) {
  std::vector<uint8_t> buf;
  Encode(in, 77, buf);
  auto h = DecodeHeader(buf);
  EXPECT_TRUE(h.has_value());
  EXPECT_EQ(h->type, want_type);
  EXPECT_EQ(h->request_id, 77u);
  EXPECT_EQ(h->payload_bytes, buf.size() - kHeaderBytes);
  EXPECT_TRUE(CheckHeader(*h, kDefaultMaxPayload).ok());
  M out;
  EXPECT_EQ(Decode(std::span(buf).subspan(kHeaderBytes), &out).message, "");
  return out;
}

TEST(Wire, EveryMessageRoundTrips) {
  Hello h{kLlama3_70B, 4096, "engine-a"};
  const Hello h2 = RoundTrip(h, MsgType::kHello);
  EXPECT_EQ(h2.model.layers, 80u);
  EXPECT_EQ(h2.model.block_bytes(), kLlama3_70B.block_bytes());
  EXPECT_EQ(h2.max_blocks, 4096u);
  EXPECT_EQ(h2.client_name, "engine-a");

  const HelloOk ok = RoundTrip(HelloOk{9, 100, 4096, 5 << 20, 100, 3}, MsgType::kHelloOk);
  EXPECT_EQ(ok.client_id, 9u);
  EXPECT_EQ(ok.block_bytes, 5u << 20);
  EXPECT_EQ(ok.tiers, 3u);

  const RegisterPool rp =
      RoundTrip(RegisterPool{PoolKind::kRange, 0x7f0000000000, 1 << 30, 5 << 20, 204},
                MsgType::kRegisterPool);
  EXPECT_EQ(rp.kind, PoolKind::kRange);
  EXPECT_EQ(rp.address, 0x7f0000000000u);
  EXPECT_EQ(rp.blocks, 204u);

  EXPECT_EQ(RoundTrip(RegisterPoolOk{3}, MsgType::kRegisterPoolOk).pool_id, 3u);
  RegisterPoolOk rpo{3};
  rpo.tier_nodes[0] = 1;
  rpo.tier_nodes[kMaxTiers - 1] = 1ull << 63;
  EXPECT_EQ(RoundTrip(rpo, MsgType::kRegisterPoolOk).tier_nodes, rpo.tier_nodes);

  Admit a{2, {{BlockKey{1, 2}, 5}, {BlockKey{3, 4}, 6}}};
  const Admit a2 = RoundTrip(a, MsgType::kAdmit);
  ASSERT_EQ(a2.entries.size(), 2u);
  EXPECT_EQ(a2.entries[1].key, (BlockKey{3, 4}));
  EXPECT_EQ(a2.entries[1].block_index, 6u);

  const AdmitOk ao =
      RoundTrip(AdmitOk{{{1, Tier::kSlow, 1}, {2, Tier::kNone, 0}}}, MsgType::kAdmitOk);
  ASSERT_EQ(ao.results.size(), 2u);
  EXPECT_EQ(ao.results[0].tier, Tier::kSlow);
  EXPECT_EQ(ao.results[0].restored, 1);
  // A host with more than two tiers: every tier below kMaxTiers goes through.
  const AdmitOk deep =
      RoundTrip(AdmitOk{{{3, TierAt(2), 0}, {4, TierAt(kMaxTiers - 1), 0}}}, MsgType::kAdmitOk);
  ASSERT_EQ(deep.results.size(), 2u);
  EXPECT_EQ(deep.results[0].tier, TierAt(2));
  EXPECT_EQ(deep.results[1].tier, TierAt(kMaxTiers - 1));
  EXPECT_EQ(RoundTrip(QueryTiersOk{{TierAt(2)}}, MsgType::kQueryTiersOk).tiers.at(0), TierAt(2));

  EXPECT_EQ(RoundTrip(Release{{BlockKey{5, 6}}}, MsgType::kRelease).keys.at(0), (BlockKey{5, 6}));
  EXPECT_EQ(RoundTrip(ReleaseOk{3, 1}, MsgType::kReleaseOk).unknown, 1u);
  const Report r = RoundTrip(Report{{{7, 0.25f}, {8, 1.5f}}}, MsgType::kReport);
  EXPECT_EQ(r.observations.at(1).mass, 1.5f);
  EXPECT_EQ(RoundTrip(ReportOk{2, 1}, MsgType::kReportOk).rejected, 1u);
  EXPECT_EQ(RoundTrip(QueryTiers{{BlockKey{1, 1}}}, MsgType::kQueryTiers).keys.size(), 1u);
  EXPECT_EQ(RoundTrip(QueryTiersOk{{Tier::kFast, Tier::kNone}}, MsgType::kQueryTiersOk).tiers.at(1),
            Tier::kNone);
  EXPECT_EQ(RoundTrip(Stats{"status"}, MsgType::kStats).what, "status");
  const Admin ad = RoundTrip(Admin{AdminOp::kSetPolicy, "ema:0.01"}, MsgType::kAdmin);
  EXPECT_EQ(ad.op, AdminOp::kSetPolicy);
  EXPECT_EQ(ad.arg, "ema:0.01");
  const Admin q =
      RoundTrip(Admin{AdminOp::kSetQuota, "uid=1001 tier0=8GiB guarantee=4GiB"}, MsgType::kAdmin);
  EXPECT_EQ(q.op, AdminOp::kSetQuota);
  EXPECT_EQ(q.arg, "uid=1001 tier0=8GiB guarantee=4GiB");
  EXPECT_EQ(RoundTrip(AdminOk{"done"}, MsgType::kAdminOk).text, "done");
  {  // an unknown admin operation is refused with its number
    Admin bad;
    const std::vector<uint8_t> p = {9, 0, 0, 0, 0};
    const cxltier::Status st = Decode(p, &bad);
    EXPECT_EQ(st.code, ErrorCode::kBadPayload);
    EXPECT_NE(st.message.find("admin operation 9"), std::string::npos) << st.message;
    // The first past the last known (kSetQuota = 6), and 0.
    for (uint8_t op : {uint8_t{7}, uint8_t{0}}) {
      const std::vector<uint8_t> past = {op, 0, 0, 0, 0};
      EXPECT_NE(Decode(past, &bad).message.find("admin operation " + std::to_string(op)),
                std::string::npos);
    }
  }
  EXPECT_EQ(RoundTrip(StatsOk{"{\"a\":1}"}, MsgType::kStatsOk).json, "{\"a\":1}");
  const Error e = RoundTrip(Error{ErrorCode::kLimit, "too many"}, MsgType::kError);
  EXPECT_EQ(e.code, ErrorCode::kLimit);
  EXPECT_EQ(e.message, "too many");
}

TEST(Wire, TierPoolMessagesRoundTripAndRefuseBadValues) {
  CreateTierPool c;
  c.tier = 1;
  c.source = TierPoolSource::kDevdax;
  c.blocks = 4096;
  c.stride = 5 << 20;
  c.offset = 2 << 20;
  const CreateTierPool c2 = RoundTrip(c, MsgType::kCreateTierPool);
  EXPECT_EQ(c2.tier, 1);
  EXPECT_EQ(c2.source, TierPoolSource::kDevdax);
  EXPECT_EQ(c2.blocks, 4096u);
  EXPECT_EQ(c2.stride, uint64_t{5} << 20);
  EXPECT_EQ(c2.offset, uint64_t{2} << 20);
  const CreateTierPoolOk ok =
      RoundTrip(CreateTierPoolOk{3, 24, 24u << 20, -1}, MsgType::kCreateTierPoolOk);
  EXPECT_EQ(ok.pool_id, 3u);
  EXPECT_EQ(ok.node, -1);
  // Tier 7 and source 2 (an import) are taken; tier 8, source 3 and reserved
  // bytes set are each refused with their reason.
  c.tier = 7;
  c.source = TierPoolSource::kImport;
  EXPECT_EQ(RoundTrip(c, MsgType::kCreateTierPool).tier, 7);
  EXPECT_EQ(RoundTrip(c, MsgType::kCreateTierPool).source, TierPoolSource::kImport);
  for (auto [at, value, why] :
       {std::tuple{0, 8, "tier 8"}, std::tuple{1, 3, "source"}, std::tuple{2, 1, "reserved"}}) {
    std::vector<uint8_t> buf;
    Encode(c, 0, buf);
    std::vector<uint8_t> p(buf.begin() + kHeaderBytes, buf.end());
    p[at] = static_cast<uint8_t>(value);
    CreateTierPool out;
    const Status st = Decode(p, &out);
    EXPECT_EQ(st.code, ErrorCode::kBadPayload);
    EXPECT_NE(st.message.find(why), std::string::npos) << st.message;
  }
}

TEST(Wire, HintMessagesRoundTripAndRefuseBadValues) {
  const Hint h =
      RoundTrip(Hint{HintKind::kSoon, 42, {BlockKey{1, 2}, BlockKey{3, 4}}}, MsgType::kHint);
  EXPECT_EQ(h.kind, HintKind::kSoon);
  EXPECT_EQ(h.group, 42u);
  ASSERT_EQ(h.keys.size(), 2u);
  EXPECT_EQ(h.keys[1], (BlockKey{3, 4}));
  // No keys: the hint applies to the blocks that joined before.
  const Hint empty = RoundTrip(Hint{HintKind::kDone, 0xffffffffu, {}}, MsgType::kHint);
  EXPECT_EQ(empty.kind, HintKind::kDone);
  EXPECT_EQ(empty.group, 0xffffffffu);
  EXPECT_TRUE(empty.keys.empty());
  EXPECT_EQ(RoundTrip(Hint{HintKind::kIdle, 1, {}}, MsgType::kHint).kind, HintKind::kIdle);
  const HintOk ok = RoundTrip(HintOk{5, 2, 1}, MsgType::kHintOk);
  EXPECT_EQ(ok.grouped, 5u);
  EXPECT_EQ(ok.unknown, 2u);
  EXPECT_EQ(ok.applied, 1);

  // The documented layout: kind u8, group u32, count u32, 16 B per key.
  std::vector<uint8_t> buf;
  Encode(Hint{HintKind::kSoon, 0x01020304u, {BlockKey{5, 6}}}, 0, buf);
  const std::vector<uint8_t> p(buf.begin() + kHeaderBytes, buf.end());
  const std::vector<uint8_t> want = {2, 4, 3, 2, 1, 1, 0, 0, 0, 5, 0, 0, 0,
                                     0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(p, want);

  // Kinds 0 and 4 to 255, group 0: refused with the reason.
  for (int kind : {0, 4, 255}) {
    std::vector<uint8_t> bad = p;
    bad[0] = static_cast<uint8_t>(kind);
    Hint out;
    const Status st = Decode(bad, &out);
    EXPECT_EQ(st.code, ErrorCode::kBadPayload);
    EXPECT_NE(st.message.find("hint kind " + std::to_string(kind)), std::string::npos)
        << st.message;
  }
  {
    std::vector<uint8_t> bad = p;
    bad[1] = bad[2] = bad[3] = bad[4] = 0;
    Hint out;
    const Status st = Decode(bad, &out);
    EXPECT_EQ(st.code, ErrorCode::kBadPayload);
    EXPECT_NE(st.message.find("group 0"), std::string::npos) << st.message;
  }
  // A count that does not fit what is left, short and long payloads.
  {
    std::vector<uint8_t> bad = p;
    bad[5] = 2;  // two keys, one present
    Hint out;
    const Status st = Decode(bad, &out);
    EXPECT_EQ(st.code, ErrorCode::kBadPayload);
    EXPECT_NE(st.message.find("does not fit"), std::string::npos) << st.message;
    bad[5] = 0xff, bad[6] = 0xff, bad[7] = 0xff, bad[8] = 0xff;  // 2^32 - 1 keys
    EXPECT_EQ(Decode(bad, &out).code, ErrorCode::kBadPayload);
  }
  Hint out;
  EXPECT_EQ(Decode(std::span(p).first(p.size() - 1), &out).code, ErrorCode::kBadPayload);
  std::vector<uint8_t> longer = p;
  longer.push_back(0);
  EXPECT_NE(Decode(longer, &out).message.find("trailing"), std::string::npos);
  EXPECT_EQ(Decode(std::span(p).first(4), &out).code, ErrorCode::kBadPayload);
  // HintOk: applied is 0 or 1; nine bytes exactly.
  HintOk back;
  const std::vector<uint8_t> ok_bytes = {5, 0, 0, 0, 2, 0, 0, 0, 1};
  ASSERT_EQ(Decode(ok_bytes, &back).message, "");
  EXPECT_EQ(back.grouped, 5u);
  std::vector<uint8_t> bad_ok = ok_bytes;
  bad_ok[8] = 2;
  EXPECT_EQ(Decode(bad_ok, &back).code, ErrorCode::kBadPayload);
  EXPECT_EQ(Decode(std::span(ok_bytes).first(8), &back).code, ErrorCode::kBadPayload);
  // Both types pass the header check; 22 is still unknown.
  Header hd;
  hd.type = MsgType::kHintOk;
  EXPECT_TRUE(CheckHeader(hd, kDefaultMaxPayload).ok());
  hd.type = static_cast<MsgType>(22);
  EXPECT_EQ(CheckHeader(hd, kDefaultMaxPayload).code, ErrorCode::kUnknownType);
}

// The Report payload is copied in bulk: its bytes must still be the
// documented little-endian layout (u32 count, then u32 slot, f32 mass each).
TEST(Wire, ReportBytesAreTheDocumentedLayout) {
  std::vector<uint8_t> out;
  Encode(Report{{{0x01020304u, 1.0f}, {5, -2.0f}}}, 9, out);
  ASSERT_EQ(out.size(), kHeaderBytes + 4 + 16);
  const std::vector<uint8_t> payload(out.begin() + kHeaderBytes, out.end());
  const std::vector<uint8_t> want = {2,    0,    0, 0, 0x04, 0x03, 0x02, 0x01, 0, 0,
                                     0x80, 0x3f, 5, 0, 0,    0,    0,    0,    0, 0xc0};
  EXPECT_EQ(payload, want);
  Report back;
  ASSERT_EQ(Decode(payload, &back).message, "");
  EXPECT_EQ(back.observations.at(0).slot, 0x01020304u);
  EXPECT_EQ(back.observations.at(1).mass, -2.0f);
  // An empty Report (fuzz_wire found a memcpy into the empty vector's null data()).
  const std::vector<uint8_t> empty = {0, 0, 0, 0};
  ASSERT_EQ(Decode(empty, &back).message, "");
  EXPECT_TRUE(back.observations.empty());
  // One byte short of the second observation: rejected before anything is copied.
  EXPECT_FALSE(Decode(std::span(payload).first(payload.size() - 1), &back).ok());
}

TEST(Wire, HeaderChecks) {
  std::vector<uint8_t> buf;
  Encode(Stats{"x"}, 1, buf);
  Header h = *DecodeHeader(buf);
  EXPECT_FALSE(DecodeHeader(std::span(buf).first(15)).has_value());
  Header bad = h;
  bad.magic = 0xdeadbeef;
  EXPECT_EQ(CheckHeader(bad, 1 << 20).code, ErrorCode::kBadFrame);
  bad = h;
  bad.version = kVersion + 1;
  EXPECT_EQ(CheckHeader(bad, 1 << 20).code, ErrorCode::kBadVersion);
  bad = h;
  bad.type = static_cast<MsgType>(99);
  EXPECT_EQ(CheckHeader(bad, 1 << 20).code, ErrorCode::kUnknownType);
  bad = h;
  bad.payload_bytes = 2 << 20;
  const auto big = CheckHeader(bad, 1 << 20);
  EXPECT_EQ(big.code, ErrorCode::kTooLarge);
  EXPECT_NE(big.message.find("exceeds the limit"), std::string::npos);
}

TEST(Wire, HostilePayloadsAreRejected) {
  // A count that promises more elements than bytes follow.
  std::vector<uint8_t> p = {0xff, 0xff, 0xff, 0x7f};
  Release rel;
  std::string err = Decode(p, &rel).message;
  EXPECT_NE(err.find("does not fit"), std::string::npos) << err;
  // Trailing bytes.
  std::vector<uint8_t> buf;
  Encode(ReleaseOk{1, 2}, 0, buf);
  buf.push_back(0);
  ReleaseOk ro;
  err = Decode(std::span(buf).subspan(kHeaderBytes), &ro).message;
  EXPECT_NE(err.find("trailing"), std::string::npos) << err;
  // Short.
  err = Decode(std::span(buf).subspan(kHeaderBytes, 5), &ro).message;
  EXPECT_NE(err.find("too short"), std::string::npos) << err;
  // Bad enum values.
  buf.clear();
  Encode(RegisterPool{PoolKind::kMemfd, 0, 1, 1, 1}, 0, buf);
  buf[kHeaderBytes] = 9;
  RegisterPool rp;
  err = Decode(std::span(buf).subspan(kHeaderBytes), &rp).message;
  EXPECT_NE(err.find("pool kind"), std::string::npos) << err;
  buf.clear();
  Encode(QueryTiersOk{{Tier::kFast}}, 0, buf);
  buf.back() = kMaxTiers;  // the first value past the last tier
  QueryTiersOk q;
  err = Decode(std::span(buf).subspan(kHeaderBytes), &q).message;
  EXPECT_NE(err.find("bad tier value 8"), std::string::npos) << err;
  // Random garbage never crashes any decoder.
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> g(rng() % 64);
    for (auto& b : g) b = static_cast<uint8_t>(rng());
    Hello a;
    Admit b;
    AdmitOk c;
    Report d;
    Error e;
    StatsOk f;
    (void)Decode(g, &a);
    (void)Decode(g, &b);
    (void)Decode(g, &c);
    (void)Decode(g, &d);
    (void)Decode(g, &e);
    (void)Decode(g, &f);
  }
}

TEST(Segment, ObservationsAccumulateAndAreTaken) {
  BlockState s;
  EXPECT_TRUE(AddObservation(&s, 0.25f));
  EXPECT_TRUE(AddObservation(&s, 0.5f));
  server::ClientTotals t = server::ReadTotals(&s);
  EXPECT_EQ(t.touches, 2u);
  EXPECT_EQ(t.mass_q16, 49152u);  // 0.75 x 65536
  EXPECT_FALSE(AddObservation(&s, std::nanf("")));
  EXPECT_FALSE(AddObservation(&s, -1.0f));
  EXPECT_FALSE(AddObservation(&s, 1e9f));
  EXPECT_EQ(server::ReadTotals(&s).touches, 2u);
  // The totals wrap; differences stay right modulo 2^32.
  s.client_touches = 0xffffffffu;
  AddObservation(&s, 1.0f);
  EXPECT_EQ(server::ReadTotals(&s).touches - 0xffffffffu, 1u);
  server::WriteTier(&s, Tier::kSlow);
  EXPECT_EQ(ReadTier(&s), Tier::kSlow);
  // Header page, slots, dirty bits; location words on a cache line; the
  // lease table (64 rows of 32 16-byte entries) on a page.
  EXPECT_EQ(SegmentLocationOffset(2), 4096u + 128u + 64u);
  EXPECT_EQ(SegmentLeaseOffset(2), 8192u);
  EXPECT_EQ(SegmentBytes(2), 8192u + 32768u);
  EXPECT_EQ(SegmentLocationOffset(65), 4096u + 65u * 64u + 64u);
  EXPECT_EQ(SegmentBytes(65), 12288u + 32768u);
}

TEST(Segment, DirtyBitsMarkObservedSlotsUntilTaken) {
  std::vector<BlockState> slots(130);
  std::vector<uint64_t> dirty(SegmentDirtyWords(130));
  ASSERT_EQ(dirty.size(), 3u);
  EXPECT_TRUE(AddObservation(slots.data(), dirty.data(), 0, 1.0f));
  EXPECT_TRUE(AddObservation(slots.data(), dirty.data(), 0, 1.0f));
  EXPECT_TRUE(AddObservation(slots.data(), dirty.data(), 65, 1.0f));
  EXPECT_TRUE(AddObservation(slots.data(), dirty.data(), 129, 1.0f));
  // A rejected observation marks nothing.
  EXPECT_FALSE(AddObservation(slots.data(), dirty.data(), 7, std::nanf("")));
  EXPECT_EQ(server::TakeDirty(dirty.data(), 0), uint64_t{1});
  EXPECT_EQ(server::TakeDirty(dirty.data(), 0), 0u);  // taken: cleared
  EXPECT_EQ(server::TakeDirty(dirty.data(), 1), uint64_t{1} << 1);
  EXPECT_EQ(server::TakeDirty(dirty.data(), 2), uint64_t{1} << 1);
  EXPECT_EQ(server::ReadTotals(&slots[0]).touches, 2u);
  EXPECT_EQ(server::ReadTotals(&slots[7]).touches, 0u);
}

// An ok Status carries no error code (it once read kInternal).
TEST(Status, OkCarriesNoErrorCode) {
  const Status ok = Status::Ok();
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.code, ErrorCode::kOk);
  EXPECT_STREQ(ErrorName(ok.code), "ok");
  const Status bad = Status::Fail(ErrorCode::kLimit, "too many");
  EXPECT_FALSE(bad.ok());
  EXPECT_EQ(bad.code, ErrorCode::kLimit);
  EXPECT_EQ(Status{}.code, ErrorCode::kOk);
  // A failure is never ok, even when asked for with kOk.
  EXPECT_FALSE(Status::Fail(ErrorCode::kOk, "odd").ok());
  // An Error frame whose code says ok is not an error: refused, so a client
  // cannot mistake it for success.
  const std::vector<uint8_t> zero = {0, 0, 0, 0, 0, 0, 0, 0};
  Error e;
  const Status st = Decode(zero, &e);
  EXPECT_EQ(st.code, ErrorCode::kBadPayload);
  EXPECT_NE(st.message.find("code 0"), std::string::npos) << st.message;
}

}  // namespace
}  // namespace cxltier::wire
