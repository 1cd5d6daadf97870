// cxltier._cxltier: the Python binding of the C++ client (pybind11).
//
// Memory a Python view can see (pool mappings, tier pools, leased blocks) is
// owned by a shared_ptr that every numpy view's base object holds too, so no
// view outlives its mapping: closing a client drops the Python object's
// reference, and the connection and its mappings go when the last view goes.
//
// Every call into the Client runs under ClientBox::mu with the GIL released
// (so other Python threads run meanwhile, and the client's "needs external
// serialisation" holds); no Python object is touched while mu is held.
#include <fcntl.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "cxltier/block.h"
#include "cxltier/client.h"
#include "cxltier/model.h"
#include "cxltier/socket_path.h"
#include "cxltier/status.h"
#include "cxltier/wire.h"

namespace py = pybind11;

namespace cxltier::python {
namespace {

// A failed Status on its way to Python: the translator below raises the
// cxltier.Error subclass of its code.
struct StatusError : std::exception {
  Status status;
  explicit StatusError(Status s) : status(std::move(s)) {}
  const char* what() const noexcept override { return status.message.c_str(); }
};

void Check(const Status& st) {
  if (!st.ok()) throw StatusError(st);
}

[[noreturn]] void Fail(wire::ErrorCode code, const std::string& message) {
  throw StatusError(Status::Fail(code, message));
}

// cxltier/__init__.py's factory: (code, name, message) -> an exception object.
// Leaked on purpose: it must outlive every translation, even at interpreter exit.
py::object* g_error_factory = nullptr;

void RaiseStatus(const Status& st) {
  const char* name = wire::ErrorName(st.code);
  if (!g_error_factory) {
    PyErr_SetString(PyExc_RuntimeError, st.message.c_str());
    return;
  }
  py::object exc = (*g_error_factory)(static_cast<uint32_t>(st.code), name, st.message);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
}

Status SysStatus(const std::string& what) {
  return Status::Fail(wire::ErrorCode::kInternal, what + ": " + std::strerror(errno));
}

// ---- keys ----

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

Model MakeModel(uint32_t layers, uint32_t query_heads, uint32_t kv_heads, uint32_t head_dim,
                uint32_t dtype_bytes, uint32_t block_tokens, const std::string& name) {
  Model m;
  m.name = name;
  m.g = ModelGeometry{"", layers, query_heads, kv_heads, head_dim, dtype_bytes, block_tokens};
  return m;
}

Model FromPreset(const ModelGeometry& g) {
  Model m;
  m.name = std::string(g.name);
  m.g = g;
  return m;
}

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
  // Slots admitted into a tier pool whose write lease (the admission's) no
  // WriteLease has taken over yet. GUARDED_BY(mu).
  std::unordered_set<uint32_t> admitted_writes;
  ~ClientBox() {
    readers.clear();
    client.reset();
  }
};

// A numpy view of [p, p + bytes) whose base keeps `keep` alive.
template <typename K>
py::array View(const uint8_t* p, std::vector<py::ssize_t> shape, const std::shared_ptr<K>& keep,
               bool writable) {
  auto* holder = new std::shared_ptr<K>(keep);
  py::capsule base(holder, [](void* v) { delete static_cast<std::shared_ptr<K>*>(v); });
  py::array a(py::dtype::of<uint8_t>(), std::move(shape), {}, const_cast<uint8_t*>(p), base);
  if (!writable) a.attr("setflags")(py::arg("write") = false);
  return a;
}

// ---- pools ----

struct Pool {
  uint32_t id = UINT32_MAX;
  std::string kind;  // memfd, range, tier0, tier1
  uint32_t blocks = 0;
  uint64_t stride = 0;
  uint64_t block_bytes = 0;
  std::shared_ptr<Mapping> map;

  py::array array() const {
    return View(map->base, {static_cast<py::ssize_t>(blocks), static_cast<py::ssize_t>(stride)},
                map, true);
  }
  py::array block(uint32_t i) const {
    if (i >= blocks)
      throw py::index_error("block " + std::to_string(i) + " of " + std::to_string(blocks));
    return View(map->base + uint64_t{i} * stride, {static_cast<py::ssize_t>(block_bytes)}, map,
                true);
  }
  int fd() const { return map->fd; }
};

// ---- leases ----

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
      std::lock_guard lock(box->mu);
      (void)reader->Release(lease);
    }
  }

  py::array data() const {
    if (!held) Fail(wire::ErrorCode::kNoLease, "the read lease was released");
    return View(lease.data, {static_cast<py::ssize_t>(block_bytes)}, box, false);
  }
  void release() {
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
};

