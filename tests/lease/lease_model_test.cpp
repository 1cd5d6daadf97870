// Every interleaving of copy mode's hand-off protocol (cxltier/lease.h): one
// daemon that moves a block twice and reuses the places it leaves, and two
// client threads, each a reader or a writer. An explicit-state search visits
// every state reachable by one atomic step of any thread, and checks in each:
//   - a reader under a lease never reads a place the daemon reused;
//   - a reader with no writer about reads the block's bytes, never a mix;
//   - the daemon publishes a copy only when it equals its source;
//   - at the end the block's place holds the last write, whole, no flag is
//     left set, and every other place is free again (nothing leaks).
// Steps that are one atomic operation in the real code call the real function
// on the model's words (BeginMove, PublishMove, AbortMove, EndWrite,
// ReleaseRead, ReadLease); AcquireRead and BeginWrite, a few operations each,
// are written out step by step below, in the order the real code runs them.
// The search assumes the interleavings of sequential consistency; why the
// real code's orderings give no other outcomes is argued in docs/protocol.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_set>
#include <vector>

#include "cxltier/lease.h"

#if defined(__SANITIZE_THREAD__)
#define CXLTIER_MODEL_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define CXLTIER_MODEL_UNDER_TSAN 1
#endif
#endif

namespace cxltier {
namespace {

constexpr uint32_t kSlot = 5;
constexpr int kPlaces = 3;
constexpr int kGarbage = 99;  // what a reused place holds
constexpr int kMoves = 2;

enum class Role : uint8_t { kReader, kWriter };

struct Thread {
  uint8_t pc = 0;
  uint64_t seen = 0;  // a location word it loaded
  int8_t a = 0;       // values read (reader) / writes done (writer)
  int8_t b = 0;
  uint8_t retries = 0;
};

struct State {
  uint64_t words[8] = {};  // the segment's location words (slot kSlot used)
  LeaseEntry leases[2];    // one entry per client thread
  int8_t mem[kPlaces][2] = {};
  uint8_t free_mask = 0;
  // The daemon.
  uint8_t dpc = 0;
  uint8_t moves = 0;
  uint8_t rec_place = 0;
  uint32_t rec_version = 0;
  uint8_t dst = 0;
  int8_t tmp0 = 0, tmp1 = 0;
  uint8_t drain_place = 0xff;  // one place waiting for readers (0xff: none)
  uint32_t drain_version = 0;
  uint8_t scan_hit = 0;
  uint8_t scan_i = 0;
  int8_t last_written = 1;  // the value the block should hold
  Thread t[2];

  std::string Key() const {
    std::string k(reinterpret_cast<const char*>(this), sizeof(State));
    return k;
  }
};

struct Checker {
  std::array<Role, 2> roles;
  std::unordered_set<std::string> seen;
  uint64_t states = 0, finals = 0;
  std::string failure;

  bool Fail(const std::string& why) {
    if (failure.empty()) failure = why;
    return false;
  }

  // ---- the daemon: move, publish, drain, reuse ----
  // Returns false when the daemon has nothing to do now (finished or waiting).
  bool DaemonStep(State& s) {
    uint64_t* w = s.words;
    switch (s.dpc) {
      case 0: {  // pick a free place for the next move, or drain
        if (s.drain_place != 0xff) {
          s.dpc = 10;
          s.scan_i = 0;
          s.scan_hit = 0;
          return true;
        }
        if (s.moves == kMoves) return false;  // done
        for (uint8_t p = 0; p < kPlaces; ++p) {
          if (s.free_mask & (1u << p)) {
            s.dst = p;
            s.free_mask &= ~(1u << p);
            s.dpc = 1;
            return true;
          }
        }
        return Fail("no free place for a move");
      }
      case 1:  // BeginMove: one CAS
        if (BeginMove(w, kSlot, LocationWord(1, s.rec_place, s.rec_version))) {
          s.dpc = 2;
        } else {  // a write lease is held: the move is not done now; try again later
          s.free_mask |= 1u << s.dst;
          ++s.moves;
          s.dpc = 0;
        }
        return true;
      case 2:  // the copy, a cell at a time (the writer may write meanwhile)
        s.mem[s.dst][0] = s.mem[s.rec_place][0];
        s.dpc = 3;
        return true;
      case 3:
        s.mem[s.dst][1] = s.mem[s.rec_place][1];
        s.dpc = 4;
        return true;
      case 4:  // hash the source again: compare what is there now
        s.tmp0 = s.mem[s.rec_place][0];
        s.tmp1 = s.mem[s.rec_place][1];
        s.dpc = 5;
        return true;
      case 5: {  // PublishMove: one CAS
        const bool same = s.tmp0 == s.mem[s.dst][0] && s.tmp1 == s.mem[s.dst][1];
        const uint64_t expected = LocationWord(1, s.rec_place, s.rec_version);
        if (same && PublishMove(w, kSlot, expected, LocationWord(1, s.dst, s.rec_version + 1))) {
          // Published: the copy must be the source as the block is now.
          if (s.mem[s.dst][0] != s.mem[s.rec_place][0] ||
              s.mem[s.dst][1] != s.mem[s.rec_place][1]) {
            return Fail("published a copy that differs from its source");
          }
          s.drain_place = s.rec_place;
          s.drain_version = s.rec_version;
          s.rec_place = s.dst;
          ++s.rec_version;
        } else {
          s.dpc = 6;
          return true;
        }
        ++s.moves;
        s.dpc = 0;
        return true;
      }
      case 6:  // AbortMove after a failed publish, dst back to the free places
        AbortMove(w, kSlot);
        s.free_mask |= 1u << s.dst;
        ++s.moves;
        s.dpc = 0;
        return true;
      case 10: {  // the drain's scan: one lease entry per step
        if (s.scan_i < 2) {
          if (ReadLease(&s.leases[s.scan_i]) == LeaseWord(kSlot, s.drain_version)) s.scan_hit = 1;
          ++s.scan_i;
          return true;
        }
        if (s.scan_hit) {  // still read: look again later (only once others moved on)
          s.dpc = 11;
          return true;
        }
        // Reuse: whatever the place held is gone.
        s.mem[s.drain_place][0] = s.mem[s.drain_place][1] = kGarbage;
        s.free_mask |= 1u << s.drain_place;
        s.drain_place = 0xff;
        s.dpc = 0;
        return true;
      }
      case 11:  // a reader holds the old place: scan again (a tick later, in the daemon)
        s.dpc = 0;
        return true;
    }
    return false;
  }

