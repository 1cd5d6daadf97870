// cxltier._cxltier: the Python binding of the C++ client (pybind11).
//
// This file makes the module: errors, the module-level helpers, and a Bind*
// call per area, in the order the classes must be registered. The areas are
// in module/: keys.cpp, gqa.cpp (the model and GQA), pools.cpp, leases.cpp,
// client.cpp; module/bind.h has what they share (and how memory and locking
// work).
#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "cxltier/socket_path.h"
#include "cxltier/status.h"
#include "cxltier/wire.h"
#include "module/bind.h"

namespace cxltier::python {
namespace {

// cxltier/__init__.py's factory: (code, name, message) -> an exception object.
// Leaked on purpose: it must outlive every translation, even at interpreter exit.
py::object* g_error_factory = nullptr;

void RaiseStatus(const StatusError& e) {
  const Status& st = e.status;
  const char* name = wire::ErrorName(st.code);
  if (!g_error_factory) {
    PyErr_SetString(PyExc_RuntimeError, st.message.c_str());
    return;
  }
  py::object exc = (*g_error_factory)(static_cast<uint32_t>(st.code), name, st.message);
  for (const auto& [field, value] : e.fields) exc.attr(field.c_str()) = value;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

}  // namespace
}  // namespace cxltier::python

using namespace cxltier;
using namespace cxltier::python;

PYBIND11_MODULE(_cxltier, m) {
  m.doc() = "cxltier's client library, bound with pybind11 (see cxltier/__init__.py)";

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const StatusError& e) {
      RaiseStatus(e);
    }
  });
  m.def(
      "_set_error_factory",
      [](py::object f) {
        if (!g_error_factory) g_error_factory = new py::object();
        *g_error_factory = std::move(f);
      },
      "Internal: the callable (code, name, message) -> exception used for daemon errors.");

  m.def("default_socket_path", &DefaultSocketPath,
        "Where the daemon listens by default for this user.");
  m.def(
      "error_name",
      [](uint32_t code) { return wire::ErrorName(static_cast<wire::ErrorCode>(code)); },
      "The wire protocol's name of an error code ('bad-payload', ...).");

  BindKeys(m);
  BindModel(m);
  BindPools(m);
  BindResults(m);
  BindLeases(m);
  BindClient(m);
  BindGqa(m);
}
