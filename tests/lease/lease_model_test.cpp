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

#include <array>
#include <cstring>
#include <string>
#include <unordered_set>
#include <vector>

#include "cxltier/lease.h"

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

}  // namespace
}  // namespace cxltier
