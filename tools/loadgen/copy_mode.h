// cxltier-loadgen's copy mode and pinning: blocks that carry their own key
// and generation (so a reader can tell a torn, wrong or stale block from the
// last one written), reader threads that check blocks under read leases while
// the daemon copies them, some holding their leases across daemon ticks,
// writer threads that rewrite blocks under write leases (aiming at blocks the
// daemon is copying), long-term pins with io_uring fixed buffers (the pin
// cudaHostRegister takes), and the kernel's answer on where a pool's pages are.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxltier/client.h"

namespace cxltier::loadgen {

// A block's bytes: its key in the first 16, then words derived from it; a
// rewritten block's generation (1, 2, ...: how often it was written after
// the first time) is XORed into word 2 and, multiplied by an odd constant,
// into every later word, so two generations differ in every word but the
// key's. Generation 0 is the plain pattern, the one tests/python checks.
void FillBlock(uint8_t* p, uint64_t bytes, const BlockKey& key, uint64_t generation = 0);
// Whether the bytes are one whole block, and of `key` when given; its
// generation in *generation (when given and the block is whole).
bool BlockIntact(const uint8_t* p, uint64_t bytes, const BlockKey* key = nullptr,
                 uint64_t* generation = nullptr);

// Whether the daemon is copying `slot` now (its location word's M bit, as the
// segment shows it: cxltier/lease.h). A peek, for aiming rewrites at copies.
bool BeingCopied(const Client& client, uint32_t slot);

// Pins [base, base + bytes) as io_uring fixed buffers (FOLL_LONGTERM, as
// cudaHostRegister does) for as long as the object lives.
class Pin {
 public:
  Pin() = default;
  ~Pin();
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  Status Add(void* base, uint64_t bytes);

 private:
  std::vector<int> rings_;
};

// Pages of [base, base + bytes) not on any of `nodes` (move_pages, no move).
uint64_t PagesOffNodes(const void* base, uint64_t bytes, const std::vector<int>& nodes);

// What the reader and writer threads do (cxltier-loadgen --help says more).
struct CheckOptions {
  int readers = 2;             // threads that read blocks under read leases
  uint32_t hold_ticks = 3;     // each reader holds some leases while the daemon ticks this often
  uint32_t hold_leases = 8;    // how many (at most 31); either 0: no holds, only quick reads
  int writers = 1;             // threads that rewrite blocks under write leases
  uint32_t rewrite_us = 2000;  // a writer's pause after a rewrite of a block not being copied
};

// What they saw. torn, stale, changed and failed are 0 when nothing was wrong.
struct CheckCounts {
  uint64_t reads = 0;            // blocks checked under read leases (holds' first looks too)
  uint64_t holds = 0;            // leases held across hold_ticks daemon ticks, then checked again
  uint64_t holds_cut_short = 0;  // ... of them let go before the ticks passed (the time bound)
  uint64_t held_moved = 0;       // ... of them whose block the daemon moved meanwhile
  uint64_t held_released = 0;    // ... whose block the workload released meanwhile
  uint64_t held_across_reconnect = 0;  // ... held while the client reconnected (Pause .. Resume)
  uint64_t rewrites = 0;               // blocks written again (a new generation) under write leases
  uint64_t rewrites_over_copy = 0;     // ... begun while the daemon was copying the block
  uint64_t torn = 0;                   // reads of bytes that are no whole block of the key
  uint64_t stale = 0;                  // reads of an older generation than the last write's
  uint64_t changed = 0;                // held leases whose bytes changed while held
  uint64_t failed = 0;                 // lease calls that failed (EndWrite without the lease, ...)
};

// Reader and writer threads. The main thread publishes a block once written
// (generation 0) and withdraws it before releasing it. Readers take
// published blocks under read leases and check every byte: at once, and
// (hold_ticks) again after holding the lease while the daemon ticks, moves,
// releases and reuses places. Writers rewrite published blocks under write
// leases with the next generation, first checking the bytes they replace;
// they pick blocks the daemon is copying when there are (their BeginWrite
// cancels the copy: a daemon that published it anyway shows the old
// generation) and check those again under a read lease two ticks later. No
// block is written while a lease of this object's readers holds its slot.
class Readers {
 public:
  Readers(Client& client, uint64_t block_bytes, const CheckOptions& options);
  ~Readers() { Stop(); }
  void Publish(uint32_t slot, const BlockKey& key);
  // Main thread, after an Admit and before it writes the places it got: the
  // daemon hands a place on only once our leases on it ended (Let, under
  // mu_), through its own process and the socket, which TSan cannot see;
  // taking mu_ shows it that order (also for leases held across a reconnect).
  void Admitted() { std::lock_guard lock(mu_); }
  // Waits for a rewrite of the slot under way.
  void Withdraw(uint32_t slot);
  void Stop();
  // The generation of the slot's last completed write.
  uint64_t generation(uint32_t slot);
  // Around a Client::Reconnect: Pause returns once every thread waits at a
  // safe point (a reader may still hold the leases of a hold; no writer is
  // between BeginWrite and EndWrite), Remap then moves everything kept by
  // slot (blocks, the leases held) to the slot client.SlotOf gives its key
  // now, and Resume lets the threads go on (their waits for daemon ticks
  // start over: a new daemon's tick count restarts). Main thread only.
  void Pause();
  void Remap();
  void Resume();
  // After Resume: waits until the leases held across the Reconnect are let
  // go (at most a hold's time). The library parks the places of those on
  // blocks released or moved before it under keys of its own, each a slot,
  // until the next Admit or Release after the lease ends: an Admit sized to
  // the slots this run left free needs them back.
  void WaitParked();
  CheckCounts counts() const;
  // torn + stale + changed: reads that were wrong.
  uint64_t bad_reads() const { return torn_.load() + stale_.load() + changed_.load(); }
  uint64_t failed() const { return failed_.load(); }
  const std::string& first_error() const { return first_error_; }

