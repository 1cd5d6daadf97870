// Leases: the ReadLease and WriteLease classes (copy mode), views of a leased
// block that stay valid until the lease is released.
#include "leases.h"

#include <mutex>

namespace cxltier::python {

py::array PyReadLease::data() const {
  if (!held) Fail(wire::ErrorCode::kNoLease, "the read lease was released");
  return View(lease.data, {static_cast<py::ssize_t>(block_bytes)}, box, false);
}

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

py::array PyWriteLease::data() const {
  if (!held) Fail(wire::ErrorCode::kNoLease, "the write lease was released");
  return View(address, {static_cast<py::ssize_t>(block_bytes)}, box, true);
}

void PyWriteLease::release() {
  if (!held) return;
  Status st;
  {
    py::gil_scoped_release nogil;
    std::lock_guard lock(box->mu);
    st = box->client->EndWrite(slot);
  }
  held = false;
  Check(st);
}

void BindLeases(py::module_& m) {
  py::class_<PyReadLease>(m, "ReadLease",
                          "A copy-mode read lease: the block's bytes stay put until released.")
      .def_property_readonly("data", &PyReadLease::data, "read-only uint8 view of the block")
      .def_property_readonly("slot", [](const PyReadLease& l) { return l.lease.slot; })
      .def_property_readonly("tier",
                             [](const PyReadLease& l) { return static_cast<int>(l.lease.tier); })
      .def_readonly("held", &PyReadLease::held)
      .def("release", &PyReadLease::release)
      .def("__enter__", [](PyReadLease& l) { return l.data(); })
      .def("__exit__", [](PyReadLease& l, py::handle, py::handle, py::handle) {
        l.release();
        return false;
      });

  py::class_<PyWriteLease>(
      m, "WriteLease", "A copy-mode write lease: no copy of the block is published until released.")
      .def_property_readonly("data", &PyWriteLease::data, "writable uint8 view of the block")
      .def_readonly("slot", &PyWriteLease::slot)
      .def_readonly("held", &PyWriteLease::held)
      .def("release", &PyWriteLease::release)
      .def("__enter__", [](PyWriteLease& l) { return l.data(); })
      .def("__exit__", [](PyWriteLease& l, py::handle, py::handle, py::handle) {
        l.release();
        return false;
      });
}

}  // namespace cxltier::python
