#include "copy_mode.h"

#include <linux/io_uring.h>
#include <numaif.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <random>

#include "cxltier/segment.h"

namespace cxltier::loadgen {
namespace {

uint64_t Mix(const BlockKey& k, uint64_t w) {
  uint64_t x =
      (k.hi * 0x9E3779B97F4A7C15ULL) ^ (k.lo + 0x632BE59BD9B4E019ULL) ^ (w * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 29;
  return x;
}

// What a generation XORs into the words after word 2: odd, so two
// generations never give the same word.
constexpr uint64_t GenerationWord(uint64_t generation) {
  return generation * 0xD6E8FEB86659FD93ULL;
}

}  // namespace

void FillBlock(uint8_t* p, uint64_t bytes, const BlockKey& key, uint64_t generation) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  w[0] = key.hi;
  w[1] = key.lo;
  w[2] = Mix(key, 2) ^ generation;
  const uint64_t g = GenerationWord(generation);
  for (uint64_t i = 3; i < bytes / 8; ++i) w[i] = Mix(key, i) ^ g;
}

bool BlockIntact(const uint8_t* p, uint64_t bytes, const BlockKey* key, uint64_t* generation) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const BlockKey k{w[0], w[1]};
  if (key && !(k == *key)) return false;
  const uint64_t gen = w[2] ^ Mix(k, 2);
  const uint64_t g = GenerationWord(gen);
  for (uint64_t i = 3; i < bytes / 8; ++i) {
    if (w[i] != (Mix(k, i) ^ g)) return false;
  }
  if (generation) *generation = gen;
  return true;
}

bool BeingCopied(const Client& client, uint32_t slot) {
  const BlockState* first = client.SlotState(0);
  if (!first || slot >= client.slots()) return false;
  // The segment's layout (cxltier/segment.h): slot 0 at kSegmentSlotOffset.
  const auto* segment = reinterpret_cast<const uint8_t*>(first) - kSegmentSlotOffset;
  auto* words = reinterpret_cast<uint64_t*>(
      const_cast<uint8_t*>(segment + SegmentLocationOffset(client.slots())));
  return std::atomic_ref<uint64_t>(words[slot]).load(std::memory_order_relaxed) & kLocMoving;
}

Pin::~Pin() {
  for (int fd : rings_) close(fd);
}

Status Pin::Add(void* base, uint64_t bytes) {
  io_uring_params params{};
  const int ring = static_cast<int>(syscall(__NR_io_uring_setup, 1, &params));
  if (ring < 0) {
    return Status::Fail(wire::ErrorCode::kInternal,
                        std::string("io_uring_setup: ") + std::strerror(errno));
  }
  rings_.push_back(ring);
  // Fixed buffers are at most 1 GiB each.
  std::vector<iovec> iov;
  constexpr uint64_t kMax = 1ull << 30;
  for (uint64_t off = 0; off < bytes; off += kMax) {
    iov.push_back(
        {static_cast<uint8_t*>(base) + off, static_cast<size_t>(std::min(kMax, bytes - off))});
  }
  if (syscall(__NR_io_uring_register, ring, IORING_REGISTER_BUFFERS, iov.data(),
              static_cast<unsigned>(iov.size())) != 0) {
    return Status::Fail(
        wire::ErrorCode::kInternal,
        std::string("io_uring_register(IORING_REGISTER_BUFFERS): ") + std::strerror(errno));
  }
  return Status::Ok();
}

uint64_t PagesOffNodes(const void* base, uint64_t bytes, const std::vector<int>& nodes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<void*> pages;
  for (uint64_t o = 0; o < bytes; o += page) {
    pages.push_back(const_cast<uint8_t*>(static_cast<const uint8_t*>(base)) + o);
  }
  std::vector<int> status(pages.size(), -1);
  uint64_t off = 0;
  constexpr size_t kChunk = 8192;
  for (size_t i = 0; i < pages.size(); i += kChunk) {
    const size_t n = std::min(kChunk, pages.size() - i);
    if (move_pages(0, n, pages.data() + i, nullptr, status.data() + i, 0) != 0) return pages.size();
  }
  for (int s : status) off += std::find(nodes.begin(), nodes.end(), s) == nodes.end();
  return off;
}