struct PyWriteLease {
  std::shared_ptr<ClientBox> box;
  uint32_t slot = 0;
  uint8_t* address = nullptr;
  bool held = false;
  uint64_t block_bytes = 0;

  PyWriteLease() = default;
  PyWriteLease(const PyWriteLease&) = delete;
  PyWriteLease(PyWriteLease&& o) noexcept
      : box(std::move(o.box)),
        slot(o.slot),
        address(o.address),
        held(std::exchange(o.held, false)),
        block_bytes(o.block_bytes) {}
  ~PyWriteLease() {
    if (held && box) {
      std::lock_guard lock(box->mu);
      (void)box->client->EndWrite(slot);
    }
  }

  py::array data() const {
    if (!held) Fail(wire::ErrorCode::kNoLease, "the write lease was released");
    return View(address, {static_cast<py::ssize_t>(block_bytes)}, box, true);
  }
  void release() {
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
};

// ---- results ----

struct AdmitResults {
  py::array_t<uint32_t> slots;
  py::array_t<uint8_t> tiers;
  py::array_t<bool> restored;
};

uint64_t PageBytes() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

// ---- the client ----

class PyClient {
 public:
  PyClient(const std::string& socket_path, const Model& model, uint32_t max_blocks,
           const std::string& name)
      : socket_path_(socket_path), model_(model), box_(std::make_shared<ClientBox>()) {
    box_->model_name = model.name;
    Client::Options o{socket_path, model.g, max_blocks, name};
    o.model.name = box_->model_name;
    Status st;
    {
      py::gil_scoped_release nogil;
      box_->client = Client::Connect(o, &st);
    }
    Check(st);
  }

  // Runs f(client) under the box's mutex with the GIL released.
  template <typename F>
  auto Locked(F&& f) const {
    Client& c = Get();
    std::shared_ptr<ClientBox> box = box_;
    py::gil_scoped_release nogil;
    std::lock_guard lock(box->mu);
    return f(c);
  }

  Client& Get() const {
    if (!box_ || !box_->client) Fail(wire::ErrorCode::kNotReady, "the client is closed");
    return *box_->client;
  }

  void close() { box_.reset(); }
  bool closed() const { return !box_; }

  uint64_t page_stride(uint64_t stride) const {
    const uint64_t page = PageBytes();
    return stride ? stride : (Get().block_bytes() + page - 1) / page * page;
  }

  Pool Register(std::shared_ptr<Mapping> map, const std::string& kind, uint64_t stride,
                uint32_t blocks) {
    Pool p;
    p.kind = kind;
    p.blocks = blocks;
    p.stride = stride;
    p.block_bytes = Get().block_bytes();
    p.map = map;
    uint32_t id = 0;
    const Status st = Locked([&](Client& c) {
      return kind == "memfd" ? c.RegisterMemfdPool(map->fd, map->bytes, stride, blocks, &id)
                             : c.RegisterRangePool(map->base, map->bytes, stride, blocks, &id);
    });
    Check(st);
    p.id = id;
    box_->pools.push_back(map);
    return p;
  }

  Pool create_memfd_pool(uint32_t blocks, uint64_t stride, const std::string& name) {
    stride = page_stride(stride);
    auto map = std::make_shared<Mapping>();
    map->bytes = stride * blocks;
    map->fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (map->fd < 0) Check(SysStatus("memfd_create"));
    if (ftruncate(map->fd, static_cast<off_t>(map->bytes)) != 0) Check(SysStatus("ftruncate"));
    MapShared(*map, map->fd);
    return Register(map, "memfd", stride, blocks);
  }

  Pool register_memfd_pool(int fd, uint64_t length, uint64_t stride, uint32_t blocks) {
    auto map = std::make_shared<Mapping>();
    map->bytes = length;
    map->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (map->fd < 0) Check(SysStatus("duplicating the memfd"));
    MapShared(*map, map->fd);
    return Register(map, "memfd", page_stride(stride), blocks);
  }

  Pool create_range_pool(uint32_t blocks, uint64_t stride) {
    stride = page_stride(stride);
    auto map = std::make_shared<Mapping>();
    map->bytes = stride * blocks;
    void* p = mmap(nullptr, map->bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) Check(SysStatus("mapping a range pool"));
    map->base = static_cast<uint8_t*>(p);
    map->owned = true;
    // THP off: a huge page spanning two blocks would make them move together.
    madvise(p, map->bytes, MADV_NOHUGEPAGE);
    return Register(map, "range", stride, blocks);
  }

