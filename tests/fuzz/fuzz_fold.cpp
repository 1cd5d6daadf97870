// libFuzzer target: the fold of a state segment a client wrote, on its own:
// a client table entry, a real segment (memfd) and an engine, with no socket,
// no io_context and no state directory. The input overwrites the segment's
// slots and dirty bitmap (anything a hostile client can write); a tail past
// the segment is a socket Report. The fold runs one tick, and then every
// block is still held, every score the engine publishes is finite, and the
// client's slots still name their keys.
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "cxltier/segment.h"
#include "engine/engine.h"
#include "service/client_table.h"
#include "service/config.h"
#include "service/fold.h"

namespace {

using namespace cxltier;

constexpr uint32_t kSlots = 64;
constexpr uint64_t kBlockBytes = 64 << 10;

struct Fixture {
  service::ClientTable table;
  service::Client* client = nullptr;
  std::unique_ptr<engine::Engine> engine;
  service::Fold fold;
  uint64_t tick = 0;

  Fixture() {
    engine::EngineOptions o;
    o.block_bytes = kBlockBytes;
    o.tier0_budget_bytes = 16 * kBlockBytes;
    o.mode = engine::Mode::kTick;
    engine = std::make_unique<engine::Engine>(o, std::move(*engine::MakePolicy("ema:0.1")));
    service::DaemonConfig config;
    client = &table.Connect(server::Peer{1, getpid(), getuid(), getgid()});
    const wire::Hello hello{ModelGeometry{"fuzz", 1, 1, 1, 1024, 2, 16}, kSlots, "fuzz"};
    if (!table.CheckHello(*client, hello, config).ok() || !table.Open(*client, kSlots, "fuzz").ok())
      std::abort();
    for (uint32_t i = 0; i < kSlots; ++i) {
      const BlockKey key = BlockKey::FromSequence(3, i);
      const engine::Slot es = engine->Admit(key, i < 16 ? Tier::kFast : Tier::kSlow, getuid());
      service::WriteBack(*engine, *client, table.Bind(*client, es, 0, i, key));
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Fixture* f = new Fixture();
  service::Client& c = *f->client;
  // The client's part of the segment: every slot byte and the bitmap.
  uint8_t* writable = reinterpret_cast<uint8_t*>(c.segment.slot(0));
  const size_t span = SegmentBytes(kSlots) - kSegmentSlotOffset;
  std::memcpy(writable, data, std::min(size, span));
  if (size > span) {
    wire::Report r;
    std::vector<uint8_t> payload(data + span, data + size);
    if (wire::Decode(payload, &r).ok()) (void)service::AddReport(c, r);
  }
  f->fold.Run(c, *f->engine, ++f->tick);
  // Nothing the client writes drops a block or loses its key.
  if (c.live != kSlots || f->engine->live_blocks() != kSlots) std::abort();
  for (uint32_t i = 0; i < kSlots; ++i) {
    const service::SegSlot& s = c.slots[i];
    if (!s.live || c.by_key.Find(s.key) != i) std::abort();
    const BlockState& st = f->engine->state(s.engine_slot);
    if (!std::isfinite(st.score) || st.score < 0) std::abort();
    if (st.touch_time > f->tick) std::abort();  // the engine's clock, not the client's
  }
  return 0;
}