Readers::Readers(Client& client, uint64_t block_bytes, const CheckOptions& options)
    : client_(client),
      block_bytes_(block_bytes),
      options_(options),
      blocks_(client.slots()),
      at_(client.slots(), SIZE_MAX),
      held_by_(static_cast<size_t>(std::max(options.readers, 0))),
      again_(static_cast<size_t>(std::max(options.writers, 0))) {
  options_.hold_leases = std::min(options_.hold_leases, kLeasesPerRow - 1);  // one for quick reads
  running_ = std::max(options_.readers, 0) + std::max(options_.writers, 0);
  auto exited = [this] {
    std::lock_guard lock(mu_);
    --running_;
    parked_cv_.notify_all();
  };
  for (int i = 0; i < options_.readers; ++i) {
    threads_.emplace_back([this, i, exited] {
      Run(i);
      exited();
    });
  }
  for (int i = 0; i < options_.writers; ++i) {
    threads_.emplace_back([this, i, exited] {
      Write(i);
      exited();
    });
  }
}

void Readers::Publish(uint32_t slot, const BlockKey& key) {
  std::lock_guard lock(mu_);
  if (slot >= at_.size() || at_[slot] != SIZE_MAX) return;
  Block& b = blocks_[slot];
  b.key = key;
  b.generation = 0;
  ++b.life;
  b.live = true;
  at_[slot] = live_.size();
  live_.push_back(slot);
}

void Readers::Withdraw(uint32_t slot) {
  std::unique_lock lock(mu_);
  if (slot >= at_.size() || at_[slot] == SIZE_MAX) return;
  written_.wait(lock, [&] { return !blocks_[slot].writing; });
  const size_t i = at_[slot];
  at_[live_.back()] = i;
  live_[i] = live_.back();
  live_.pop_back();
  at_[slot] = SIZE_MAX;
  blocks_[slot].live = false;
}

void Readers::Stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  parked_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

bool Readers::Park() {
  if (!pause_.load(std::memory_order_relaxed)) return false;
  std::unique_lock lock(mu_);
  if (!pause_ || stop_) return false;
  ++parked_;
  parked_cv_.notify_all();
  parked_cv_.wait(lock, [&] { return !pause_ || stop_; });
  --parked_;
  return true;
}

void Readers::Pause() {
  std::unique_lock lock(mu_);
  pause_ = true;
  parked_cv_.wait(lock, [&] { return parked_ == running_; });
}

void Readers::Resume() {
  {
    std::lock_guard lock(mu_);
    pause_ = false;
  }
  parked_cv_.notify_all();
}

void Readers::WaitParked() {
  std::unique_lock lock(mu_);
  parked_cv_.wait(lock, [&] { return parked_leases_ == 0 || stop_ || running_ == 0; });
}

void Readers::Remap() {
  std::lock_guard lock(mu_);
  // Old slot -> the slot its key has now: only for live blocks (a slot not
  // live, or live again with another block, is no block of a lease on it).
  const uint32_t n = client_.slots();
  std::vector<uint32_t> to(blocks_.size(), UINT32_MAX);
  std::vector<Block> blocks(n);
  std::vector<uint32_t> live;
  std::vector<size_t> at(n, SIZE_MAX);
  for (uint32_t old : live_) {
    uint32_t now = UINT32_MAX;
    if (!client_.SlotOf(blocks_[old].key, &now) || now >= n || at[now] != SIZE_MAX) {
      failed_.fetch_add(1);
      if (first_error_.empty()) {
        first_error_ = "Remap: the block of slot " + std::to_string(old) +
                       " has no slot of its own after the reconnect";
      }
      continue;
    }
    to[old] = now;
    blocks[now] = blocks_[old];
    blocks[now].leases = 0;  // counted again below
    at[now] = live.size();
    live.push_back(now);
  }
  parked_leases_ = 0;
  for (auto& hold : held_by_) {
    for (Held& h : hold) {
      // The library may park its place (released, or moved under the lease).
      ++parked_leases_;
      h.across = true;
      const uint32_t old = h.lease.slot;
      if (h.gone || old >= to.size() || to[old] == UINT32_MAX || blocks_[old].life != h.life) {
        h.gone = true;  // released before: the library keeps its place until we let go
        continue;
      }
      h.lease.slot = to[old];
      ++blocks[to[old]].leases;
    }
  }
  for (auto& again : again_) {
    std::deque<Again> kept;
    for (Again a : again) {
      if (a.slot < to.size() && to[a.slot] != UINT32_MAX && blocks_[a.slot].life == a.life) {
        a.slot = to[a.slot];
        kept.push_back(a);
      }
    }
    again.swap(kept);
  }
  blocks_ = std::move(blocks);
  live_ = std::move(live);
  at_ = std::move(at);
}