  static void MapShared(Mapping& map, int fd) {
    void* p = mmap(nullptr, map.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) Check(SysStatus("mapping the pool"));
    map.base = static_cast<uint8_t*>(p);
    map.owned = true;
    madvise(p, map.bytes, MADV_NOHUGEPAGE);
  }

  void create_tier_pools(uint32_t blocks, uint64_t stride, const std::string& devdax_path,
                         uint64_t devdax_offset) {
    Client::TierPoolOptions o;
    o.blocks = blocks;
    o.stride = stride;
    o.devdax_path = devdax_path;
    o.devdax_offset = devdax_offset;
    Check(Locked([&](Client& c) { return c.CreateTierPools(o); }));
  }

  std::optional<Pool> tier_pool(uint8_t tier) const {
    Client& c = Get();
    if (tier >= kMaxTiers || !c.tier_pool_base(tier)) return std::nullopt;
    Pool p;
    p.id = c.tier_pool(tier);
    p.kind = "tier" + std::to_string(tier);
    p.stride = c.tier_pool_stride();
    p.blocks = static_cast<uint32_t>(c.tier_pool_bytes(tier) / p.stride);
    p.block_bytes = c.block_bytes();
    p.map = std::make_shared<Mapping>();
    p.map->base = c.tier_pool_base(tier);
    p.map->bytes = c.tier_pool_bytes(tier);
    p.map->owner = box_;  // the client unmaps it
    return p;
  }

  bool IsTierPool(uint32_t id) const {
    const Client& c = Get();
    if (id == UINT32_MAX) return false;
    for (uint8_t t = 0; t < kMaxTiers; ++t) {
      if (id == c.tier_pool(t)) return true;
    }
    return false;
  }

  AdmitResults admit(py::handle pool, py::handle keys, py::handle blocks) {
    const uint32_t pool_id =
        py::isinstance<Pool>(pool) ? pool.cast<const Pool&>().id : pool.cast<uint32_t>();
    const std::vector<BlockKey> k = ToKeys(keys);
    std::vector<uint32_t> b;
    if (blocks.is_none()) {
      if (!IsTierPool(pool_id)) {
        throw py::value_error("admit into a page-mode pool needs the block index of every key");
      }
      b.assign(k.size(), 0);
    } else {
      b = ToU32(blocks, "block indexes");
      if (b.size() == 1 && k.size() != 1) b.assign(k.size(), b[0]);
    }
    if (b.size() != k.size()) throw py::value_error("as many block indexes as keys");
    std::vector<wire::AdmitEntry> entries(k.size());
    for (size_t i = 0; i < k.size(); ++i) entries[i] = {k[i], b[i]};
    std::vector<wire::AdmitResult> res;
    const bool tier_pool = IsTierPool(pool_id);
    Check(Locked([&](Client& c) {
      Status st = c.Admit(pool_id, entries, &res);
      if (st.ok() && tier_pool) {
        for (const auto& r : res) {
          if (c.WriteAddress(r.slot)) box_->admitted_writes.insert(r.slot);
        }
      }
      return st;
    }));
    AdmitResults out{py::array_t<uint32_t>(static_cast<py::ssize_t>(res.size())),
                     py::array_t<uint8_t>(static_cast<py::ssize_t>(res.size())),
                     py::array_t<bool>(static_cast<py::ssize_t>(res.size()))};
    for (size_t i = 0; i < res.size(); ++i) {
      out.slots.mutable_at(i) = res[i].slot;
      out.tiers.mutable_at(i) = static_cast<uint8_t>(res[i].tier);
      out.restored.mutable_at(i) = res[i].restored != 0;
    }
    return out;
  }

  wire::ReleaseOk release(py::handle keys) {
    const std::vector<BlockKey> k = ToKeys(keys);
    wire::ReleaseOk r;
    Check(Locked([&](Client& c) { return c.Release(k, &r); }));
    return r;
  }

  wire::HintOk hint(uint32_t group, py::handle kind, py::handle keys) {
    HintKind h;
    if (py::isinstance<py::str>(kind)) {
      const std::string s = kind.cast<std::string>();
      if (s == "idle") {
        h = HintKind::kIdle;
      } else if (s == "soon") {
        h = HintKind::kSoon;
      } else if (s == "done") {
        h = HintKind::kDone;
      } else {
        throw py::value_error("a hint is 'idle', 'soon' or 'done', not '" + s + "'");
      }
    } else {
      // Any number goes to the daemon as it is: the codec refuses what is no kind.
      h = static_cast<HintKind>(kind.cast<uint8_t>());
    }
    const std::vector<BlockKey> k = ToKeys(keys);
    wire::HintOk r;
    Check(Locked([&](Client& c) { return c.Hint(group, h, k, &r); }));
    return r;
  }