  // ---- a reader: AcquireRead, read both cells, ReleaseRead ----
  bool ReaderStep(State& s, int i) {
    Thread& t = s.t[i];
    std::atomic_ref<uint64_t> word(s.words[kSlot]);
    switch (t.pc) {
      case 0:  // seen = word.load
        t.seen = word.load();
        t.pc = 1;
        return true;
      case 1:  // held.store(LeaseWord(slot, version))
        std::atomic_ref<uint64_t>(s.leases[i].held)
            .store(LeaseWord(kSlot, DecodeLocation(t.seen).version));
        t.pc = 2;
        return true;
      case 2: {  // again = word.load; retry if the place changed
        const uint64_t again = word.load();
        if (PlaceOf(again) != PlaceOf(t.seen)) {
          t.seen = again;
          if (++t.retries > 4) return Fail("a reader retried more often than the daemon moved");
          t.pc = 1;
          return true;
        }
        t.pc = 3;
        return true;
      }
      case 3:
        t.a = s.mem[DecodeLocation(t.seen).index][0];
        t.pc = 4;
        return true;
      case 4:
        t.b = s.mem[DecodeLocation(t.seen).index][1];
        if (t.a == kGarbage || t.b == kGarbage) return Fail("a reader read a reused place");
        if (roles[0] == Role::kReader && roles[1] == Role::kReader && (t.a != 1 || t.b != 1)) {
          return Fail("a reader read bytes the block never held");
        }
        t.pc = 5;
        return true;
      case 5:
        ReleaseRead(&s.leases[i]);
        t.pc = 6;
        return true;
    }
    return false;  // done
  }

  // ---- a writer: BeginWrite, write both cells, EndWrite; twice ----
  bool WriterStep(State& s, int i) {
    Thread& t = s.t[i];
    std::atomic_ref<uint64_t> word(s.words[kSlot]);
    switch (t.pc) {
      case 0:                        // seen = word.load
        if (t.a == 2) return false;  // two writes done
        t.seen = word.load();
        t.pc = 1;
        return true;
      case 1: {                      // CAS(seen -> (seen | W) & ~M), reload on failure
        if (t.seen & kLocWriting) {  // kAlreadyWriting: the caller tries again
          t.pc = 0;
          return true;
        }
        uint64_t expect = t.seen;
        if (!word.compare_exchange_strong(expect, (t.seen | kLocWriting) & ~kLocMoving)) {
          t.seen = expect;
          return true;
        }
        t.pc = 2;
        return true;
      }
      case 2:
        s.mem[DecodeLocation(t.seen).index][0] = static_cast<int8_t>(s.last_written + 1);
        t.pc = 3;
        return true;
      case 3:
        s.mem[DecodeLocation(t.seen).index][1] = static_cast<int8_t>(s.last_written + 1);
        ++s.last_written;
        t.pc = 4;
        return true;
      case 4:
        if (!EndWrite(s.words, kSlot)) return Fail("EndWrite found no write lease");
        ++t.a;
        t.pc = 0;
        return true;
    }
    return false;
  }

  bool ClientStep(State& s, int i) {
    return roles[i] == Role::kReader ? ReaderStep(s, i) : WriterStep(s, i);
  }

  void CheckFinal(const State& s) {
    ++finals;
    const Location loc = DecodeLocation(s.words[kSlot]);
    if (s.words[kSlot] & kLocFlags) Fail("a flag was left set at the end");
    if (loc.index != s.rec_place || loc.version != s.rec_version) {
      Fail("the published place is not the daemon's record");
    }
    if (s.mem[loc.index][0] != s.last_written || s.mem[loc.index][1] != s.last_written) {
      Fail("the block's place does not hold its last write, whole");
    }
    const uint8_t all = (1u << kPlaces) - 1;
    if (s.drain_place != 0xff || (s.free_mask | (1u << s.rec_place)) != all) {
      Fail("a place was never reused (leaked)");
    }
  }

