// Leases (leases.cpp): copy mode's read and write leases as Python objects;
// the client (client.cpp) takes them.
#pragma once

#include <memory>
#include <mutex>
#include <utility>

#include "bind.h"

namespace cxltier::python {

// Runs `f`, which waits for the client's lock, without the GIL when this
// thread holds it (a lease collected by Python): a thread in a blocking call
// holds that lock, and Python's other threads must go on meanwhile.
template <typename F>
void WithoutGil(F&& f) {
  if (PyGILState_Check()) {
    py::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

// Leases move (pybind11 returns them by value) but never copy: one release each.
// One garbage-collected while held is released then.
struct PyReadLease {
  std::shared_ptr<ClientBox> box;
  Client::Reader* reader = nullptr;
  Client::Reader::Lease lease;
  bool held = false;
  uint64_t block_bytes = 0;

  PyReadLease() = default;
  PyReadLease(const PyReadLease&) = delete;
  PyReadLease(PyReadLease&& o) noexcept
      : box(std::move(o.box)),
        reader(o.reader),
        lease(o.lease),
        held(std::exchange(o.held, false)),
        block_bytes(o.block_bytes) {}
  ~PyReadLease() {
    if (held && box) {
      WithoutGil([&] {
        std::lock_guard lock(box->mu);
        (void)reader->Release(lease);
      });
    }
  }

  void release();
};

// A write lease follows its block's key, not the slot it was taken on: a
// Reconnect carries the lease to the block's new slot, where another block
// may now be at the old one.
struct PyWriteLease {
  std::shared_ptr<ClientBox> box;
  BlockKey key;
  uint32_t slot = 0;  // when taken
  uint8_t* address = nullptr;
  bool held = false;
  uint64_t block_bytes = 0;

  PyWriteLease() = default;
  PyWriteLease(const PyWriteLease&) = delete;
  PyWriteLease(PyWriteLease&& o) noexcept
      : box(std::move(o.box)),
        key(o.key),
        slot(o.slot),
        address(o.address),
        held(std::exchange(o.held, false)),
        block_bytes(o.block_bytes) {}
  ~PyWriteLease() {
    if (held && box) {
      WithoutGil([&] {
        std::lock_guard lock(box->mu);
        (void)End();
      });
    }
  }

  // EndWrite on the block's slot now (box->mu held).
  Status End() const;
  void release();
};

}  // namespace cxltier::python