  // Shared-memory fast path, vectorised: masses is one value or one per slot.
  // Returns how many were taken (the others were out of range or bad masses).
  uint64_t observe(py::handle slots, py::handle masses) {
    const std::vector<uint32_t> s = ToU32(slots, "slots");
    auto m = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(masses);
    if (!m) throw py::type_error("masses must be numbers");
    const float* mp = m.data();
    const size_t n = static_cast<size_t>(m.size());
    if (n != 1 && n != s.size()) throw py::value_error("one mass, or one per slot");
    return Locked([&](Client& c) {
      uint64_t ok = 0;
      for (size_t i = 0; i < s.size(); ++i) ok += c.Observe(s[i], mp[n == 1 ? 0 : i]);
      return ok;
    });
  }

  wire::ReportOk report(py::handle slots, py::handle masses) {
    const std::vector<uint32_t> s = ToU32(slots, "slots");
    auto m = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(masses);
    if (!m) throw py::type_error("masses must be numbers");
    const size_t n = static_cast<size_t>(m.size());
    if (n != 1 && n != s.size()) throw py::value_error("one mass, or one per slot");
    std::vector<wire::Observation> obs(s.size());
    for (size_t i = 0; i < s.size(); ++i) obs[i] = {s[i], m.data()[n == 1 ? 0 : i]};
    wire::ReportOk r;
    Check(Locked([&](Client& c) { return c.Report(obs, &r); }));
    return r;
  }

  py::array_t<uint8_t> tiers_of(py::handle slots) const {
    const std::vector<uint32_t> s = ToU32(slots, "slots");
    std::vector<uint8_t> t(s.size());
    Locked([&](Client& c) {
      for (size_t i = 0; i < s.size(); ++i) t[i] = static_cast<uint8_t>(c.TierOf(s[i]));
      return 0;
    });
    return ToArray(t);
  }

  int tier_of(uint32_t slot) const {
    return Locked([&](Client& c) { return static_cast<int>(c.TierOf(slot)); });
  }

  py::object slot_state(uint32_t slot) const {
    std::optional<BlockState> s;
    Locked([&](Client& c) {
      if (const BlockState* p = c.SlotState(slot)) s = *p;
      return 0;
    });
    if (!s) return py::none();
    py::dict d;
    d["key"] = s->key;
    d["score"] = s->score;
    d["touch_time"] = s->touch_time;
    d["touch_count"] = s->touch_count;
    d["tier"] = static_cast<int>(s->tier);
    d["flags"] = static_cast<int>(s->flags);
    d["client_touches"] = s->client_touches;
    d["client_mass"] = s->client_mass_q16 / 65536.0;
    d["generation"] = s->generation;
    return d;
  }

  py::object slot_of(py::handle key) const {
    const BlockKey k = ToKey(key);
    uint32_t slot = 0;
    const bool held = Locked([&](Client& c) { return c.SlotOf(k, &slot); });
    if (!held) return py::none();
    return py::int_(slot);
  }

  py::array_t<uint32_t> slots_of(py::handle keys) const {
    const std::vector<BlockKey> k = ToKeys(keys);
    std::vector<uint32_t> s(k.size());
    Locked([&](Client& c) {
      for (size_t i = 0; i < k.size(); ++i) s[i] = c.SlotOf(k[i]);
      return 0;
    });
    return ToArray(s);
  }

  py::object location_of(uint32_t slot) const {
    const Location l = Locked([&](Client& c) { return c.LocationOf(slot); });
    if (!l.has_place()) return py::none();
    return py::make_tuple(l.tier, l.index, l.version);
  }

  py::array_t<uint8_t> query_tiers(py::handle keys) const {
    const std::vector<BlockKey> k = ToKeys(keys);
    std::vector<Tier> t;
    Check(Locked([&](Client& c) { return c.QueryTiers(k, &t); }));
    std::vector<uint8_t> out(t.size());
    for (size_t i = 0; i < t.size(); ++i) out[i] = static_cast<uint8_t>(t[i]);
    return ToArray(out);
  }

  py::object stats(const std::string& what) const {
    std::string json;
    Check(Locked([&](Client& c) { return c.Stats(what, &json); }));
    return py::module_::import("json").attr("loads")(json);
  }