  void Run() {
    State init;
    init.words[kSlot] = LocationWord(1, 0, 0);
    init.mem[0][0] = init.mem[0][1] = 1;
    init.free_mask = 0b110;
    std::vector<State> stack{init};
    seen.insert(init.Key());
    while (!stack.empty() && failure.empty()) {
      State s = stack.back();
      stack.pop_back();
      ++states;
      bool any = false;
      auto push = [&](const State& n) {
        any = true;
        if (seen.insert(n.Key()).second) stack.push_back(n);
      };
      for (int i = 0; i < 2; ++i) {
        State n = s;
        if (ClientStep(n, i)) push(n);
      }
      State n = s;
      if (DaemonStep(n)) push(n);
      if (!any) CheckFinal(s);
    }
  }
};

void Check(Role a, Role b) {
  Checker c;
  c.roles = {a, b};
  c.Run();
  EXPECT_EQ(c.failure, "");
  EXPECT_GT(c.finals, 0u);
  // Enough states that the search did interleave (a few thousand at least).
  EXPECT_GT(c.states, 1000u);
  std::printf("%llu states, %llu final\n", static_cast<unsigned long long>(c.states),
              static_cast<unsigned long long>(c.finals));
}

TEST(LeaseModel, TwoReadersAndTwoMoves) { Check(Role::kReader, Role::kReader); }
TEST(LeaseModel, ReaderWriterAndTwoMoves) { Check(Role::kReader, Role::kWriter); }
TEST(LeaseModel, TwoWritersTakeTurnsAndTwoMoves) {
  // Two threads writing one block is a client bug; the daemon still never
  // publishes a torn copy. The model's writers retry until they get the
  // lease, so they write in turn.
  Check(Role::kWriter, Role::kWriter);
}

// ==== The daemon's whole side: admission, a mover thread, release ====
//
// The model above moves one admitted block. This one follows a slot through
// the daemon's other steps too, with its bookkeeping as daemon/service does
// it (copy_mode.cpp, MoveDispatch::DispatchCopy and CompleteCopy in
// move_dispatch.cpp): a version per slot, the copies of it in flight, and
// Drain records of places waiting for their readers (and for the mover, while
// a copy reads them). Three kinds of thread:
//   - the daemon's thread runs a script of requests (admit, a move the engine
//     planned, release) in order, and between any two of them takes a
//     finished copy back (CompleteCopy) or scans the lease table (DrainPlaces:
//     one entry a step, then the decision);
//   - the mover runs the copies queued to it, in order, as RunCopy does;
//   - client threads: a filler writes each admitted block under the write
//     lease the admission gave it, then EndWrite; a reader takes read leases,
//     including while the slot has no place (AcquireRead's no-place branches).
// It checks in every state that a place is freed only when no reader holds a
// lease on it and the mover does not read it, and never twice; that a reader
// of a filled block reads its bytes; and at the end (everything idle, every
// lease released) that one more drain frees every place but the block's own:
// a place that stays in the drain list for ever is a leak.
//
// The bookkeeping here is a copy of the daemon's, a few lines a function (the
// real ones need a whole service::Client: segment, pools, client table);
// tests/service/copy_state_test.cpp runs the real ones in the orders that
// matter here. At each test: the mutations it was seen to fail on.
namespace daemon_model {

constexpr uint32_t kSeg = 2;    // the slot (the segment has 4)
constexpr int kPlaces = 5;      // blocks over the client's tier pools
constexpr int8_t kFreed = 99;   // what a freed place holds (its next user's bytes)
constexpr int kMaxJobs = 3;     // copies queued, running or back, at once
constexpr int kMaxDrains = 6;   // places waiting at once
constexpr int kMaxThreads = 3;  // client threads

enum class Op : uint8_t { kAdmit, kMove, kRelease };
enum class Actor : uint8_t { kReader, kFiller };
// The daemon's bookkeeping of which copies read a retired place.
enum class Bookkeeping : uint8_t {
  kVersioned,  // now: Retire marks mover_reads only for a copy of the retired version
  kCountOnly,  // before: any copy of the slot in flight marked it
};

enum JobState : uint8_t { kNoJob, kQueued, kRunning, kBack };
enum JobResult : uint8_t { kPublished, kBusy, kMismatch, kCancelled };

struct Job {
  uint8_t state = kNoJob;
  uint8_t pc = 0;
  uint8_t result = 0;
  uint8_t order = 0;      // submit order (the mover's queue), then back order
  uint8_t admission = 0;  // the engine slot and generation it moves
  uint8_t src = 0, dst = 0;
  uint32_t version = 0;  // the version of j.expected
};

struct Drain {
  uint32_t version = 0;
  uint8_t place = 0;
  uint8_t mover_reads = 0;
};

struct Client {
  uint8_t pc = 0;
  uint8_t tries = 0;
  uint8_t retries = 0;
  uint8_t place = 0;   // the place it reads or fills
  uint8_t expect = 0;  // a reader: the fill its block had when the lease was taken (0: none)
  uint64_t seen = 0;
};

struct DState {
  uint64_t words[4];
  LeaseEntry leases[kMaxThreads];
  int8_t mem[kPlaces][2];
  uint8_t free_mask;
  // The daemon's record of the slot: SegSlot and CopyState.
  uint8_t live;
  uint8_t place;
  uint8_t admission;  // admissions so far (a new engine slot each)
  uint8_t copying;    // CopyState::copying[seg]
  uint32_t version;   // CopyState::version[seg]
  uint8_t n_copies;   // versions of the copies in flight (the fix)
  uint32_t copies[kMaxJobs];
  uint8_t n_drains;
  Drain drains[kMaxDrains];
  // The daemon's thread.
  uint8_t script_pc;
  uint8_t scan;  // 0: not scanning; 1..threads: entries read so far, + 1
  uint64_t held[kMaxThreads];
  uint8_t orders;  // the next Job::order
  Job jobs[kMaxJobs];
  // What the client knows: the admission to fill (0: none) and its place.
  uint8_t unfilled;
  uint8_t fill_place;
  // Ghosts: admissions filled so far, and which admission each version names.
  uint8_t filled_mask;
  uint8_t admission_of[16];
  Client t[kMaxThreads];
};
static_assert(std::is_trivially_copyable_v<DState>);
static_assert(sizeof(DState) % 8 == 0);

// The states seen, each once, by their bytes: an arena and an open-addressed
// index into it (a node per state, as std::unordered_set keeps them, made the
// search three times slower).
class StateSet {
 public:
  StateSet() : index_(1u << 16, kEmpty) {}
  size_t size() const { return states_.size(); }
  const DState& operator[](uint32_t i) const { return states_[i]; }
  // The new state's number, or -1 when it was seen before.
  int64_t Insert(const DState& s) {
    if (2 * (states_.size() + 1) > index_.size()) Grow();
    const uint64_t h = Hash(s);
    for (size_t i = h & (index_.size() - 1);; i = (i + 1) & (index_.size() - 1)) {
      if (index_[i] == kEmpty) {
        index_[i] = static_cast<uint32_t>(states_.size());
        states_.push_back(s);
        return index_[i];
      }
      if (std::memcmp(&states_[index_[i]], &s, sizeof(DState)) == 0) return -1;
    }
  }