uint64_t Readers::generation(uint32_t slot) {
  std::lock_guard lock(mu_);
  return slot < blocks_.size() ? blocks_[slot].generation : 0;
}

CheckCounts Readers::counts() const {
  CheckCounts c;
  c.reads = reads_.load();
  c.holds = holds_.load();
  c.holds_cut_short = holds_cut_short_.load();
  c.held_moved = held_moved_.load();
  c.held_released = held_released_.load();
  c.held_across_reconnect = held_across_.load();
  c.rewrites = rewrites_.load();
  c.rewrites_over_copy = rewrites_over_copy_.load();
  c.torn = torn_.load();
  c.stale = stale_.load();
  c.changed = changed_.load();
  c.failed = failed_.load();
  return c;
}

void Readers::Failed(const std::string& what, const Status& st) {
  failed_.fetch_add(1);
  std::lock_guard lock(mu_);
  if (first_error_.empty()) first_error_ = what + ": " + st.message;
}

bool Readers::Take(Client::Reader& reader, size_t i, Held* held, Status* st) {
  *st = Status::Ok();
  const uint32_t slot = live_[i];
  Block& b = blocks_[slot];
  if (b.writing) return false;  // a writer has it: try another
  // Taken while the block is published: it is whole and live when the
  // lease starts; afterwards the main thread may release it, and its place
  // is kept until the lease ends.
  *st = reader.Acquire(slot, &held->lease);
  if (!st->ok()) return false;
  held->key = b.key;
  held->generation = b.generation;
  held->life = b.life;
  ++b.leases;
  return true;
}

// Under mu_: the daemon hands a place on only once our leases on it ended,
// through its own process and the socket, which TSan cannot see; leases
// released under mu_, and places rewritten only after taking mu_, show it
// the order.
void Readers::Let(Client::Reader& reader, const Held& held) {
  std::unique_lock lock(mu_);
  const Status st = reader.Release(held.lease);
  if (!held.gone) {
    --blocks_[held.lease.slot].leases;
  }
  if (held.across && parked_leases_ > 0 && --parked_leases_ == 0) {
    parked_cv_.notify_all();
  }
  lock.unlock();
  if (!st.ok()) Failed("Release", st);
}

namespace {

enum class Seen { kWhole, kTorn, kStale };

// Whether the bytes under a lease are the block's last write: its key, whole,
// of the generation it had when the lease was taken (no write comes while
// our lease holds the slot).
Seen Look(const uint8_t* p, uint64_t bytes, const BlockKey& key, uint64_t want) {
  uint64_t gen = 0;
  if (!BlockIntact(p, bytes, &key, &gen)) return Seen::kTorn;
  if (gen < want) return Seen::kStale;  // a lost write or an old copy published
  return gen == want ? Seen::kWhole : Seen::kTorn;
}

}  // namespace

bool Readers::Check(const Held& held) {
  const Seen seen = Look(held.lease.data, block_bytes_, held.key, held.generation);
  if (seen == Seen::kTorn) torn_.fetch_add(1);
  if (seen == Seen::kStale) stale_.fetch_add(1);
  reads_.fetch_add(1, std::memory_order_relaxed);
  return seen == Seen::kWhole;
}

