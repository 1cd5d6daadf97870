// cxltier-loadgen's copy mode and pinning: blocks that carry their own key
// (so a reader can tell a torn or wrong block from a whole one), reader
// threads that check blocks under read leases while the daemon copies them,
// long-term pins with io_uring fixed buffers (the pin cudaHostRegister takes),
// and the kernel's answer on where a pool's pages are.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cxltier/client.h"

namespace cxltier::loadgen {

// A block's bytes: its key in the first 16, then words derived from it.
void FillBlock(uint8_t* p, uint64_t bytes, const BlockKey& key);
// Whether the bytes are one whole block, and of `key` when given.
bool BlockIntact(const uint8_t* p, uint64_t bytes, const BlockKey* key = nullptr);

// Pins [base, base + bytes) as io_uring fixed buffers (FOLL_LONGTERM, as
// cudaHostRegister does) for as long as the object lives.
class Pin {
 public:
  Pin() = default;
  ~Pin();
  Pin(const Pin&) = delete;
  Pin& operator=(const Pin&) = delete;
  bool Add(void* base, uint64_t bytes, std::string* error);

 private:
  std::vector<int> rings_;
};

// Pages of [base, base + bytes) not on any of `nodes` (move_pages, no move).
uint64_t PagesOffNodes(const void* base, uint64_t bytes, const std::vector<int>& nodes);

// Reader threads: each takes a published block under a read lease, checks
// every byte, releases. The main thread publishes a block once written and
// withdraws it before releasing it.
class Readers {
 public:
  Readers(Client& client, uint64_t block_bytes, int threads);
  ~Readers() { Stop(); }
  void Publish(uint32_t slot, const BlockKey& key);
  void Withdraw(uint32_t slot);
  void Stop();
  uint64_t reads() const { return reads_.load(); }
  uint64_t torn() const { return torn_.load(); }
  uint64_t failed() const { return failed_.load(); }
  const std::string& first_error() const { return first_error_; }

 private:
  void Run(int index);
  Client& client_;
  uint64_t block_bytes_;
  std::mutex mu_;
  std::vector<std::pair<uint32_t, BlockKey>> live_;  // GUARDED_BY(mu_)
  std::vector<size_t> at_;                           // GUARDED_BY(mu_): slot -> index in live_
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> reads_{0}, torn_{0}, failed_{0};
  std::string first_error_;  // GUARDED_BY(mu_)
  std::vector<std::thread> threads_;
};

}  // namespace cxltier::loadgen