 private:
  static constexpr uint32_t kEmpty = ~0u;
  static uint64_t Hash(const DState& s) {
    uint64_t h = 0x9e3779b97f4a7c15ULL;
    const char* p = reinterpret_cast<const char*>(&s);
    for (size_t i = 0; i < sizeof(DState); i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      h = (h ^ w) * 0xff51afd7ed558ccdULL;
      h ^= h >> 32;
    }
    return h;
  }
  void Grow() {
    std::vector<uint32_t> bigger(index_.size() * 2, kEmpty);
    for (uint32_t n = 0; n < states_.size(); ++n) {
      size_t i = Hash(states_[n]) & (bigger.size() - 1);
      while (bigger[i] != kEmpty) i = (i + 1) & (bigger.size() - 1);
      bigger[i] = n;
    }
    index_.swap(bigger);
  }
  std::vector<DState> states_;
  std::vector<uint32_t> index_;
};

struct DaemonChecker {
  std::vector<Op> script;
  std::vector<Actor> actors;
  Bookkeeping bookkeeping = Bookkeeping::kVersioned;
  uint8_t reader_tries = 2;  // AcquireRead calls per reader
  StateSet seen;
  uint64_t states = 0, finals = 0, no_place = 0, read_ok = 0, published = 0, cancelled = 0;
  std::string failure;

  bool Fail(const std::string& why) {
    if (failure.empty()) failure = why;
    return false;
  }
  static uint64_t Word(uint8_t place, uint32_t version) { return LocationWord(0, place, version); }

  // ---- copy_mode.cpp and move_dispatch.cpp, for the one slot ----

  void AddDrain(DState& s, uint32_t version, uint8_t place) {
    if (s.n_drains == kMaxDrains) {
      Fail("the model's drain list is full");
      return;
    }
    s.drains[s.n_drains++] = Drain{version, place, 0};
  }

  bool TakeFree(DState& s, uint8_t* place) {
    for (uint8_t p = 0; p < kPlaces; ++p) {
      if (s.free_mask & (1u << p)) {
        s.free_mask &= ~(1u << p);
        *place = p;
        return true;
      }
    }
    return false;
  }

