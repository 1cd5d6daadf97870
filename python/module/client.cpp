// The client: the _Client class (cxltier.Client subclasses it) over a connection
// to the daemon, the result classes of its calls, and daemon_stats.
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bind.h"
#include "leases.h"
#include "pools.h"

namespace cxltier::python {
namespace {

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
    return Register(MapNewMemfd(stride * blocks, name), "memfd", stride, blocks);
  }

  Pool register_memfd_pool(int fd, uint64_t length, uint64_t stride, uint32_t blocks) {
    auto map = MapCallersMemfd(fd, length);
    return Register(map, "memfd", page_stride(stride), blocks);
  }

  Pool create_range_pool(uint32_t blocks, uint64_t stride) {
    stride = page_stride(stride);
    return Register(MapRange(stride * blocks), "range", stride, blocks);
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
      // Keys held already keep whatever write lease they have: only a new
      // admission's is the admission's (a WriteLease may hold a held key's).
      std::vector<bool> fresh(entries.size(), true);
      if (tier_pool) {
        uint32_t ignored = 0;
        for (size_t i = 0; i < entries.size(); ++i) fresh[i] = !c.SlotOf(entries[i].key, &ignored);
      }
      Status st = c.Admit(pool_id, entries, &res);
      // Also after a failure part-way: the parts before it are admitted,
      // each with its admission's write lease.
      if (tier_pool) {
        for (size_t i = 0; i < entries.size(); ++i) {
          uint32_t slot = 0;
          if (fresh[i] && c.SlotOf(entries[i].key, &slot) && c.WriteAddress(slot)) {
            box_->admitted_writes.insert(entries[i].key);
          }
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
    const Status st = Locked([&](Client& c) { return c.Report(obs, &r); });
    if (!st.ok()) {
      // The parts before the failure were applied: the error says how many,
      // so that the caller does not send them again.
      throw StatusError(st.Context("after " + std::to_string(r.accepted + r.rejected) +
                                   " observations were taken (" + std::to_string(r.accepted) +
                                   " accepted, " + std::to_string(r.rejected) + " rejected): "),
                        {{"accepted", r.accepted}, {"rejected", r.rejected}});
    }
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

  // A slot or a held key. Any integer (an int, numpy's) is a slot; a key is
  // a Key, bytes or (hi, lo). An int used to be a key from 2**32 up, so a
  // key given as a small int was read as a slot: another block's lease.
  uint32_t SlotArg(py::handle h) const {
    if (!py::isinstance<BlockKey>(h) && PyIndex_Check(h.ptr())) {
      const auto v = py::reinterpret_steal<py::int_>(PyNumber_Index(h.ptr()));
      if (!v) throw py::error_already_set();
      if (v < py::int_(0) || v > py::int_(UINT32_MAX)) {
        throw py::value_error("slot " + std::string(py::str(static_cast<const py::handle&>(v))) +
                              " is not below 2**32: an integer here is a slot; give a key as "
                              "cxltier.Key(...), bytes or (hi, lo)");
      }
      return v.cast<uint32_t>();
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
      const BlockState* st = c.SlotState(slot);
      uint32_t held_at = 0;
      if (!st || !c.SlotOf(st->key, &held_at) || held_at != slot) {
        return Status::Fail(wire::ErrorCode::kNoLease,
                            "slot " + std::to_string(slot) + " holds no block of this client");
      }
      l.key = st->key;
      // Right after admission into a tier pool the client holds the lease
      // already: the first write() takes it over, later ones begin their own.
      if (box_->admitted_writes.erase(l.key) != 0) {
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
      if (const BlockState* st = c.SlotState(slot)) box_->admitted_writes.erase(st->key);
      return c.EndWrite(slot);
    }));
  }

  std::string socket_path_;
  Model model_;
  std::shared_ptr<ClientBox> box_;
};

}  // namespace

void BindResults(py::module_& m) {
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
}

void BindClient(py::module_& m) {
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
           "The same observations over the socket, in parts. Returns accepted, rejected. On an "
           "error "
           "the parts before it were applied: the exception's accepted and rejected count them "
           "(do not send those again).")
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
           "Copy mode: a read lease on a slot (any integer, numpy's too) or a held key's (a Key, "
           "bytes or (hi, lo); never an int). `with c.acquire(s) as view:` gives a read-only view "
           "whose bytes stay put until the block ends.")
      .def("write", &PyClient::write, py::arg("block"),
           "Copy mode: the write lease of a slot or a held key's, as acquire takes them (the first "
           "call after admission takes over the admission's). `with c.write(s) as view:`.")
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
}

}  // namespace cxltier::python
