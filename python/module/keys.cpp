// Keys: the Key class, the HintKind enum, and the conversions every area uses
// to take keys, slots and arrays from Python.
#include <string>
#include <vector>

#include "bind.h"

namespace cxltier::python {

BlockKey KeyFromInt(const py::int_& v) {
  py::int_ mask(~uint64_t{0});
  const py::object lo = v & mask;
  const py::object hi = (v >> py::int_(64)) & mask;
  if (v < py::int_(0) || v.attr("bit_length")().cast<int>() > 128) {
    throw py::value_error("a key given as an int must be in [0, 2**128)");
  }
  return BlockKey{hi.cast<uint64_t>(), lo.cast<uint64_t>()};
}

BlockKey ToKey(py::handle h) {
  if (py::isinstance<BlockKey>(h)) return h.cast<BlockKey>();
  if (py::isinstance<py::int_>(h)) return KeyFromInt(h.cast<py::int_>());
  if (py::isinstance<py::tuple>(h)) {
    auto t = h.cast<py::tuple>();
    if (t.size() == 2) return BlockKey{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()};
  }
  if (py::isinstance<py::bytes>(h)) {
    const std::string b = h.cast<std::string>();
    if (b.size() == 16) {
      BlockKey k;
      std::memcpy(&k.hi, b.data(), 8);
      std::memcpy(&k.lo, b.data() + 8, 8);
      return k;
    }
  }
  throw py::type_error(
      "a key is a cxltier.Key, an int in [0, 2**128), a (hi, lo) tuple or 16 bytes");
}

// Keys: one key, an iterable of keys, or a uint64 array of shape (n, 2).
std::vector<BlockKey> ToKeys(py::handle h) {
  std::vector<BlockKey> keys;
  if (h.is_none()) return keys;
  if (py::isinstance<py::array>(h)) {
    auto a = py::array_t<uint64_t, py::array::c_style | py::array::forcecast>::ensure(h);
    if (!a || a.ndim() != 2 || a.shape(1) != 2) {
      throw py::value_error("a key array is of shape (n, 2) and holds uint64 (hi, lo)");
    }
    auto r = a.unchecked<2>();
    keys.reserve(static_cast<size_t>(a.shape(0)));
    for (py::ssize_t i = 0; i < a.shape(0); ++i) keys.push_back(BlockKey{r(i, 0), r(i, 1)});
    return keys;
  }
  if (py::isinstance<BlockKey>(h) || py::isinstance<py::int_>(h) || py::isinstance<py::bytes>(h)) {
    keys.push_back(ToKey(h));
    return keys;
  }
  if (py::isinstance<py::tuple>(h)) {
    auto t = h.cast<py::tuple>();
    // (hi, lo) of ints is one key; any other tuple is a sequence of keys.
    if (t.size() == 2 && py::isinstance<py::int_>(t[0]) && py::isinstance<py::int_>(t[1])) {
      keys.push_back(ToKey(h));
      return keys;
    }
  }
  for (py::handle item : py::iter(h)) keys.push_back(ToKey(item));
  return keys;
}

std::vector<uint32_t> ToU32(py::handle h, const char* what) {
  auto a = py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(h);
  if (!a) throw py::type_error(std::string(what) + " must be integers");
  std::vector<uint32_t> out(static_cast<size_t>(a.size()));
  const int64_t* p = a.data();
  for (size_t i = 0; i < out.size(); ++i) {
    if (p[i] < 0 || p[i] > int64_t{UINT32_MAX}) {
      throw py::value_error(std::string(what) + " must be in [0, 2**32)");
    }
    out[i] = static_cast<uint32_t>(p[i]);
  }
  return out;
}

void BindKeys(py::module_& m) {
  py::enum_<HintKind>(m, "HintKind", "What a scheduler hint says about a group.")
      .value("IDLE", HintKind::kIdle, "the group waits for its user")
      .value("SOON", HintKind::kSoon, "the group runs again shortly")
      .value("DONE", HintKind::kDone, "the request finished");

  py::class_<BlockKey>(m, "Key", "The 16-byte identity of a block (hi, lo).")
      .def(py::init<>())
      .def(py::init([](uint64_t hi, uint64_t lo) {
             return BlockKey{hi, lo};
           }),
           py::arg("hi"), py::arg("lo"))
      .def(py::init([](const py::int_& v) { return KeyFromInt(v); }), py::arg("value"),
           "A key from an int in [0, 2**128) (hi is the upper 64 bits).")
      .def_readwrite("hi", &BlockKey::hi)
      .def_readwrite("lo", &BlockKey::lo)
      .def_static("from_sequence", &BlockKey::FromSequence, py::arg("sequence_id"),
                  py::arg("block_index"), "hi = sequence id, lo = block index.")
      .def_static(
          "from_parent",
          [](py::handle parent, py::handle tokens) {
            const BlockKey p = parent.is_none() ? BlockKey{} : ToKey(parent);
            auto t =
                py::array_t<uint32_t, py::array::c_style | py::array::forcecast>::ensure(tokens);
            if (!t) throw py::type_error("tokens must be integers");
            return BlockKey::FromParent(p, {t.data(), static_cast<size_t>(t.size())});
          },
          py::arg("parent"), py::arg("tokens"),
          "XXH3-128 of the parent key and the block's token ids: the prefix-hash key "
          "(parent None for the first block).")
      .def_static(
          "parse",
          [](const std::string& text) {
            BlockKey k;
            if (!BlockKey::Parse(text, &k)) throw py::value_error("not 32 hex digits: " + text);
            return k;
          },
          py::arg("text"))
      .def("__int__",
           [](const BlockKey& k) { return (py::int_(k.hi) << py::int_(64)) | py::int_(k.lo); })
      .def("__index__",
           [](const BlockKey& k) { return (py::int_(k.hi) << py::int_(64)) | py::int_(k.lo); })
      .def("__str__", &BlockKey::ToString)
      .def("__repr__", [](const BlockKey& k) { return "cxltier.Key('" + k.ToString() + "')"; })
      .def("__eq__",
           [](const BlockKey& a, py::handle b) {
             try {
               return a == ToKey(b);
             } catch (const py::type_error&) {
               return false;
             }
           })
      .def("__hash__", [](const BlockKey& k) { return static_cast<int64_t>(HashKey(k) >> 1); })
      .def(py::pickle([](const BlockKey& k) { return py::make_tuple(k.hi, k.lo); },
                      [](py::tuple t) {
                        return BlockKey{t[0].cast<uint64_t>(), t[1].cast<uint64_t>()};
                      }));
}

}  // namespace cxltier::python