  // PutFree, and the checks that this place may be reused now.
  void PutFree(DState& s, uint8_t place, const char* by) {
    if (s.free_mask & (1u << place)) Fail(std::string(by) + " freed a free place");
    if (s.live && s.place == place) Fail(std::string(by) + " freed the block's own place");
    for (size_t i = 0; i < actors.size(); ++i) {
      const Client& t = s.t[i];
      if (actors[i] == Actor::kReader && t.pc >= 3 && t.pc <= 5 && t.place == place) {
        Fail(std::string(by) + " freed a place a reader holds a lease on");
      }
    }
    for (const Job& j : s.jobs) {
      if (j.state == kRunning && j.pc >= 1 && j.src == place) {
        Fail(std::string(by) + " freed the place a running copy reads");
      }
      if ((j.state == kQueued || j.state == kRunning) && j.dst == place) {
        Fail(std::string(by) + " freed the place a copy writes");
      }
    }
    s.free_mask |= 1u << place;
    s.mem[place][0] = s.mem[place][1] = kFreed;  // reused: another block's bytes
  }

  void PublishAdmitted(DState& s) {
    ++s.version;
    SetLocation(s.words, kSeg, Word(s.place, s.version) | kLocWriting);
  }

  void Retire(DState& s) {
    AddDrain(s, s.version, s.place);
    bool reads = s.copying > 0;
    if (bookkeeping == Bookkeeping::kVersioned) {
      bool of_this = false;
      for (uint8_t i = 0; i < s.n_copies; ++i) of_this |= s.copies[i] == s.version;
      reads = reads && of_this;
    }
    s.drains[s.n_drains - 1].mover_reads = reads;
    ++s.version;
    const uint64_t was =
        std::atomic_ref<uint64_t>(s.words[kSeg])
            .exchange(LocationWord(kNoLocationTier, 0, s.version), std::memory_order_seq_cst);
    if (was & kLocWriting) Fail("released while the write lease was held");
  }

  void CopyReturned(DState& s, uint32_t version) {
    if (s.copying > 0) --s.copying;
    for (uint8_t i = 0; i < s.n_copies; ++i) {
      if (s.copies[i] == version) {
        s.copies[i] = s.copies[--s.n_copies];
        break;
      }
    }
    bool still = false;  // another copy of that version still reads it
    if (bookkeeping == Bookkeeping::kVersioned) {
      for (uint8_t i = 0; i < s.n_copies; ++i) still |= s.copies[i] == version;
    }
    if (still) return;
    for (uint8_t i = 0; i < s.n_drains; ++i) {
      if (s.drains[i].version == version) s.drains[i].mover_reads = 0;
    }
  }

  // The engine plans no second move of a block while one is in flight.
  bool Moving(const DState& s) const {
    for (const Job& j : s.jobs) {
      if (j.state != kNoJob && j.admission == s.admission) return true;
    }
    return false;
  }

  void DispatchCopy(DState& s) {
    uint8_t dst = 0;
    if (!TakeFree(s, &dst)) return;  // copies_no_room
    for (Job& j : s.jobs) {
      if (j.state != kNoJob) continue;
      j = Job{kQueued, 0, 0, s.orders++, s.admission, s.place, dst, s.version};
      ++s.copying;
      s.copies[s.n_copies++] = s.version;
      s.admission_of[(s.version + 1) & 15] = s.admission;
      return;
    }
    Fail("the model's job list is full");
  }

  // MoveDispatch::CompleteCopy.
  void CompleteCopy(DState& s, Job& j) {
    CopyReturned(s, j.version);
    const bool current = s.live && j.admission == s.admission;
    if (j.result != kPublished) {
      PutFree(s, j.dst, "a failed copy");  // never published
    } else if (!current || j.version + 1 != s.version + 1) {
      AddDrain(s, j.version + 1, j.dst);  // released after the publish
    } else {
      AddDrain(s, s.version, j.src);
      s.version = j.version + 1;
      s.place = j.dst;
    }
    j = Job{};
  }

  // DrainPlaces' decision, after its scan of the lease table into s.held.
  void DecideDrains(DState& s) {
    uint8_t keep = 0;
    for (uint8_t i = 0; i < s.n_drains; ++i) {
      const Drain d = s.drains[i];
      bool held = false;
      for (size_t e = 0; e < actors.size(); ++e) held |= s.held[e] == LeaseWord(kSeg, d.version);
      if (!d.mover_reads && !held) {
        PutFree(s, d.place, "a drain");
        continue;
      }
      s.drains[keep++] = d;
    }
    s.n_drains = keep;
  }

  // ---- the daemon's thread ----

  bool ScriptOpReady(const DState& s) const {
    if (s.script_pc == script.size()) return false;
    switch (script[s.script_pc]) {
      case Op::kAdmit:
        return !s.live;
      case Op::kMove:
        return s.live && !Moving(s);
      case Op::kRelease:  // a client releases a block once it has filled it
        return s.live && s.unfilled == 0;
    }
    return false;
  }

  void RunScriptOp(DState& s) {
    switch (script[s.script_pc++]) {
      case Op::kAdmit:  // Requests::AdmitCopy: PlaceNew, Bind, PublishAdmitted
        if (!TakeFree(s, &s.place)) {
          Fail("no free place to admit");
          return;
        }
        s.live = 1;
        ++s.admission;
        PublishAdmitted(s);
        s.admission_of[s.version & 15] = s.admission;
        s.unfilled = s.admission;  // the reply: the client fills the block
        s.fill_place = s.place;
        return;
      case Op::kMove:
        DispatchCopy(s);
        return;
      case Op::kRelease:  // Shared::ReleaseSlot: Mover::Cancel, Retire, Unbind
        for (Job& j : s.jobs) {
          if (j.state == kQueued && j.admission == s.admission) {
            j.state = kBack;
            j.result = kCancelled;
            j.order = s.orders++;
            ++cancelled;
          }
        }
        Retire(s);
        s.live = 0;
        return;
    }
  }