void Readers::Run(int index) {
  Status st;
  auto reader = client_.NewReader(&st);
  if (!reader) return Failed("NewReader", st);
  std::mt19937_64 rng(static_cast<uint64_t>(index) * 7919 + 1);
  const bool holding = options_.hold_ticks > 0 && options_.hold_leases > 0;
  // How long a hold may wait for its ticks: a daemon that stopped ticking
  // (stopped, or starved) ends it early, which is no failure.
  const auto bound = std::max<std::chrono::milliseconds>(
      std::chrono::seconds(10),
      std::chrono::milliseconds(uint64_t{options_.hold_ticks} * client_.tick_ms() * 20));
  std::vector<Held>& hold = held_by_[static_cast<size_t>(index)];
  uint64_t hold_until = 0;
  auto hold_deadline = std::chrono::steady_clock::now();
  uint64_t n = static_cast<uint64_t>(index) * 7919;
  for (;;) {
    if (Park() && !hold.empty()) {
      // A new daemon counts its ticks from its start: the hold waits its
      // ticks over again from there.
      hold_until = client_.daemon_ticks() + options_.hold_ticks;
      hold_deadline = std::chrono::steady_clock::now() + bound;
    }
    const bool stopping = stop_.load(std::memory_order_relaxed);
    if (holding && hold.empty() && !stopping) {
      // A hold: leases on distinct blocks, checked now and again later.
      {
        std::lock_guard lock(mu_);
        const size_t want = std::min<size_t>(options_.hold_leases, live_.size());
        for (size_t tries = 0; hold.size() < want && tries < 4 * want; ++tries) {
          const size_t i = rng() % live_.size();
          if (std::any_of(hold.begin(), hold.end(),
                          [&](const Held& h) { return h.lease.slot == live_[i]; })) {
            continue;
          }
          Held h;
          if (Take(*reader, i, &h, &st)) {
            hold.push_back(h);
          } else if (!st.ok()) {
            failed_.fetch_add(1);
            if (first_error_.empty()) first_error_ = "Acquire: " + st.message;
          }
        }
      }
      for (Held& h : hold) h.whole = Check(h);
      hold_until = client_.daemon_ticks() + options_.hold_ticks;
      hold_deadline = std::chrono::steady_clock::now() + bound;
    } else if (!hold.empty() && (stopping || client_.daemon_ticks() >= hold_until ||
                                 std::chrono::steady_clock::now() >= hold_deadline)) {
      // The daemon ticked hold_ticks times (moving, releasing and reusing
      // places): every byte must still be what it was.
      const bool cut = !stopping && client_.daemon_ticks() < hold_until;
      for (const Held& h : hold) {
        bool released = h.gone;
        if (!released) {
          std::lock_guard lock(mu_);
          const Block& b = blocks_[h.lease.slot];
          released = !b.live || b.life != h.life;
        }
        const uint8_t* at = nullptr;
        if (!released) {
          const Location now = client_.LocationOf(h.lease.slot);
          at = now.tier < kMaxTiers ? client_.tier_pool_base(now.tier) +
                                          uint64_t{now.index} * client_.tier_pool_stride()
                                    : nullptr;
        }
        held_across_.fetch_add(h.across, std::memory_order_relaxed);
        if (released) {
          held_released_.fetch_add(1);
        } else if (at != h.lease.data) {
          held_moved_.fetch_add(1);
        }
        if (h.whole && Look(h.lease.data, block_bytes_, h.key, h.generation) != Seen::kWhole) {
          changed_.fetch_add(1);
        }
        Let(*reader, h);
      }
      holds_.fetch_add(hold.size());
      if (cut) holds_cut_short_.fetch_add(hold.size());
      hold.clear();
    }
    if (stopping) break;
    // A quick read: take, check, let go.
    Held quick;
    bool took = false;
    {
      std::lock_guard lock(mu_);
      if (live_.empty()) {
        n = 0;
      } else {
        took = Take(*reader, n++ % live_.size(), &quick, &st);
        if (!took && !st.ok()) {
          failed_.fetch_add(1);
          if (first_error_.empty()) first_error_ = "Acquire: " + st.message;
        }
      }
    }
    if (!took) {
      std::this_thread::yield();
      continue;
    }
    Check(quick);
    Let(*reader, quick);
  }
}

