// Leases: the ReadLease and WriteLease classes (copy mode), views of a leased
// block that stay valid until the lease is released.
#include "leases.h"

#include <mutex>

namespace cxltier::python {

namespace {

// The views of a leased block have the lease object itself as their base:
// while a view lives, so does the lease (`v = c.acquire(s).data` used to
// release the lease with its temporary at once, and v then showed whatever
// block the daemon put there next). release() still ends the lease: a view
// kept past it must not be read.
py::array ReadData(py::object self) {
  const auto& l = self.cast<const PyReadLease&>();
  if (!l.held) Fail(wire::ErrorCode::kNoLease, "the read lease was released");
  return View(l.lease.data, {static_cast<py::ssize_t>(l.block_bytes)}, self, false);
}

py::array WriteData(py::object self) {
  const auto& l = self.cast<const PyWriteLease&>();
  if (!l.held) Fail(wire::ErrorCode::kNoLease, "the write lease was released");
  return View(l.address, {static_cast<py::ssize_t>(l.block_bytes)}, self, true);
}

}  // namespace

void PyReadLease::release() {
  if (!held) return;
  Status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard lock(box->mu);
    st = reader->Release(lease);
  }
  held = false;
  Check(st);
}

Status PyWriteLease::End() const {
  uint32_t now = 0;
  // The same block: held under the key, with its write lease at our address
  // (released and admitted again since, it is another admission's).
  if (!box->client->SlotOf(key, &now) || box->client->WriteAddress(now) != address) {
    return Status::Fail(wire::ErrorCode::kNoLease,
                        "key " + key.ToString() + ": this write lease's block is no longer held");
  }
  return box->client->EndWrite(now);
}

void PyWriteLease::release() {
  if (!held) return;
  Status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard lock(box->mu);
    st = End();
  }
  held = false;
  Check(st);
}

void BindLeases(py::module_& m) {
  py::class_<PyReadLease>(m, "ReadLease",
                          "A copy-mode read lease: the block's bytes stay put until released.")
      .def_property_readonly("data", &ReadData,
                             "read-only uint8 view of the block (it keeps the lease alive)")
      .def_property_readonly("slot", [](const PyReadLease& l) { return l.lease.slot; })
      .def_property_readonly("tier",
                             [](const PyReadLease& l) { return static_cast<int>(l.lease.tier); })
      .def_readonly("held", &PyReadLease::held)
      .def("release", &PyReadLease::release)
      .def("__enter__", &ReadData)
      .def("__exit__", [](PyReadLease& l, py::handle, py::handle, py::handle) {
        l.release();
        return false;
      });

  py::class_<PyWriteLease>(
      m, "WriteLease", "A copy-mode write lease: no copy of the block is published until released.")
      .def_property_readonly("data", &WriteData,
                             "writable uint8 view of the block (it keeps the lease alive)")
      .def_readonly("slot", &PyWriteLease::slot, "the slot it was taken on")
      .def_property_readonly("key", [](const PyWriteLease& l) { return l.key; })
      .def_readonly("held", &PyWriteLease::held)
      .def("release", &PyWriteLease::release)
      .def("__enter__", &WriteData)
      .def("__exit__", [](PyWriteLease& l, py::handle, py::handle, py::handle) {
        l.release();
        return false;
      });
}

}  // namespace cxltier::python