  Job* NextBack(DState& s) {
    Job* first = nullptr;
    for (Job& j : s.jobs) {
      if (j.state == kBack && (!first || j.order < first->order)) first = &j;
    }
    return first;
  }

  // One step of the daemon's thread (`choice` picks among what it may do).
  bool DaemonStep(DState& s, int choice) {
    if (s.scan > 0) {  // DrainPlaces runs to its end
      if (choice != 0) return false;
      if (s.scan <= actors.size()) {
        s.held[s.scan - 1] = ReadLease(&s.leases[s.scan - 1]);
        ++s.scan;
        return true;
      }
      DecideDrains(s);
      s.scan = 0;
      for (uint64_t& h : s.held) h = 0;
      return true;
    }
    switch (choice) {
      case 0:
        if (!ScriptOpReady(s)) return false;
        RunScriptOp(s);
        return true;
      case 1: {
        Job* j = NextBack(s);
        if (!j) return false;
        CompleteCopy(s, *j);
        return true;
      }
      case 2:
        if (s.n_drains == 0) return false;
        s.scan = 1;
        return true;
    }
    return false;
  }

  // ---- the mover: RunCopy ----

  bool MoverStep(DState& s) {
    Job* run = nullptr;
    for (Job& j : s.jobs) {
      if (j.state == kRunning) run = &j;
    }
    if (!run) {  // take the first queued job
      for (Job& j : s.jobs) {
        if (j.state == kQueued && (!run || j.order < run->order)) run = &j;
      }
      if (!run) return false;
      run->state = kRunning;
      run->pc = 0;
      return true;
    }
    Job& j = *run;
    const uint64_t expected = Word(j.src, j.version);
    auto back = [&](JobResult r) {
      j.state = kBack;
      j.result = r;
      j.order = s.orders++;
      if (r == kPublished) ++published;
      return true;
    };
    auto reads = [&](uint8_t place) {
      if (s.free_mask & (1u << place)) Fail("the mover touched a free place");
    };
    switch (j.pc) {
      case 0:
        if (!BeginMove(s.words, kSeg, expected)) return back(kBusy);
        j.pc = 1;
        return true;
      case 1:
      case 2:  // the copy, a cell a step
        reads(j.src);
        reads(j.dst);
        s.mem[j.dst][j.pc - 1] = s.mem[j.src][j.pc - 1];
        ++j.pc;
        return true;
      case 3: {  // compare with the source
        reads(j.src);
        if (s.mem[j.dst][0] == s.mem[j.src][0] && s.mem[j.dst][1] == s.mem[j.src][1]) {
          j.pc = 4;
          return true;
        }
        const uint64_t now = std::atomic_ref<uint64_t>(s.words[kSeg]).load();
        AbortMove(s.words, kSeg);
        return back(now == (expected | kLocMoving) ? kMismatch : kBusy);
      }
      case 4:
        if (PublishMove(s.words, kSeg, expected, Word(j.dst, j.version + 1))) {
          return back(kPublished);
        }
        j.pc = 5;
        return true;
      case 5:
        AbortMove(s.words, kSeg);
        return back(kBusy);
    }
    return false;
  }

  // ---- client threads ----

  bool ReaderStep(DState& s, int i) {
    Client& t = s.t[i];
    std::atomic_ref<uint64_t> word(s.words[kSeg]);
    std::atomic_ref<uint64_t> held(s.leases[i].held);
    switch (t.pc) {
      case 0:  // AcquireRead: seen = word.load; no place: false
        if (t.tries == reader_tries) return false;
        t.seen = word.load();
        t.retries = 0;
        if (!DecodeLocation(t.seen).has_place()) {
          ++no_place;
          t = Client{0, static_cast<uint8_t>(t.tries + 1)};
          return true;
        }
        t.pc = 1;
        return true;
      case 1:
        held.store(LeaseWord(kSeg, DecodeLocation(t.seen).version));
        t.pc = 2;
        return true;
      case 2: {
        const uint64_t again = word.load();
        if (PlaceOf(again) == PlaceOf(t.seen)) {
          t.place = static_cast<uint8_t>(DecodeLocation(t.seen).index);
          const uint8_t adm = s.admission_of[DecodeLocation(t.seen).version & 15];
          t.expect = (s.filled_mask & (1u << adm)) ? adm : 0;
          ++read_ok;
          t.pc = 3;
          return true;
        }
        if (++t.retries > 8) return Fail("a reader retried more often than the daemon published");
        t.seen = again;
        // Released between the loads: the entry is cleared, false.
        t.pc = DecodeLocation(again).has_place() ? 1 : 6;
        return true;
      }
      case 3:
      case 4: {  // read the block, a cell a step
        if (s.free_mask & (1u << t.place)) return Fail("a reader read a free place");
        const int8_t v = s.mem[t.place][t.pc - 3];
        if (t.expect && v != static_cast<int8_t>(t.expect)) {
          return Fail("a reader read bytes its block never held");
        }
        ++t.pc;
        return true;
      }
      case 5:
        ReleaseRead(&s.leases[i]);
        t = Client{0, static_cast<uint8_t>(t.tries + 1)};
        return true;
      case 6:  // AcquireRead's no-place branch after its store
        held.store(0, std::memory_order_release);
        ++no_place;
        t = Client{0, static_cast<uint8_t>(t.tries + 1)};
        return true;
    }
    return false;
  }

