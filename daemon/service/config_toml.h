// What config.cpp and quota_config.cpp share to read cxltierd's TOML: a
// reader of one table that refuses unknown keys, and the [quotas] reader.
// Included by those two files only (toml++ is a heavy header).
#pragma once

#include <toml++/toml.h>

#include <optional>
#include <set>
#include <string>

#include "cxltier/model.h"
#include "service/config.h"

namespace cxltier::service::config_toml {

// A configuration that cannot be used: kBadPayload, as a reload request
// with it is refused.
inline Status Invalid(std::string message) {
  return Status::Fail(wire::ErrorCode::kBadPayload, std::move(message));
}

// Integers only: toml++'s value<int64_t>() converts floats, and 1e100 is
// undefined behaviour there (found by fuzz_config).
inline std::optional<int64_t> IntOf(const toml::node& n) {
  if (const auto* i = n.as_integer()) return i->get();
  return std::nullopt;
}

// Reads one table's keys into fields; anything else in the table is an error.
class TableReader {
 public:
  TableReader(const toml::table& root, const char* name, Status* error)
      : label_("[" + std::string(name) + "]"), error_(error) {
    if (const toml::node* n = root.get(name)) {
      table_ = n->as_table();
      if (!table_) Fail(label_ + " must be a table");
    }
  }
  // One table of an array of tables, named `label` in errors ("[[quotas.user]] #2").
  TableReader(const toml::table* table, std::string label, Status* error)
      : label_(std::move(label)), error_(error), table_(table) {}

  void Str(const char* key, std::string* out) {
    if (const toml::node* n = Get(key)) {
      if (auto v = n->value<std::string>()) {
        *out = *v;
      } else {
        Fail(key, "a string");
      }
    }
  }
  void Bool(const char* key, bool* out) {
    if (const toml::node* n = Get(key)) {
      if (auto v = n->value<bool>()) {
        *out = *v;
      } else {
        Fail(key, "true or false");
      }
    }
  }
  template <typename T>
  void Int(const char* key, T* out) {
    if (const toml::node* n = Get(key)) {
      auto v = IntOf(*n);
      if (!v || *v < 0 || static_cast<uint64_t>(*v) > std::numeric_limits<T>::max()) {
        return Fail(key, "a non-negative integer in range");
      }
      *out = static_cast<T>(*v);
    }
  }
  // A size: an integer (bytes) or a string like "32GiB".
  void Size(const char* key, uint64_t* out) {
    if (const toml::node* n = Get(key)) {
      if (auto i = IntOf(*n); i && *i >= 0) {
        *out = static_cast<uint64_t>(*i);
      } else if (auto s = n->value<std::string>(); s && ParseSize(*s)) {
        *out = *ParseSize(*s);
      } else {
        Fail(key, "a byte count or a size like \"32GiB\"");
      }
    }
  }
  void Nodes(const char* key, std::vector<int>* out) {
    if (const toml::node* n = Get(key)) {
      const toml::array* a = n->as_array();
      if (!a) return Fail(key, "an array of node numbers");
      out->clear();
      for (const toml::node& e : *a) {
        auto v = IntOf(e);
        if (!v || *v < 0 || *v > 1023) return Fail(key, "an array of node numbers (0-1023)");
        out->push_back(static_cast<int>(*v));
      }
    }
  }
  // An array of arrays of node numbers, one per tier.
  void TierNodes(const char* key, std::vector<std::vector<int>>* out) {
    if (const toml::node* n = Get(key)) {
      const toml::array* a = n->as_array();
      if (!a) return Fail(key, "an array of tiers, each an array of node numbers");
      out->clear();
      for (const toml::node& tier : *a) {
        const toml::array* nodes = tier.as_array();
        if (!nodes) return Fail(key, "an array of tiers, each an array of node numbers");
        out->emplace_back();
        for (const toml::node& e : *nodes) {
          auto v = IntOf(e);
          if (!v || *v < 0 || *v > 1023) return Fail(key, "arrays of node numbers (0-1023)");
          out->back().push_back(static_cast<int>(*v));
        }
      }
    }
  }
  // An array of sizes; returns whether the key was there.
  bool Sizes(const char* key, std::vector<uint64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return false;
    const toml::array* a = n->as_array();
    if (!a) {
      Fail(key, "an array of byte counts or sizes like \"32GiB\"");
      return true;
    }
    out->clear();
    for (const toml::node& e : *a) {
      if (auto i = IntOf(e); i && *i >= 0) {
        out->push_back(static_cast<uint64_t>(*i));
      } else if (auto s = e.value<std::string>(); s && ParseSize(*s)) {
        out->push_back(*ParseSize(*s));
      } else {
        Fail(key, "an array of byte counts or sizes like \"32GiB\"");
        return true;
      }
    }
    return true;
  }
  // A quota cap: a size, or "none" (kNoCapBytes).
  void Cap(const char* key, uint64_t* out) {
    if (const toml::node* n = Get(key)) {
      if (auto c = CapOf(*n)) {
        *out = *c;
      } else {
        Fail(key, "a byte count, a size like \"8GiB\" or \"none\"");
      }
    }
  }
  // An array of caps; returns whether the key was there.
  bool Caps(const char* key, std::vector<uint64_t>* out) {
    const toml::node* n = Get(key);
    if (!n) return false;
    const toml::array* a = n->as_array();
    out->clear();
    for (size_t i = 0; a && i < a->size(); ++i) {
      auto c = CapOf(*a->get(i));
      if (!c) break;
      out->push_back(*c);
    }
    if (!a || out->size() != a->size()) {
      Fail(key, "an array of caps, tier 0 first: byte counts, sizes like \"8GiB\" or \"none\"");
    }
    return true;
  }
  bool Has(const char* key) const { return table_ && table_->get(key); }
  // Call after reading every key: unknown keys are errors.
  void Finish() {
    if (!table_) return;
    for (const auto& [k, v] : *table_) {
      if (!seen_.count(std::string(k.str()))) {
        Fail("unknown key '" + std::string(k.str()) + "' in " + label_);
      }
    }
  }
  void Fail(const std::string& msg) {
    if (error_->ok()) *error_ = Invalid(msg);
  }
  const std::string& label() const { return label_; }

 private:
  static std::optional<uint64_t> CapOf(const toml::node& n) {
    if (auto i = IntOf(n); i && *i >= 0) return static_cast<uint64_t>(*i);
    if (auto s = n.value<std::string>()) {
      if (*s == "none") return kNoCapBytes;
      return ParseSize(*s);
    }
    return std::nullopt;
  }
  const toml::node* Get(const char* key) {
    seen_.insert(key);
    return table_ ? table_->get(key) : nullptr;
  }
  void Fail(const char* key, const char* want) { Fail(label_ + " " + key + " must be " + want); }

  std::string label_;
  Status* error_;  // the first problem of every reader sharing it
  const toml::table* table_ = nullptr;
  std::set<std::string> seen_;
};

// [quotas]: [[quotas.user]] and [[quotas.client]] tables (quota_config.cpp).
Status ReadQuotas(const toml::table& root, DaemonConfig* c);

}  // namespace cxltier::service::config_toml
