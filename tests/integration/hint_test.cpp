// Scheduler hints against a real cxltierd (issue 16, part 2): hints move a
// client's blocks between the tiers, bad hints get clear answers and change
// nothing, and one client's hints never touch another client's groups or
// blocks. Another uid's hints: tests/hostile/hint_attacks_test.cpp.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cxltier/client.h"
#include "cxltier/cxltier.h"
#include "cxltier/wire.h"
#include "daemon_harness.h"
#include "models.h"
#include "numa/migrator.h"

namespace cxltier {
namespace {

using testing::DaemonProcess;
using testing::WaitFor;
using testing::WaitTicks;

// 8 KiB blocks: one layer, one KV head of dim 128, fp16, 16 tokens.
constexpr uint64_t kBlock = 8192;
// Tier 0 holds 8 blocks; LRU (whose set is easy to follow), no hysteresis.
const std::string kConfig =
    "[engine]\ntier0_budget = \"64KiB\"\npolicy = \"lru\"\nhysteresis_ticks = 0\n";

BlockKey A(uint64_t i) { return BlockKey::FromSequence(501, i); }
BlockKey B(uint64_t i) { return BlockKey::FromSequence(502, i); }

struct MemfdPool {
  int fd = -1;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  explicit MemfdPool(uint32_t blocks) : bytes(blocks * kBlock) {
    fd = memfd_create("hint-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(bytes)), 0);
    base = static_cast<uint8_t*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    for (uint64_t i = 0; i < bytes; ++i) base[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  ~MemfdPool() {
    munmap(base, bytes);
    close(fd);
  }
  bool Intact() const {
    for (uint64_t i = 0; i < bytes; ++i) {
      if (base[i] != static_cast<uint8_t>(i * 7 + 1)) return false;
    }
    return true;
  }
};

std::unique_ptr<Client> Connect(const DaemonProcess& d, const std::string& name) {
  Status st;
  auto c = Client::Connect({d.socket(), kTiny8KiB, 64, name}, &st);
  EXPECT_TRUE(c) << st.message;
  return c;
}

nlohmann::json StatusOf(const DaemonProcess& d) {
  std::string text;
  const Status st = Client::DaemonStats(d.socket(), "status", &text);
  EXPECT_TRUE(st.ok()) << st.message;
  return nlohmann::json::parse(text, nullptr, false);
}

// A client with `n` blocks of keys key(0..n-1) at pool blocks first..first+n-1.
struct Holder {
  std::unique_ptr<Client> c;
  uint32_t pool = 0;
  std::vector<BlockKey> keys;
  std::vector<uint32_t> slots;

  Holder(const DaemonProcess& d, const std::string& name, const MemfdPool& p)
      : c(Connect(d, name)) {
    if (c) {
      EXPECT_TRUE(c->RegisterMemfdPool(p.fd, p.bytes, kBlock, p.bytes / kBlock, &pool).ok());
    }
  }
  void Admit(BlockKey (*key)(uint64_t), uint32_t first, uint32_t n) {
    std::vector<wire::AdmitEntry> entries;
    for (uint32_t i = 0; i < n; ++i) entries.push_back({key(i), first + i});
    std::vector<wire::AdmitResult> res;
    ASSERT_TRUE(c->Admit(pool, entries, &res).ok());
    for (uint32_t i = 0; i < n; ++i) {
      keys.push_back(key(i));
      slots.push_back(res[i].slot);
    }
  }
  void TouchAll() {
    for (uint32_t s : slots) c->Observe(s, 1.0f);
  }
  size_t InTier(const std::vector<uint32_t>& which, Tier t) const {
    size_t n = 0;
    for (uint32_t s : which) n += c->TierOf(s) == t;
    return n;
  }
  std::vector<uint32_t> Slots(size_t from, size_t n) const {
    return std::vector<uint32_t>(slots.begin() + static_cast<ptrdiff_t>(from),
                                 slots.begin() + static_cast<ptrdiff_t>(from + n));
  }
};

// (a) Tier 0 full of group A's blocks, B's waiting in tier 1: A idle and B
// soon bring B's blocks back into tier 0 and A's out, with no touch at all.
TEST(DaemonHints, IdleAndSoonMoveBlocksBetweenTiers) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  MemfdPool pool(16);
  Holder h(d, "engine", pool);
  ASSERT_TRUE(h.c);
  // B runs first: its 8 blocks fill tier 0.
  h.Admit(B, 8, 8);
  const std::vector<uint32_t> b = h.Slots(0, 8);
  h.TouchAll();
  ASSERT_TRUE(WaitFor([&] { return h.InTier(b, Tier::kFast) == 8; })) << d.Log();
  // B's user reads: B goes idle (its keys join group 2 with the hint).
  wire::HintOk ok;
  ASSERT_TRUE(h.c->Hint(2, HintKind::kIdle, h.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 8u);
  EXPECT_EQ(ok.unknown, 0u);
  EXPECT_EQ(ok.applied, 1);
  // A runs: its blocks take the room B's idle blocks leave.
  h.Admit(A, 0, 8);
  const std::vector<uint32_t> a = h.Slots(8, 8);
  for (uint32_t s : a) h.c->Observe(s, 1.0f);
  ASSERT_TRUE(WaitFor([&] {
    return h.InTier(a, Tier::kFast) == 8 && h.InTier(b, Tier::kSlow) == 8;
  })) << "A: "
      << h.InTier(a, Tier::kFast) << " fast, B: " << h.InTier(b, Tier::kSlow) << " slow\n"
      << d.Log();
  nlohmann::json st = StatusOf(d);
  EXPECT_GE(st["hints"]["displaced"].get<uint64_t>(), 8u) << st["hints"].dump();

  // A's turn ends (idle, its keys join group 1); B's user answered: B soon.
  // Nothing is touched: the hints alone move the blocks.
  const std::vector<BlockKey> a_keys(h.keys.begin() + 8, h.keys.end());
  ASSERT_TRUE(h.c->Hint(1, HintKind::kIdle, a_keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 8u);
  EXPECT_EQ(ok.applied, 1);
  ASSERT_TRUE(h.c->Hint(2, HintKind::kSoon, {}, &ok).ok());
  EXPECT_EQ(ok.grouped, 0u);
  EXPECT_EQ(ok.applied, 1);
  ASSERT_TRUE(WaitFor([&] {
    return h.InTier(b, Tier::kFast) == 8 && h.InTier(a, Tier::kSlow) == 8;
  })) << "B: "
      << h.InTier(b, Tier::kFast) << " fast, A: " << h.InTier(a, Tier::kSlow) << " slow\n"
      << d.Log();
  // The daemon agrees (the engine's tiers, not only the segment's words).
  std::vector<Tier> tiers;
  ASSERT_TRUE(h.c->QueryTiers(h.keys, &tiers).ok());
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(tiers[i], Tier::kFast) << "B block " << i;
  for (size_t i = 8; i < 16; ++i) EXPECT_EQ(tiers[i], Tier::kSlow) << "A block " << i - 8;
  st = StatusOf(d);
  EXPECT_EQ(st["hints"]["requests"].get<uint64_t>(), 3u);
  EXPECT_EQ(st["hints"]["applied"].get<uint64_t>(), 3u);
  EXPECT_GE(st["hints"]["prefetched"].get<uint64_t>(), 8u) << st["hints"].dump();
  EXPECT_GE(st["hints"]["displaced"].get<uint64_t>(), 16u) << st["hints"].dump();
  EXPECT_EQ(st["migrations"]["failed"], 0) << st.dump();
  // Every page moved was verified where the kernel says it is (both tiers are
  // node 0 here), and no byte changed.
  EXPECT_GT(st["migrations"]["pages_verified"].get<uint64_t>(), 0u);
  auto m = numa::MakeLinuxMigrator();
  for (int node :
       m->Where(numa::PageRange{0, reinterpret_cast<uintptr_t>(pool.base), pool.bytes, true})) {
    EXPECT_EQ(node, 0);
  }
  EXPECT_TRUE(pool.Intact());
  // The group's next touch ends its idle; a done hint marks it to go first.
  ASSERT_TRUE(h.c->Hint(2, HintKind::kDone, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 1);
  // A released block leaves its group: a hint with its key knows it no more.
  ASSERT_TRUE(h.c->Release(h.keys).ok());
  ASSERT_TRUE(h.c->Hint(2, HintKind::kSoon, h.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 0u);
  EXPECT_EQ(ok.unknown, 16u);
  EXPECT_EQ(ok.applied, 0);
}

// Reads one frame and returns its type and payload (false on close or timeout).
bool ReadFrame(int s, wire::Header* h, std::vector<uint8_t>* payload) {
  auto read_all = [s](uint8_t* p, size_t n) {
    for (size_t got = 0; got < n;) {
      const ssize_t r = read(s, p + got, n - got);
      if (r <= 0) return false;
      got += static_cast<size_t>(r);
    }
    return true;
  };
  uint8_t head[wire::kHeaderBytes];
  if (!read_all(head, sizeof(head))) return false;
  *h = *wire::DecodeHeader(head);
  payload->resize(h->payload_bytes);
  return read_all(payload->data(), payload->size());
}

template <typename M>
bool Send(int s, const M& m, uint32_t id) {
  std::vector<uint8_t> buf;
  wire::Encode(m, id, buf);
  return write(s, buf.data(), buf.size()) == static_cast<ssize_t>(buf.size());
}

wire::Error ErrorOf(const wire::Header& h, const std::vector<uint8_t>& p) {
  wire::Error e{wire::ErrorCode::kOk, ""};
  if (h.type == wire::MsgType::kError) {
    EXPECT_TRUE(wire::Decode(p, &e).ok());
  }
  return e;
}

// (b) Every bad hint gets a clear answer, changes nothing, and the daemon
// keeps serving everyone, the sender included.
TEST(DaemonHints, BadInputGetsClearAnswersAndTheDaemonServesOn) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  MemfdPool pool(16);
  Holder good(d, "good", pool);
  Holder bad(d, "bad", pool);
  ASSERT_TRUE(good.c && bad.c);
  good.Admit(A, 0, 4);
  bad.Admit(B, 8, 4);
  good.TouchAll();
  ASSERT_TRUE(WaitFor([&] { return good.InTier(good.slots, Tier::kFast) == 4; })) << d.Log();
  auto still_serving = [&] {
    std::vector<Tier> tiers;
    ASSERT_TRUE(good.c->QueryTiers(good.keys, &tiers).ok());
    for (Tier t : tiers) EXPECT_EQ(t, Tier::kFast);
    std::string json;
    ASSERT_TRUE(good.c->Stats("status", &json).ok());
    ASSERT_TRUE(bad.c->Stats("status", &json).ok());  // the sender too
  };

  // Kinds 0 and 4, group 0: refused by the codec, with the reason.
  for (int kind : {0, 4, 255}) {
    const Status st = bad.c->Hint(7, static_cast<HintKind>(kind), bad.keys);
    EXPECT_EQ(st.code, wire::ErrorCode::kBadPayload) << st.message;
    EXPECT_NE(st.message.find("hint kind " + std::to_string(kind)), std::string::npos)
        << st.message;
    still_serving();
  }
  Status st = bad.c->Hint(0, HintKind::kIdle, bad.keys);
  EXPECT_EQ(st.code, wire::ErrorCode::kBadPayload) << st.message;
  EXPECT_NE(st.message.find("group 0"), std::string::npos) << st.message;
  still_serving();
  // Nothing of those changed anything: the keys are in no group yet.
  wire::HintOk ok;
  ASSERT_TRUE(bad.c->Hint(7, HintKind::kSoon, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 0) << "a refused hint left a group behind";

  // Another client's keys (same uid here) are unknown: counted, never grouped.
  ASSERT_TRUE(bad.c->Hint(9, HintKind::kIdle, good.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 0u);
  EXPECT_EQ(ok.unknown, 4u);
  EXPECT_EQ(ok.applied, 0);
  ASSERT_TRUE(bad.c->Hint(9, HintKind::kDone, good.keys, &ok).ok());
  EXPECT_EQ(ok.unknown, 4u);
  // A group with no blocks: nothing to apply it to.
  ASSERT_TRUE(bad.c->Hint(12345, HintKind::kSoon, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 0);
  EXPECT_EQ(ok.grouped, 0u);
  EXPECT_EQ(ok.unknown, 0u);
  still_serving();
  // The good client's keys were not taken into the other's group: they join
  // its own.
  ASSERT_TRUE(good.c->Hint(9, HintKind::kSoon, good.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 4u);
  EXPECT_EQ(ok.unknown, 0u);
  EXPECT_EQ(ok.applied, 1);

  // Too many keys in one message (the library splits; a raw client does not):
  // limit, "split it"; a hint before hello: not-ready; a payload that does not
  // parse: bad-payload. The connection goes on after each.
  const int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, d.socket().c_str());
  ASSERT_EQ(connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  timeval tv{30, 0};
  setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  wire::Header h;
  std::vector<uint8_t> p;
  ASSERT_TRUE(Send(s, wire::Hint{HintKind::kIdle, 1, {}}, 1));
  ASSERT_TRUE(ReadFrame(s, &h, &p));
  EXPECT_EQ(ErrorOf(h, p).code, wire::ErrorCode::kNotReady);
  ASSERT_TRUE(Send(s, wire::Hello{kTiny8KiB, 16, "raw"}, 2));  // its fd is dropped by read()
  ASSERT_TRUE(ReadFrame(s, &h, &p));
  ASSERT_EQ(h.type, wire::MsgType::kHelloOk) << ErrorOf(h, p).message;
  wire::Hint big{HintKind::kIdle, 1, std::vector<BlockKey>(wire::kMaxEntriesPerMessage + 1)};
  ASSERT_TRUE(Send(s, big, 3));
  ASSERT_TRUE(ReadFrame(s, &h, &p));
  const wire::Error limit = ErrorOf(h, p);
  EXPECT_EQ(limit.code, wire::ErrorCode::kLimit);
  EXPECT_NE(limit.message.find("split it"), std::string::npos) << limit.message;
  std::vector<uint8_t> garbage;
  wire::Encode(wire::Hint{HintKind::kIdle, 1, {BlockKey{1, 1}}}, 4, garbage);
  garbage[wire::kHeaderBytes + 5] = 9;  // nine keys, one present
  ASSERT_EQ(write(s, garbage.data(), garbage.size()), static_cast<ssize_t>(garbage.size()));
  ASSERT_TRUE(ReadFrame(s, &h, &p));
  EXPECT_EQ(ErrorOf(h, p).code, wire::ErrorCode::kBadPayload);
  ASSERT_TRUE(Send(s, wire::Hint{HintKind::kDone, 1, {}}, 5));
  ASSERT_TRUE(ReadFrame(s, &h, &p));
  ASSERT_EQ(h.type, wire::MsgType::kHintOk);
  wire::HintOk raw_ok;
  ASSERT_TRUE(wire::Decode(p, &raw_ok).ok());
  EXPECT_EQ(raw_ok.applied, 0);
  close(s);
  still_serving();

  // The library splits a long list: every key counted once.
  std::vector<BlockKey> many(wire::kMaxEntriesPerMessage + 10, BlockKey{3, 3});
  many.insert(many.end(), bad.keys.begin(), bad.keys.end());
  ASSERT_TRUE(bad.c->Hint(7, HintKind::kIdle, many, &ok).ok());
  EXPECT_EQ(ok.grouped, 4u);
  EXPECT_EQ(ok.unknown, wire::kMaxEntriesPerMessage + 10);
  EXPECT_EQ(ok.applied, 1);

  // After all of it: the good client's blocks never left tier 0.
  for (int i = 0; i < 3; ++i) {
    WaitTicks(*good.c, 2);
    still_serving();
  }
  EXPECT_TRUE(d.Alive()) << d.Log();
  const nlohmann::json j = StatusOf(d);
  EXPECT_GE(j["hints"]["unknown_keys"].get<uint64_t>(), 8u + wire::kMaxEntriesPerMessage);
}

// (c) One client's hints never reach another client's groups, even under the
// same group number: idle and done for one client's group 1 leave the other
// client's group 1 alone, and the room they give goes to whoever misses
// next. (A soon hint may take room from any block of the sender's uid: the
// engine's owner is the uid, as for every limit. Across uids:
// tests/hostile/hint_attacks_test.cpp.)
TEST(DaemonHints, GroupsAreEachClientsOwn) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  MemfdPool pool(16);
  Holder x(d, "x", pool);
  Holder y(d, "y", pool);
  ASSERT_TRUE(x.c && y.c);
  y.Admit(A, 0, 4);
  x.Admit(B, 8, 4);
  y.TouchAll();
  x.TouchAll();
  ASSERT_TRUE(WaitFor([&] {
    return y.InTier(y.slots, Tier::kFast) == 4 && x.InTier(x.slots, Tier::kFast) == 4;
  })) << d.Log();
  wire::HintOk ok;
  ASSERT_TRUE(y.c->Hint(1, HintKind::kSoon, y.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 4u);
  // x's group 1 holds only x's blocks: idle, then done, marks them to leave
  // first (tier 0 is full, but nothing needs room yet: they stay).
  ASSERT_TRUE(x.c->Hint(1, HintKind::kIdle, x.keys, &ok).ok());
  EXPECT_EQ(ok.grouped, 4u);
  EXPECT_EQ(ok.unknown, 0u);
  ASSERT_TRUE(x.c->Hint(1, HintKind::kDone, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 1);
  WaitTicks(*y.c, 3);
  EXPECT_EQ(y.InTier(y.slots, Tier::kFast), 4u);
  EXPECT_EQ(x.InTier(x.slots, Tier::kFast), 4u);
  // y's new blocks need room: they take x's done blocks', never y's group 1.
  std::vector<wire::AdmitEntry> more;
  std::vector<wire::AdmitResult> res;
  for (uint32_t i = 0; i < 4; ++i) more.push_back({BlockKey::FromSequence(503, i), 4 + i});
  ASSERT_TRUE(y.c->Admit(y.pool, more, &res).ok());
  std::vector<uint32_t> y_new;
  for (const auto& r : res) {
    y_new.push_back(r.slot);
    y.c->Observe(r.slot, 1.0f);
  }
  ASSERT_TRUE(WaitFor([&] {
    return y.InTier(y_new, Tier::kFast) == 4 && x.InTier(x.slots, Tier::kSlow) == 4;
  })) << d.Log();
  EXPECT_EQ(y.InTier(y.slots, Tier::kFast), 4u);
  // y's idle for its group 1 names only y's blocks: x's group 1 (in tier 1)
  // stays where it is, and y's leave only when something needs the room.
  ASSERT_TRUE(y.c->Hint(1, HintKind::kIdle, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 1);
  WaitTicks(*y.c, 3);
  EXPECT_EQ(x.InTier(x.slots, Tier::kSlow), 4u);
  EXPECT_EQ(y.InTier(y.slots, Tier::kFast), 4u);
}

// A restarted daemon knows no group: Reconnect sends each group that still
// holds keys of this client its last hint again, with those keys; a group
// whose keys were all released is not sent.
TEST(DaemonHints, ReconnectSendsEachGroupsLastHintAgain) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  MemfdPool pool(16);
  Holder x(d, "x", pool);
  ASSERT_TRUE(x.c);
  x.Admit(A, 0, 4);
  wire::HintOk ok;
  ASSERT_TRUE(x.c->Hint(7, HintKind::kSoon, std::span(x.keys).first(3), &ok).ok());
  ASSERT_TRUE(x.c->Hint(7, HintKind::kIdle, {}, &ok).ok());  // its last hint: idle
  ASSERT_TRUE(x.c->Hint(9, HintKind::kIdle, std::span(x.keys).last(1), &ok).ok());
  EXPECT_EQ(ok.grouped, 1u);
  ASSERT_TRUE(x.c->Release(std::span(x.keys).last(1)).ok());
  EXPECT_EQ(d.Stop(SIGTERM), 0);
  d.Start();
  ASSERT_TRUE(d.Alive()) << d.Log();
  ASSERT_TRUE(x.c->Reconnect().ok()) << d.Log();
  // One hint came in: group 7's, with its three keys, as idle.
  const nlohmann::json s = StatusOf(d);
  EXPECT_EQ(s["hints"]["requests"], 1) << s["hints"];
  EXPECT_EQ(s["hints"]["unknown_keys"], 0) << s["hints"];
  EXPECT_EQ(s["hints"]["applied"], 1) << s["hints"];
  ASSERT_TRUE(x.c->Hint(7, HintKind::kIdle, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 1) << "group 7 was not sent again";
  ASSERT_TRUE(x.c->Hint(9, HintKind::kIdle, {}, &ok).ok());
  EXPECT_EQ(ok.applied, 0) << "group 9 holds no key any more";
}

// The C ABI: a hint with keys, its result, and a kind out of range refused.
TEST(DaemonHints, CAbiSendsHints) {
  DaemonProcess d(kConfig);
  ASSERT_TRUE(d.Alive()) << d.Log();
  MemfdPool pool(4);
  const cxltier_model m{1, 1, 1, 128, 2, 16};
  cxltier_client* c = nullptr;
  char err[256] = {};
  ASSERT_EQ(cxltier_connect(d.socket().c_str(), &m, 16, "c-abi", &c, err, sizeof(err)), 0) << err;
  uint32_t pool_id = 0;
  ASSERT_EQ(cxltier_register_memfd_pool(c, pool.fd, pool.bytes, kBlock, 4, &pool_id), 0)
      << cxltier_last_error(c);
  const cxltier_key keys[2] = {{1, 2}, {3, 4}};
  const uint32_t blocks[2] = {0, 1};
  uint32_t slots[2] = {};
  ASSERT_EQ(cxltier_admit(c, pool_id, keys, blocks, 2, slots), 0) << cxltier_last_error(c);
  cxltier_hint_result r{};
  ASSERT_EQ(cxltier_hint(c, 5, CXLTIER_HINT_IDLE, keys, 2, &r), 0) << cxltier_last_error(c);
  EXPECT_EQ(r.grouped, 2u);
  EXPECT_EQ(r.unknown, 0u);
  EXPECT_EQ(r.applied, 1);
  ASSERT_EQ(cxltier_hint(c, 5, CXLTIER_HINT_SOON, nullptr, 0, nullptr), 0);
  EXPECT_EQ(cxltier_hint(c, 5, 4, nullptr, 0, &r), -CXLTIER_E_BAD_PAYLOAD);
  EXPECT_NE(std::string(cxltier_last_error(c)).find("hint kind 4"), std::string::npos)
      << cxltier_last_error(c);
  EXPECT_EQ(cxltier_hint(c, 5, 257, nullptr, 0, &r), -CXLTIER_E_BAD_PAYLOAD);
  EXPECT_EQ(cxltier_hint(c, 0, CXLTIER_HINT_DONE, nullptr, 0, &r), -CXLTIER_E_BAD_PAYLOAD);
  ASSERT_EQ(cxltier_hint(c, 5, CXLTIER_HINT_DONE, nullptr, 0, &r), 0) << cxltier_last_error(c);
  EXPECT_EQ(r.applied, 1);
  cxltier_close(c);
}

}  // namespace
}  // namespace cxltier