  bool FillerStep(DState& s, int i) {
    Client& t = s.t[i];
    switch (t.pc) {
      case 0:
        if (s.unfilled == 0) return false;  // nothing to fill (yet)
        t.place = s.fill_place;
        t.pc = 1;
        return true;
      case 1:
      case 2:
        if (s.free_mask & (1u << t.place)) return Fail("a filler wrote a free place");
        s.mem[t.place][t.pc - 1] = static_cast<int8_t>(s.unfilled);
        ++t.pc;
        return true;
      case 3:
        if (!EndWrite(s.words, kSeg)) return Fail("EndWrite found no write lease");
        s.filled_mask |= 1u << s.unfilled;
        s.unfilled = 0;
        t = Client{};
        return true;
    }
    return false;
  }

  bool ClientStep(DState& s, int i) {
    return actors[i] == Actor::kReader ? ReaderStep(s, i) : FillerStep(s, i);
  }

  // States that differ only in the order of lists, or in numbers no step
  // reads any more, are one state.
  static void Canonical(DState& s) {
    std::sort(s.drains, s.drains + s.n_drains, [](const Drain& a, const Drain& b) {
      return std::tie(a.version, a.place, a.mover_reads) <
             std::tie(b.version, b.place, b.mover_reads);
    });
    std::sort(s.copies, s.copies + s.n_copies);
    // Jobs: in the order of the mover's queue and of their return, numbered
    // from 0, empty ones last.
    std::sort(s.jobs, s.jobs + kMaxJobs, [](const Job& a, const Job& b) {
      return std::make_tuple(a.state == kNoJob, a.order) <
             std::make_tuple(b.state == kNoJob, b.order);
    });
    uint8_t n = 0;
    for (Job& j : s.jobs) {
      if (j.state != kNoJob) j.order = n++;
    }
    s.orders = n;
  }

  // ---- the end ----

  void CheckFinal(DState s) {
    ++finals;
    for (size_t i = 0; i < actors.size(); ++i) {
      if (ReadLease(&s.leases[i]) != 0) Fail("a lease entry is left held at the end");
    }
    if (s.script_pc != script.size()) Fail("the daemon's script did not finish");
    // Every reader is done: one more drain must free every place but the block's.
    for (size_t i = 0; i < actors.size(); ++i) s.held[i] = ReadLease(&s.leases[i]);
    DecideDrains(s);
    for (uint8_t i = 0; i < s.n_drains; ++i) {
      Fail("place " + std::to_string(s.drains[i].place) + " (version " +
           std::to_string(s.drains[i].version) + ", mover_reads " +
           std::to_string(s.drains[i].mover_reads) + ") never drains: leaked");
    }
    if (s.copying != 0 || s.n_copies != 0) Fail("copies counted in flight at the end");
    const uint8_t all = (1u << kPlaces) - 1;
    if ((s.free_mask | (s.live ? 1u << s.place : 0u)) != all) Fail("a place leaked");
    const uint64_t w = s.words[kSeg];
    if (s.live) {
      if (w != Word(s.place, s.version)) Fail("the word is not the daemon's record of the place");
      if (s.unfilled == 0 && (s.mem[s.place][0] != static_cast<int8_t>(s.admission) ||
                              s.mem[s.place][1] != static_cast<int8_t>(s.admission))) {
        Fail("the block's place does not hold its bytes");
      }
    } else if (w != LocationWord(kNoLocationTier, 0, s.version)) {
      Fail("a released slot's word is not 'no place' at the daemon's version");
    }
  }

