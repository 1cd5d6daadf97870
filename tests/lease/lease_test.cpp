// The hand-off protocol's functions (cxltier/lease.h) one by one, and the
// real functions under threads: a mover that copies a block back and forth
// and reuses the places it leaves, and readers that check every byte under
// their leases. Under TSan (the README's test command runs this binary in
// the tsan stage) a reused place read under a lease is a reported race.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "cxltier/lease.h"

namespace cxltier {
namespace {

TEST(Lease, WordsRoundTrip) {
  const uint64_t w = LocationWord(1, 123456, 0xdeadbeef);
  const Location l = DecodeLocation(w);
  EXPECT_EQ(l.tier, 1);
  EXPECT_EQ(l.index, 123456u);
  EXPECT_EQ(l.version, 0xdeadbeefu);
  EXPECT_TRUE(l.has_place());
  EXPECT_FALSE(DecodeLocation(LocationWord(kNoLocationTier, 0, 7)).has_place());
  EXPECT_EQ(PlaceOf(w | kLocWriting | kLocMoving), w);
  EXPECT_EQ(LeaseWord(0, 0), uint64_t{1} << 32);  // never 0, the free entry
}

TEST(Lease, ReadLeaseNamesSlotAndVersion) {
  uint64_t words[4] = {LocationWord(kNoLocationTier, 0, 0), LocationWord(0, 9, 3)};
  LeaseEntry e;
  Location where;
  EXPECT_FALSE(AcquireRead(words, &e, 0, 1, &where));  // no place: nothing held
  EXPECT_EQ(e.held, 0u);
  ASSERT_TRUE(AcquireRead(words, &e, 1, 42, &where));
  EXPECT_EQ(where.index, 9u);
  EXPECT_EQ(ReadLease(&e), LeaseWord(1, 3));
  EXPECT_EQ(e.since_tick, 42u);
  ReleaseRead(&e);
  EXPECT_EQ(ReadLease(&e), 0u);
}

TEST(Lease, WriterWinsOverACopy) {
  uint64_t words[1] = {LocationWord(0, 1, 1)};
  const uint64_t at = words[0];
  Location where;
  // No copy starts while the write lease is held.
  ASSERT_EQ(BeginWrite(words, 0, &where), WriteStart::kOk);
  EXPECT_EQ(BeginWrite(words, 0, &where), WriteStart::kAlreadyWriting);
  EXPECT_FALSE(BeginMove(words, 0, at));
  EXPECT_TRUE(EndWrite(words, 0));
  EXPECT_FALSE(EndWrite(words, 0));  // not held any more
  // A writer that comes during a copy cancels its publication.
  ASSERT_TRUE(BeginMove(words, 0, at));
  ASSERT_EQ(BeginWrite(words, 0, &where), WriteStart::kOk);
  EXPECT_EQ(where.index, 1u);
  EXPECT_FALSE(words[0] & kLocMoving);
  EXPECT_TRUE(EndWrite(words, 0));
  EXPECT_FALSE(PublishMove(words, 0, at, LocationWord(1, 2, 2)));
  AbortMove(words, 0);
  EXPECT_EQ(words[0], at);
  // Undisturbed, the copy is published.
  ASSERT_TRUE(BeginMove(words, 0, at));
  EXPECT_TRUE(PublishMove(words, 0, at, LocationWord(1, 2, 2)));
  EXPECT_EQ(DecodeLocation(words[0]).index, 2u);
  // A word the client scribbled on moves nothing.
  words[0] |= uint64_t{1} << 31;
  EXPECT_FALSE(BeginMove(words, 0, LocationWord(1, 2, 2)));
}

TEST(Lease, NoPlaceMeansNoWriteLease) {
  uint64_t words[1] = {LocationWord(kNoLocationTier, 0, 4)};
  Location where;
  EXPECT_EQ(BeginWrite(words, 0, &where), WriteStart::kNoPlace);
  EXPECT_EQ(words[0], LocationWord(kNoLocationTier, 0, 4));
}

// Real functions, real threads: a mover copying one block between 4 places
// and reusing (overwriting) each place it leaves once no lease names it;
// readers checking that every byte under a lease is the block's.
TEST(Lease, ReadersNeverSeeAReusedPlace) {
  constexpr uint32_t kSlot = 3;
  constexpr int kPlaces = 4;
  constexpr size_t kWords = 512;  // 4 KiB per place
  constexpr uint64_t kValue = 0x5eed5eed5eed5eedULL;
  constexpr int kReaders = 3;
  std::vector<std::vector<uint64_t>> mem(kPlaces, std::vector<uint64_t>(kWords, 0));
  mem[0].assign(kWords, kValue);
  uint64_t words[8] = {};
  words[kSlot] = LocationWord(0, 0, 0);
  std::vector<LeaseEntry> leases(kReaders);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reads{0}, bad{0};

  std::vector<std::thread> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.emplace_back([&, r] {
      while (!stop.load(std::memory_order_relaxed)) {
        Location where;
        if (!AcquireRead(words, &leases[r], kSlot, 0, &where)) {
          bad.fetch_add(1);
          continue;
        }
        const std::vector<uint64_t>& m = mem[where.index];
        for (size_t i = 0; i < kWords; ++i) {
          if (m[i] != kValue) bad.fetch_add(1);
        }
        ReleaseRead(&leases[r]);
        reads.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  uint32_t place = 0, version = 0;
  std::vector<std::pair<uint32_t, uint32_t>> draining;  // (place, version)
  uint32_t moves = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((moves < 2000 || reads.load() < 2000) && std::chrono::steady_clock::now() < deadline) {
    // Reuse what no lease names any more.
    for (size_t i = 0; i < draining.size();) {
      bool held = false;
      for (const LeaseEntry& e : leases)
        held |= ReadLease(&e) == LeaseWord(kSlot, draining[i].second);
      if (held) {
        ++i;
        continue;
      }
      std::fill(mem[draining[i].first].begin(), mem[draining[i].first].end(), 0);
      draining.erase(draining.begin() + static_cast<long>(i));
    }
    // Move to a free place, if there is one.
    uint32_t dst = kPlaces;
    for (uint32_t p = 0; p < kPlaces; ++p) {
      bool busy = p == place;
      for (auto& d : draining) busy |= d.first == p;
      if (!busy) {
        dst = p;
        break;
      }
    }
    if (dst == kPlaces) {
      std::this_thread::yield();
      continue;
    }
    const uint64_t at = LocationWord(0, place, version);
    ASSERT_TRUE(BeginMove(words, kSlot, at));
    mem[dst] = mem[place];
    ASSERT_TRUE(PublishMove(words, kSlot, at, LocationWord(0, dst, version + 1)));
    draining.emplace_back(place, version);
    place = dst;
    ++version;
    ++moves;
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GE(moves, 2000u);
  EXPECT_GE(reads.load(), 2000u);
}

}  // namespace
}  // namespace cxltier