void Readers::Write(int index) {
  Status st;
  auto reader = client_.NewReader(&st);  // to look again at copies cancelled
  if (!reader) return Failed("NewReader", st);
  std::mt19937_64 rng(static_cast<uint64_t>(index) * 104729 + 7);
  // Rewrites begun over a copy: checked again under a read lease two ticks later.
  std::deque<Again>& again = again_[static_cast<size_t>(index)];
  auto next_any = std::chrono::steady_clock::now();
  uint64_t cancels = 0;
  uint64_t aimed_tick = 0;  // the daemon tick of the last rewrite over a copy
  for (;;) {
    // Here no write lease is held (nor any read lease): a safe point.
    if (Park()) {
      // A new daemon counts its ticks from its start.
      aimed_tick = 0;
      for (Again& a : again) a.at_tick = client_.daemon_ticks() + 2;
    }
    const bool stopping = stop_.load(std::memory_order_relaxed);
    while (!again.empty() && (stopping || client_.daemon_ticks() >= again.front().at_tick)) {
      const Again a = again.front();
      again.pop_front();
      Held h;
      bool took = false;
      {
        std::lock_guard lock(mu_);
        const Block& b = blocks_[a.slot];
        if (b.live && b.life == a.life && !b.writing) {
          took = Take(*reader, at_[a.slot], &h, &st);
          if (!took && !st.ok()) {
            failed_.fetch_add(1);
            if (first_error_.empty()) first_error_ = "Acquire: " + st.message;
          }
        }
      }
      if (!took) continue;
      Check(h);
      Let(*reader, h);
    }
    if (stopping) break;
    // A block the daemon copies now (the rewrite cancels the copy), else,
    // rewrite_us after the last such rewrite ended, any block.
    uint32_t slot = UINT32_MAX;
    Block was;
    {
      std::lock_guard lock(mu_);
      const size_t n = live_.size();
      const size_t start = n ? rng() % n : 0;
      // At most one a tick: the daemon's other copies go through, and blocks
      // still move however slow the copies are (an emulated guest).
      for (size_t k = 0; k < n && slot == UINT32_MAX && client_.daemon_ticks() > aimed_tick; ++k) {
        const uint32_t s = live_[(start + k) % n];
        if (!blocks_[s].writing && blocks_[s].leases == 0 && BeingCopied(client_, s)) slot = s;
      }
      if (slot == UINT32_MAX && n && std::chrono::steady_clock::now() >= next_any) {
        for (int tries = 0; tries < 8 && slot == UINT32_MAX; ++tries) {
          const uint32_t s = live_[rng() % n];
          if (!blocks_[s].writing && blocks_[s].leases == 0) slot = s;
        }
      }
      if (slot != UINT32_MAX) {
        blocks_[slot].writing = true;
        was = blocks_[slot];
      }
    }
    if (slot == UINT32_MAX) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    const bool over_copy = BeingCopied(client_, slot);
    if (over_copy) aimed_tick = client_.daemon_ticks();
    uint8_t* p = nullptr;
    bool wrote = false;
    if (st = client_.BeginWrite(slot, &p); !st.ok()) {
      Failed("BeginWrite", st);
    } else {
      if (over_copy && ++cancels % 2 == 0) {
        // Every other time, write once the copy is through (about 1 us a
        // KiB): the daemon then finds its copy whole and must still drop it
        // because of the write lease, not because the bytes differ.
        std::this_thread::sleep_for(std::chrono::microseconds(block_bytes_ / 1024));
      }
      { std::lock_guard lock(mu_); }  // after the leases on the place ended (Let)
      // The write lease holds the place: it must hold our last write.
      const Seen seen = Look(p, block_bytes_, was.key, was.generation);
      if (seen == Seen::kTorn) torn_.fetch_add(1);
      if (seen == Seen::kStale) stale_.fetch_add(1);
      reads_.fetch_add(1, std::memory_order_relaxed);
      FillBlock(p, block_bytes_, was.key, was.generation + 1);
      wrote = true;
      // Fails when the lease was lost meanwhile: a daemon published a copy
      // over the word (a plain store instead of PublishMove's swap).
      if (st = client_.EndWrite(slot); !st.ok()) Failed("EndWrite", st);
    }
    {
      std::lock_guard lock(mu_);
      if (wrote) blocks_[slot].generation = was.generation + 1;
      blocks_[slot].writing = false;
    }
    written_.notify_all();
    if (!over_copy) {
      next_any = std::chrono::steady_clock::now() + std::chrono::microseconds(options_.rewrite_us);
    }
    if (!wrote) continue;
    rewrites_.fetch_add(1, std::memory_order_relaxed);
    if (over_copy) {
      rewrites_over_copy_.fetch_add(1, std::memory_order_relaxed);
      again.push_back({slot, was.life, client_.daemon_ticks() + 2});
    }
  }
}

}  // namespace cxltier::loadgen