  void Run() {
    DState init;
    std::memset(static_cast<void*>(&init), 0, sizeof(init));  // padding too: the key is the bytes
    init.words[kSeg] = LocationWord(kNoLocationTier, 0, 0);
    init.free_mask = (1u << kPlaces) - 1;
    for (auto& m : init.mem) m[0] = m[1] = kFreed;
    std::vector<uint32_t> stack{static_cast<uint32_t>(seen.Insert(init))};
    while (!stack.empty() && failure.empty()) {
      const DState s = seen[stack.back()];
      stack.pop_back();
      ++states;
      bool busy = false;  // a step other than a drain scan's start is possible
      auto push = [&](DState& n) {
        Canonical(n);
        if (const int64_t i = seen.Insert(n); i >= 0) stack.push_back(static_cast<uint32_t>(i));
      };
      for (size_t i = 0; i < actors.size(); ++i) {
        DState n = s;
        if (ClientStep(n, static_cast<int>(i))) busy = true, push(n);
      }
      {
        DState n = s;
        if (MoverStep(n)) busy = true, push(n);
      }
      for (int choice = 0; choice < 3; ++choice) {
        DState n = s;
        if (DaemonStep(n, choice)) {
          busy |= choice != 2 || s.scan > 0;
          push(n);
        }
      }
      if (!busy) CheckFinal(s);
    }
  }
};

struct Outcome {
  std::string failure;
  uint64_t states = 0;
};

Outcome Explore(std::vector<Op> script, std::vector<Actor> actors, uint8_t reader_tries = 2,
                Bookkeeping bookkeeping = Bookkeeping::kVersioned) {
  DaemonChecker c;
  c.reader_tries = reader_tries;
  c.script = std::move(script);
  c.actors = std::move(actors);
  c.bookkeeping = bookkeeping;
  c.Run();
  std::printf(
      "%llu states, %llu final; reads %llu, no place %llu, published %llu, cancelled %llu\n",
      static_cast<unsigned long long>(c.states), static_cast<unsigned long long>(c.finals),
      static_cast<unsigned long long>(c.read_ok), static_cast<unsigned long long>(c.no_place),
      static_cast<unsigned long long>(c.published), static_cast<unsigned long long>(c.cancelled));
  if (c.failure.empty()) {
    // The search reached the cases it is for.
    EXPECT_GT(c.finals, 0u);
    EXPECT_GT(c.read_ok, 0u);
    EXPECT_GT(c.no_place, 0u);
  }
  return {c.failure, c.states};
}

using enum Op;
constexpr Actor kR = Actor::kReader, kF = Actor::kFiller;

}  // namespace daemon_model

// Every LeaseDaemonModel test failed, each mutation on its own, when the
// drain freed a place without looking up its leases; when Retire never kept a
// place for the mover; when CopyReturned left mover_reads set; when
// CompleteCopy freed at once the copy of a block released after its publish,
// or the source of a published copy; when AcquireRead's no-place branch left
// its entry held; when admission published without the write lease; and when
// the mover published before it copied.

// Admission (published with the write lease held, filled, EndWrite), one move,
// release; a reader before, during and after, finding no place at times.
TEST(LeaseDaemonModel, AdmitMoveRelease) {
  using namespace daemon_model;
  EXPECT_EQ(Explore({kAdmit, kMove, kRelease}, {kR, kF}).failure, "");
}

// Two moves one after the other, then release: CompleteCopy's publish and
// drain of each source, readers on either place.
TEST(LeaseDaemonModel, TwoMovesThenRelease) {
  using namespace daemon_model;
  EXPECT_EQ(Explore({kAdmit, kMove, kMove, kRelease}, {kR, kF}).failure, "");
}

// The slot released, admitted again and released again while the first
// admission's copy may still be queued, running or on its way back. The one
// test that fails on the bookkeeping before the fix (a place leaked, 3,847
// states in).
TEST(LeaseDaemonModel, ReleaseAndReadmitWhileACopyIsInFlight) {
  using namespace daemon_model;
  EXPECT_EQ(Explore({kAdmit, kMove, kRelease, kAdmit, kRelease}, {kR, kF}).failure, "");
}

// As above with a copy of the second admission too: two copies of one slot
// in flight, of different versions. The one test that fails when
// CopyReturned clears mover_reads of every place of the slot, not only of
// the copy's version (the mover's source freed under it). The largest
// search here (half a million states, 1 s; 20 s in a Debug TSan build, where
// a search with no threads checks nothing more: skipped there).
TEST(LeaseDaemonModel, TwoAdmissionsEachMovedAndReleased) {
  using namespace daemon_model;
#ifdef CXLTIER_MODEL_UNDER_TSAN
  GTEST_SKIP() << "single-threaded search: the plain and ASan builds run it";
#endif
  EXPECT_EQ(Explore({kAdmit, kMove, kRelease, kAdmit, kMove, kRelease}, {kR, kF}, 1).failure, "");
}

// Two readers. The one test that fails when the drain's scan skips an entry.
TEST(LeaseDaemonModel, TwoReadersAcrossARelease) {
  using namespace daemon_model;
  EXPECT_EQ(Explore({kAdmit, kMove, kRelease}, {kR, kR, kF}, 1).failure, "");
}

// The bookkeeping before the fix (Retire marked mover_reads whenever any copy
// of the slot was in flight; only a copy of that version clears it): the
// search finds the place it leaks.
TEST(LeaseDaemonModel, FindsTheLeakOfTheCountOnlyBookkeeping) {
  using namespace daemon_model;
  const Outcome o =
      Explore({kAdmit, kMove, kRelease, kAdmit, kRelease}, {kR, kF}, 2, Bookkeeping::kCountOnly);
  EXPECT_NE(o.failure.find("never drains: leaked"), std::string::npos) << o.failure;
}

}  // namespace
}  // namespace cxltier