  uint64_t reconnect() {
    uint64_t restored = 0;
    Check(Locked([&](Client& c) {
      // The readers stay: their rows are the same in the new segment, and in
      // copy mode the leases they hold are carried over into it.
      return c.Reconnect(&restored);
    }));
    return restored;
  }

  // Waits until the daemon has ticked `n` more times; false after timeout_s.
  bool wait_ticks(uint64_t n, double timeout_s) const {
    Client& c = Get();
    std::shared_ptr<ClientBox> box = box_;
    py::gil_scoped_release nogil;
    const uint64_t start = c.daemon_ticks();
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6));
    while (c.daemon_ticks() < start + n) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  uint32_t SlotArg(py::handle h) const {
    if (py::isinstance<py::int_>(h) && !py::isinstance<BlockKey>(h)) {
      // An int below 2**32 is a slot; a key given as an int must be a Key.
      const auto v = h.cast<py::int_>();
      if (v >= py::int_(0) && v <= py::int_(UINT32_MAX)) {
        return v.cast<uint32_t>();
      }
    }
    const BlockKey k = ToKey(h);
    uint32_t slot = 0;
    if (!Locked([&](Client& c) { return c.SlotOf(k, &slot); })) {
      Fail(wire::ErrorCode::kNoLease, "key " + k.ToString() + " is not held by this client");
    }
    return slot;
  }

  PyReadLease acquire(py::handle which) {
    const uint32_t slot = SlotArg(which);
    PyReadLease l;
    l.box = box_;
    l.block_bytes = Get().block_bytes();
    Check(Locked([&](Client& c) {
      // Readers are used under mu only, so a few serve every Python thread.
      for (auto& r : box_->readers) {
        if (r->held() < kLeasesPerRow) {
          l.reader = r.get();
          break;
        }
      }
      if (!l.reader) {
        Status st;
        auto r = c.NewReader(&st);
        if (!r) return st;
        l.reader = r.get();
        box_->readers.push_back(std::move(r));
      }
      return l.reader->Acquire(slot, &l.lease);
    }));
    l.held = true;
    return l;
  }

  PyWriteLease write(py::handle which) {
    const uint32_t slot = SlotArg(which);
    PyWriteLease l;
    l.box = box_;
    l.slot = slot;
    l.block_bytes = Get().block_bytes();
    Check(Locked([&](Client& c) {
      // Right after admission into a tier pool the client holds the lease
      // already: the first write() takes it over, later ones begin their own.
      if (box_->admitted_writes.erase(slot) != 0) {
        if (uint8_t* p = c.WriteAddress(slot)) {
          l.address = p;
          return Status::Ok();
        }
      }
      return c.BeginWrite(slot, &l.address);
    }));
    l.held = true;
    return l;
  }

  void end_write(uint32_t slot) {
    Check(Locked([&](Client& c) {
      box_->admitted_writes.erase(slot);
      return c.EndWrite(slot);
    }));
  }

  std::string socket_path_;
  Model model_;
  std::shared_ptr<ClientBox> box_;
};

// ---- aggregation ----

Reduce ToReduce(const std::string& how) {
  if (how == "sum") return Reduce::kSum;
  if (how == "mean") return Reduce::kMean;
  if (how == "max") return Reduce::kMax;
  throw py::value_error("how is 'sum', 'mean' or 'max', not '" + how + "'");
}

// per_stream: (..., layers * kv_heads) float32 -> (...) masses.
py::object AggregateStreamsPy(const Model& model, py::handle per_stream, const std::string& how) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(per_stream);
  if (!a) throw py::type_error("per_stream must be numbers");
  const ModelGeometry g = model.geometry();
  const size_t streams = g.streams();
  const Reduce r = ToReduce(how);
  if (a.ndim() == 0) throw py::value_error("per_stream needs a last axis of layers x kv_heads");
  const size_t last = static_cast<size_t>(a.shape(a.ndim() - 1));
  if (last != streams) {
    throw py::value_error("the last axis has " + std::to_string(last) + " values, not the " +
                          std::to_string(streams) + " streams (layers x kv_heads)");
  }
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim() - 1);
  py::array_t<float> out(shape);
  const size_t rows = streams ? static_cast<size_t>(a.size()) / streams : 0;
  const float* in = a.data();
  float* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < rows; ++i) o[i] = AggregateStreams(g, {in + i * streams, streams}, r);
  }
  if (a.ndim() == 1) return py::float_(o[0]);
  return out;
}

