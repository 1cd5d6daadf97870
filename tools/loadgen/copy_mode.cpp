#include "copy_mode.h"

#include <linux/io_uring.h>
#include <numaif.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace cxltier::loadgen {
namespace {

uint64_t Mix(const BlockKey& k, uint64_t w) {
  uint64_t x =
      (k.hi * 0x9E3779B97F4A7C15ULL) ^ (k.lo + 0x632BE59BD9B4E019ULL) ^ (w * 0xC2B2AE3D27D4EB4FULL);
  x ^= x >> 29;
  return x;
}

}  // namespace

void FillBlock(uint8_t* p, uint64_t bytes, const BlockKey& key) {
  auto* w = reinterpret_cast<uint64_t*>(p);
  w[0] = key.hi;
  w[1] = key.lo;
  for (uint64_t i = 2; i < bytes / 8; ++i) w[i] = Mix(key, i);
}

bool BlockIntact(const uint8_t* p, uint64_t bytes, const BlockKey* key) {
  const auto* w = reinterpret_cast<const uint64_t*>(p);
  const BlockKey k{w[0], w[1]};
  if (key && !(k == *key)) return false;
  for (uint64_t i = 2; i < bytes / 8; ++i) {
    if (w[i] != Mix(k, i)) return false;
  }
  return true;
}

Pin::~Pin() {
  for (int fd : rings_) close(fd);
}

bool Pin::Add(void* base, uint64_t bytes, std::string* error) {
  io_uring_params params{};
  const int ring = static_cast<int>(syscall(__NR_io_uring_setup, 1, &params));
  if (ring < 0) {
    *error = std::string("io_uring_setup: ") + std::strerror(errno);
    return false;
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
    *error = std::string("io_uring_register(IORING_REGISTER_BUFFERS): ") + std::strerror(errno);
    return false;
  }
  return true;
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

Readers::Readers(Client& client, uint64_t block_bytes, int threads)
    : client_(client), block_bytes_(block_bytes), at_(client.slots(), SIZE_MAX) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this, i] { Run(i); });
}

void Readers::Publish(uint32_t slot, const BlockKey& key) {
  std::lock_guard lock(mu_);
  if (slot >= at_.size() || at_[slot] != SIZE_MAX) return;
  at_[slot] = live_.size();
  live_.emplace_back(slot, key);
}

void Readers::Withdraw(uint32_t slot) {
  std::lock_guard lock(mu_);
  if (slot >= at_.size() || at_[slot] == SIZE_MAX) return;
  const size_t i = at_[slot];
  at_[live_.back().first] = i;
  live_[i] = live_.back();
  live_.pop_back();
  at_[slot] = SIZE_MAX;
}

void Readers::Stop() {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void Readers::Run(int index) {
  Status st;
  auto reader = client_.NewReader(&st);
  if (!reader) {
    failed_.fetch_add(1);
    std::lock_guard lock(mu_);
    if (first_error_.empty()) first_error_ = st.message;
    return;
  }
  uint64_t n = static_cast<uint64_t>(index) * 7919;
  while (!stop_.load(std::memory_order_relaxed)) {
    Client::Reader::Lease lease;
    BlockKey key;
    {
      // Taken while the block is published: it is whole and live when the
      // lease starts; afterwards the main thread may release it, and its
      // place is kept until the lease ends.
      std::lock_guard lock(mu_);
      if (live_.empty()) {
        n = 0;
      } else {
        const auto& [slot, k] = live_[n++ % live_.size()];
        key = k;
        st = reader->Acquire(slot, &lease);
      }
    }
    if (lease.data == nullptr) {
      if (!st.ok()) {
        failed_.fetch_add(1);
        std::lock_guard lock(mu_);
        if (first_error_.empty()) first_error_ = st.message;
      }
      std::this_thread::yield();
      st = Status::Ok();
      continue;
    }
    if (!BlockIntact(lease.data, block_bytes_, &key)) torn_.fetch_add(1);
    if (!reader->Release(lease).ok()) failed_.fetch_add(1);
    reads_.fetch_add(1, std::memory_order_relaxed);
  }
}

}  // namespace cxltier::loadgen