 private:
  struct Block {
    BlockKey key;
    uint64_t generation = 0;
    uint64_t life = 0;    // bumped at each Publish of the slot
    uint32_t leases = 0;  // our read leases on the slot (any life of it)
    bool live = false;
    bool writing = false;
  };
  // A read lease taken under mu_ with what the block must hold.
  struct Held {
    Client::Reader::Lease lease;
    BlockKey key;
    uint64_t generation = 0;
    uint64_t life = 0;
    bool whole = false;   // at the first look
    bool across = false;  // held across a Reconnect
    bool gone = false;    // released before a Reconnect: no slot of ours any more
  };
  // A rewrite begun over a copy, checked again under a read lease two ticks
  // later, when a daemon that published the cancelled copy has done so.
  struct Again {
    uint32_t slot;
    uint64_t life;
    uint64_t at_tick;
  };
  void Run(int index);
  void Write(int index);
  // Under mu_: takes a lease on the live block at live_[i]; false (nothing
  // held) when it fails.
  bool Take(Client::Reader& reader, size_t i, Held* held, Status* st);
  void Let(Client::Reader& reader, const Held& held);
  // Checks the bytes under a lease (key, whole, generation); counts what is wrong.
  bool Check(const Held& held);
  void Failed(const std::string& what, const Status& st);
  // A thread's safe point: waits while paused; true when it was (the
  // caller's daemon ticks start over).
  bool Park();
  Client& client_;
  uint64_t block_bytes_;
  CheckOptions options_;
  std::mutex mu_;
  std::condition_variable written_;
  std::vector<Block> blocks_;   // GUARDED_BY(mu_): by slot
  std::vector<uint32_t> live_;  // GUARDED_BY(mu_): slots published
  std::vector<size_t> at_;      // GUARDED_BY(mu_): slot -> index in live_
  std::atomic<bool> stop_{false};
  std::atomic<bool> pause_{false};
  std::condition_variable parked_cv_;
  int parked_ = 0;              // GUARDED_BY(mu_): threads waiting in Park
  int running_ = 0;             // GUARDED_BY(mu_): threads not yet returned
  uint32_t parked_leases_ = 0;  // GUARDED_BY(mu_): leases held across the last Remap
  // Each thread's own, touched by others only while it is parked (Remap).
  std::vector<std::vector<Held>> held_by_;  // by reader: the leases of its hold
  std::vector<std::deque<Again>> again_;    // by writer
  std::atomic<uint64_t> reads_{0}, holds_{0}, holds_cut_short_{0}, held_moved_{0},
      held_released_{0}, held_across_{0}, rewrites_{0}, rewrites_over_copy_{0}, torn_{0}, stale_{0},
      changed_{0}, failed_{0};
  std::string first_error_;  // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace cxltier::loadgen