// per_query_head: (..., layers * query_heads) -> (..., layers * kv_heads).
py::array_t<float> QueryHeadsToStreamsPy(const Model& model, py::handle per_qh,
                                         const std::string& how) {
  auto a = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(per_qh);
  if (!a) throw py::type_error("per_query_head must be numbers");
  const ModelGeometry g = model.geometry();
  const size_t in_n = uint64_t{g.layers} * g.query_heads, out_n = g.streams();
  if (a.ndim() == 0 || static_cast<size_t>(a.shape(a.ndim() - 1)) != in_n || in_n == 0) {
    throw py::value_error("the last axis must hold layers x query_heads = " + std::to_string(in_n) +
                          " values");
  }
  std::vector<py::ssize_t> shape(a.shape(), a.shape() + a.ndim());
  shape.back() = static_cast<py::ssize_t>(out_n);
  py::array_t<float> out(shape);
  const size_t rows = static_cast<size_t>(a.size()) / in_n;
  const Reduce r = ToReduce(how);
  bool ok = true;
  {
    py::gil_scoped_release nogil;
    for (size_t i = 0; i < rows && ok; ++i) {
      ok = QueryHeadsToStreams(g, {a.data() + i * in_n, in_n},
                               {out.mutable_data() + i * out_n, out_n}, r);
    }
  }
  if (!ok) throw py::value_error("query heads do not divide into the model's KV heads");
  return out;
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
      RaiseStatus(e.status);
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

  py::class_<Model>(m, "Model", "A model's KV geometry (what a block holds).")
      .def(py::init(&MakeModel), py::arg("layers"), py::arg("query_heads"), py::arg("kv_heads"),
           py::arg("head_dim"), py::arg("dtype_bytes") = 2, py::arg("block_tokens") = 16,
           py::arg("name") = "custom")
      .def_static(
          "preset",
          [](const std::string& name) {
            auto g = FindModelPreset(name);
            if (!g) throw py::value_error("no model preset called " + name);
            return FromPreset(*g);
          },
          py::arg("name"), "A built-in preset: llama3-70b, mistral-7b, ...")
      .def_static("presets",
                  [] {
                    std::vector<std::string> names;
                    for (const auto& g : kModelPresets) names.emplace_back(g.name);
                    return names;
                  })
      .def_readwrite("name", &Model::name)
      .def_property_readonly("layers", [](const Model& x) { return x.g.layers; })
      .def_property_readonly("query_heads", [](const Model& x) { return x.g.query_heads; })
      .def_property_readonly("kv_heads", [](const Model& x) { return x.g.kv_heads; })
      .def_property_readonly("head_dim", [](const Model& x) { return x.g.head_dim; })
      .def_property_readonly("dtype_bytes", [](const Model& x) { return x.g.dtype_bytes; })
      .def_property_readonly("block_tokens", [](const Model& x) { return x.g.block_tokens; })
      .def_property_readonly("gqa_group", [](const Model& x) { return x.g.gqa_group(); })
      .def_property_readonly("streams", [](const Model& x) { return x.g.streams(); })
      .def_property_readonly("block_bytes", [](const Model& x) { return x.g.block_bytes(); })
      .def_property_readonly("bytes_per_token",
                             [](const Model& x) { return x.g.bytes_per_token(); })
      .def(
          "validate", [](const Model& x) { Check(x.geometry().Validate()); },
          "Raises GeometryError when the geometry is unusable.")
      .def("__repr__", [](const Model& x) {
        return "cxltier.Model(layers=" + std::to_string(x.g.layers) +
               ", query_heads=" + std::to_string(x.g.query_heads) +
               ", kv_heads=" + std::to_string(x.g.kv_heads) +
               ", head_dim=" + std::to_string(x.g.head_dim) +
               ", dtype_bytes=" + std::to_string(x.g.dtype_bytes) +
               ", block_tokens=" + std::to_string(x.g.block_tokens) + ", name='" + x.name + "')";
      });

  py::class_<Pool>(m, "Pool", "A pool of blocks: its id, its memory as numpy views.")
      .def_readonly("id", &Pool::id)
      .def_readonly("kind", &Pool::kind)
      .def_readonly("blocks", &Pool::blocks)
      .def_readonly("stride", &Pool::stride)
      .def_readonly("block_bytes", &Pool::block_bytes)
      .def_property_readonly("fd", &Pool::fd)
      .def_property_readonly("array", &Pool::array,
                             "uint8 array (blocks, stride) over the pool's memory, no copy")
      .def("block", &Pool::block, py::arg("index"),
           "uint8 array of block_bytes over one block's memory, no copy")
      .def("__repr__", [](const Pool& p) {
        return "cxltier.Pool(id=" + std::to_string(p.id) + ", kind='" + p.kind +
               "', blocks=" + std::to_string(p.blocks) + ", stride=" + std::to_string(p.stride) +
               ")";
      });

  py::class_<AdmitResults>(m, "AdmitResult", "What admit answered, one entry per key.")
      .def_readonly("slots", &AdmitResults::slots)
      .def_readonly("tiers", &AdmitResults::tiers)
      .def_readonly("restored", &AdmitResults::restored)
      .def("__len__", [](const AdmitResults& r) { return r.slots.size(); });

  py::class_<wire::ReleaseOk>(m, "ReleaseResult")
      .def_readonly("released", &wire::ReleaseOk::released)
      .def_readonly("unknown", &wire::ReleaseOk::unknown)
      .def("__repr__", [](const wire::ReleaseOk& r) {
        return "ReleaseResult(released=" + std::to_string(r.released) +
               ", unknown=" + std::to_string(r.unknown) + ")";
      });
  py::class_<wire::HintOk>(m, "HintResult")
      .def_readonly("grouped", &wire::HintOk::grouped)
      .def_readonly("unknown", &wire::HintOk::unknown)
      .def_property_readonly("applied", [](const wire::HintOk& r) { return r.applied != 0; })
      .def("__repr__", [](const wire::HintOk& r) {
        return "HintResult(grouped=" + std::to_string(r.grouped) +
               ", unknown=" + std::to_string(r.unknown) +
               ", applied=" + (r.applied ? "True" : "False") + ")";
      });
  py::class_<wire::ReportOk>(m, "ReportResult")
      .def_readonly("accepted", &wire::ReportOk::accepted)
      .def_readonly("rejected", &wire::ReportOk::rejected)
      .def("__repr__", [](const wire::ReportOk& r) {
        return "ReportResult(accepted=" + std::to_string(r.accepted) +
               ", rejected=" + std::to_string(r.rejected) + ")";
      });

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

  py::class_<PyClient>(m, "_Client")
      .def(py::init<const std::string&, const Model&, uint32_t, const std::string&>(),
           py::arg("socket_path"), py::arg("model"), py::arg("max_blocks"), py::arg("name"))
      .def("close", &PyClient::close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("socket_path", [](const PyClient& c) { return c.socket_path_; })
      .def_property_readonly("model", [](const PyClient& c) { return c.model_; })
      .def_property_readonly("client_id", [](const PyClient& c) { return c.Get().client_id(); })
      .def_property_readonly("slots", [](const PyClient& c) { return c.Get().slots(); })
      .def_property_readonly("block_bytes", [](const PyClient& c) { return c.Get().block_bytes(); })
      .def_property_readonly("tick_ms", [](const PyClient& c) { return c.Get().tick_ms(); })
      .def_property_readonly(
          "tiers", [](const PyClient& c) { return c.Get().tiers(); },
          "The daemon's tiers (copy mode: a tier pool each).")
      .def_property_readonly("daemon_ticks",
                             [](const PyClient& c) { return c.Get().daemon_ticks(); })
      .def("create_memfd_pool", &PyClient::create_memfd_pool, py::arg("blocks"),
           py::arg("stride") = 0, py::arg("name") = "cxltier-pool",
           "A sealed memfd of blocks x stride bytes (stride 0: the block size rounded up to a "
           "page), mapped here (Pool.array) and registered with the daemon, which moves its pages.")
      .def("register_memfd_pool", &PyClient::register_memfd_pool, py::arg("fd"), py::arg("length"),
           py::arg("stride"), py::arg("blocks"),
           "Registers the caller's memfd (made with MFD_ALLOW_SEALING; F_SEAL_SHRINK is added to "
           "it) and maps it.")
      .def("create_range_pool", &PyClient::create_range_pool, py::arg("blocks"),
           py::arg("stride") = 0,
           "Anonymous memory of this process registered as an address-range pool (the daemon moves "
           "its pages).")
      .def("create_tier_pools", &PyClient::create_tier_pools, py::arg("blocks"),
           py::arg("stride") = 0, py::arg("devdax_path") = "", py::arg("devdax_offset") = 0,
           "Copy mode: asks the daemon for a pool per tier and maps each (tier_pool(0), "
           "tier_pool(1), ... up to tiers - 1).")
      .def("tier_pool", &PyClient::tier_pool, py::arg("tier"),
           "Copy mode: tier t's pool (numpy views over it), or None before create_tier_pools.")
      .def("admit", &PyClient::admit, py::arg("pool"), py::arg("keys"),
           py::arg("blocks") = py::none(),
           "Admits keys (Key, int, (hi, lo), 16 bytes, a list of them or a (n, 2) uint64 array) at "
           "pool block indexes (one each, or one for all; none for a tier pool: the daemon places "
           "them and this client holds each new block's write lease). Returns AdmitResult: slots, "
           "tiers, restored.")
      .def("release", &PyClient::release, py::arg("keys"),
           "Releases keys: their states become ghosts, kept for re-admission. Returns released, "
           "unknown.")
      .def("hint", &PyClient::hint, py::arg("group"), py::arg("kind"), py::arg("keys") = py::none(),
           "A scheduler hint about group (nonzero): 'idle', 'soon', 'done' (or HintKind). keys "
           "join the group first. Returns grouped, unknown, applied.")
      .def("observe", &PyClient::observe, py::arg("slots"), py::arg("masses"),
           "Adds one observation per slot (masses: one value or one per slot) through the "
           "shared-memory segment: no syscall. Returns how many were taken (bad slots and masses "
           "are not).")
      .def("report", &PyClient::report, py::arg("slots"), py::arg("masses"),
           "The same observations over the socket. Returns accepted, rejected.")
      .def("tier_of", &PyClient::tier_of, py::arg("slot"),
           "The tier the daemon last published for a slot (255: none).")
      .def("tiers_of", &PyClient::tiers_of, py::arg("slots"),
           "tier_of for an array of slots: uint8 array.")
      .def("slot_state", &PyClient::slot_state, py::arg("slot"),
           "The slot's 64-byte state as the daemon last wrote it, as a dict.")
      .def("slot_of", &PyClient::slot_of, py::arg("key"),
           "The slot of a held key, or None (slots change across reconnect).")
      .def("slots_of", &PyClient::slots_of, py::arg("keys"),
           "Slots of keys as a uint32 array (2**32 - 1: not held).")
      .def("location_of", &PyClient::location_of, py::arg("slot"),
           "Copy mode: (tier, index, version) of the slot's place as last published, or None.")
      .def("query_tiers", &PyClient::query_tiers, py::arg("keys"),
           "The daemon's answer on where keys are: uint8 array (255 for keys not held).")
      .def("stats", &PyClient::stats, py::arg("what") = "status",
           "The daemon's stats as parsed JSON: status, tiers, clients or blocks.")
      .def("reconnect", &PyClient::reconnect,
           "After the daemon restarted (or dropped this client): connect again, register the same "
           "pools and admit every held key. Copy mode: the tier pools go to the new daemon as they "
           "are, every block is admitted where it is and held leases stay valid (docs/python.md). "
           "Returns how many came back with their state.")
      .def("wait_ticks", &PyClient::wait_ticks, py::arg("n") = 1, py::arg("timeout") = 60.0,
           "Waits until the daemon has ticked n more times; False after timeout seconds.")
      .def("acquire", &PyClient::acquire, py::arg("block"),
           "Copy mode: a read lease on a slot (or a held key's). `with c.acquire(s) as view:` "
           "gives a read-only view whose bytes stay put until the block ends.")
      .def("write", &PyClient::write, py::arg("block"),
           "Copy mode: the write lease of a slot (the first call after admission takes over the "
           "admission's). `with c.write(s) as view:`.")
      .def("end_write", &PyClient::end_write, py::arg("slot"),
           "Ends a write lease held without a WriteLease object.");

  m.def(
      "daemon_stats",
      [](const std::string& socket_path, const std::string& what) {
        std::string json;
        Status st;
        {
          py::gil_scoped_release nogil;
          st = Client::DaemonStats(socket_path, what, &json);
        }
        Check(st);
        return py::module_::import("json").attr("loads")(json);
      },
      py::arg("socket_path"), py::arg("what") = "status");

  m.def("aggregate_streams", &AggregateStreamsPy, py::arg("model"), py::arg("per_stream"),
        py::arg("how") = "sum");
  m.def("query_heads_to_streams", &QueryHeadsToStreamsPy, py::arg("model"),
        py::arg("per_query_head"), py::arg("how") = "sum");
  m.def(
      "kv_head_of_query_head",
      [](const Model& model, uint32_t q) { return KvHeadOfQueryHead(model.geometry(), q); },
      py::arg("model"), py::arg("query_head"));
}
