// What the parts of cxltier._cxltier share: the Bind* function of each area
// (cxltier_module.cpp calls them in order), errors on their way to Python,
// the conversions of keys, slots and arrays, the model, and the memory that
// numpy views keep alive.
//
// Memory a Python view can see (pool mappings, tier pools, leased blocks) is
// owned by a shared_ptr that every numpy view's base object holds too, so no
// view outlives its mapping: closing a client drops the Python object's
// reference, and the connection and its mappings go when the last view goes.
//
// Every call into the Client runs under ClientBox::mu with the GIL released
// (so other Python threads run meanwhile, and the client's "needs external
// serialisation" holds); no Python object is touched while mu is held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/client.h"
#include "cxltier/detail/errno_text.h"
#include "cxltier/model.h"
#include "cxltier/status.h"
#include "cxltier/wire.h"

namespace py = pybind11;

namespace cxltier::python {

// The areas, in the order the module registers them (a class must be
// registered before a signature names it).
void BindKeys(py::module_& m);     // keys.cpp: HintKind, Key
void BindModel(py::module_& m);    // gqa.cpp: Model
void BindPools(py::module_& m);    // pools.cpp: Pool
void BindResults(py::module_& m);  // client.cpp: AdmitResult, ReleaseResult, ...
void BindLeases(py::module_& m);   // leases.cpp: ReadLease, WriteLease
void BindClient(py::module_& m);   // client.cpp: _Client, daemon_stats
void BindGqa(py::module_& m);      // gqa.cpp: aggregate_streams, ...

// ---- errors ----

// A failed Status on its way to Python: the module's translator raises the
// cxltier.Error subclass of its code.
struct StatusError : std::exception {
  Status status;
  // Set as attributes of the Python exception (report's accepted and
  // rejected: what the parts before the failure did).
  std::vector<std::pair<std::string, uint64_t>> fields;
  explicit StatusError(Status s, std::vector<std::pair<std::string, uint64_t>> f = {})
      : status(std::move(s)), fields(std::move(f)) {}
  const char* what() const noexcept override { return status.message.c_str(); }
};

inline void Check(const Status& st) {
  if (!st.ok()) throw StatusError(st);
}

[[noreturn]] inline void Fail(wire::ErrorCode code, const std::string& message) {
  throw StatusError(Status::Fail(code, message));
}

// ---- keys (keys.cpp) ----

BlockKey KeyFromInt(const py::int_& v);
BlockKey ToKey(py::handle h);
// Keys: one key, an iterable of keys, or a uint64 array of shape (n, 2).
std::vector<BlockKey> ToKeys(py::handle h);
std::vector<uint32_t> ToU32(py::handle h, const char* what);

template <typename T>
py::array_t<T> ToArray(const std::vector<T>& v) {
  py::array_t<T> a(static_cast<py::ssize_t>(v.size()));
  if (!v.empty()) std::memcpy(a.mutable_data(), v.data(), v.size() * sizeof(T));
  return a;
}

// ---- the model ----

// A ModelGeometry whose name Python owns (ModelGeometry::name is a view).
struct Model {
  std::string name = "custom";
  ModelGeometry g;
  ModelGeometry geometry() const {
    ModelGeometry m = g;
    m.name = name;
    return m;
  }
};

// ---- mappings that views keep alive ----

// A range of memory and what keeps it mapped.
struct Mapping {
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  bool owned = false;           // munmap at the end (pools this module made)
  int fd = -1;                  // a memfd this module made or duplicated; closed at the end
  std::shared_ptr<void> owner;  // what else must live (the client, for tier pools)
  ~Mapping() {
    if (owned && base) munmap(base, bytes);
    if (fd >= 0) close(fd);
  }
};

// The Client and everything it needs alive. Readers are destroyed before it.
struct ClientBox {
  std::string model_name;
  std::mutex mu;
  std::unique_ptr<Client> client;                        // GUARDED_BY(mu)
  std::vector<std::unique_ptr<Client::Reader>> readers;  // GUARDED_BY(mu); lazily made
  std::vector<std::shared_ptr<Mapping>> pools;           // registered page-mode pools
  // Blocks admitted into a tier pool whose write lease (the admission's) no
  // WriteLease has taken over yet, by key: slots change across a Reconnect,
  // and the lease goes with the block. GUARDED_BY(mu).
  std::unordered_set<BlockKey, BlockKeyHash> admitted_writes;
  ~ClientBox() {
    readers.clear();
    client.reset();
  }
};

// A numpy view of [p, p + bytes) whose base is the Python object `base`:
// it lives as long as the view does.
inline py::array View(const uint8_t* p, std::vector<py::ssize_t> shape, py::handle base,
                      bool writable) {
  py::array a(py::dtype::of<uint8_t>(), std::move(shape), {}, const_cast<uint8_t*>(p), base);
  if (!writable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

// A numpy view of [p, p + bytes) whose base keeps `keep` alive.
template <typename K>
py::array View(const uint8_t* p, std::vector<py::ssize_t> shape, const std::shared_ptr<K>& keep,
               bool writable) {
  auto* holder = new std::shared_ptr<K>(keep);
  py::capsule base(holder, [](void* v) { delete static_cast<std::shared_ptr<K>*>(v); });
  return View(p, std::move(shape), base, writable);
}

}  // namespace cxltier::python
