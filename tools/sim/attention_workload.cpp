#include "attention_workload.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <unordered_map>
#include <vector>

namespace cxltier::sim {
namespace {

// A Fenwick tree of non-negative weights with weighted sampling in O(log n).
class WeightTree {
 public:
  explicit WeightTree(size_t n) : tree_(n + 1, 0.0), w_(n, 0.0) {}
  size_t size() const { return w_.size(); }
  double weight(size_t i) const { return w_[i]; }
  double total() const { return total_; }
  void Set(size_t i, double w) {
    const double d = w - w_[i];
    w_[i] = w;
    total_ += d;
    for (size_t j = i + 1; j < tree_.size(); j += j & (~j + 1)) tree_[j] += d;
  }
  // The index whose cumulative range holds `u` in [0, total).
  size_t Find(double u) const {
    size_t pos = 0;
    size_t step = 1;
    while (step * 2 < tree_.size()) step *= 2;
    for (; step > 0; step /= 2) {
      if (pos + step < tree_.size() && tree_[pos + step] <= u) {
        pos += step;
        u -= tree_[pos];
      }
    }
    return std::min(pos, w_.size() - 1);
  }

 private:
  std::vector<double> tree_;
  std::vector<double> w_;
  double total_ = 0;
};

struct Session {
  uint64_t uid = 0;
  uint32_t tokens = 0;
  uint32_t turns_left = 0;
  uint32_t turn_left = 0;
  uint32_t turns_done = 0;
  uint64_t ready_at = 0;
  uint64_t paused_at = 0;  // the step its last turn ended
  bool active = false;
  std::vector<double> importance;  // per block, drawn once and redrawn by drift
  std::unique_ptr<WeightTree> tree;
};

class Generator {
 public:
  explicit Generator(const AttentionParams& p)
      : p_(p), rng_(p.seed), max_blocks_(p.context_max / p.block_tokens + 2) {
    trace_.name = "attention";
    trace_.block_tokens = p.block_tokens;
  }

  Trace Run() {
    sessions_.resize(p_.sessions);
    for (Session& s : sessions_) StartSession(s, 0);
    std::vector<size_t> batch;
    for (uint32_t step = 0; step < p_.steps; ++step) {
      // Fill free batch places with the sessions that have waited longest.
      if (batch.size() < p_.batch) {
        std::vector<size_t> ready;
        for (size_t i = 0; i < sessions_.size(); ++i) {
          if (!sessions_[i].active && sessions_[i].ready_at <= step) ready.push_back(i);
        }
        std::stable_sort(ready.begin(), ready.end(), [&](size_t a, size_t b) {
          return sessions_[a].ready_at < sessions_[b].ready_at;
        });
        for (size_t i : ready) {
          if (batch.size() >= p_.batch) break;
          if (p_.hints && sessions_[i].turns_done > 0) {
            // The scheduler knows hint_lead steps ahead that this session runs
            // again (its user's message waits for prefill and a batch place).
            const uint64_t lead = std::min<uint64_t>(p_.hint_lead, step);
            soon_.push_back(
                TraceEvent{static_cast<uint32_t>(std::max(sessions_[i].paused_at + 1, step - lead)),
                           Group(sessions_[i]), 2.0f, EventKind::kHint});
          }
          Resume(sessions_[i]);
          batch.push_back(i);
        }
      }
      for (size_t i : batch) DecodeStep(sessions_[i], step);
      // Sessions whose turn ended leave the batch.
      std::vector<size_t> still;
      for (size_t i : batch) {
        Session& s = sessions_[i];
        if (s.turn_left > 0) {
          still.push_back(i);
          continue;
        }
        s.active = false;
        s.paused_at = step;
        if (s.turns_left == 0 || s.tokens + p_.user_tokens + 1 >= p_.context_max) {
          Hint(s, step, 3.0f);  // done
          ReleaseOwn(s, step);
          StartSession(s, step + Geometric(p_.pause_steps));
        } else {
          Hint(s, step, 1.0f);  // idle
          s.ready_at = step + Geometric(p_.pause_steps);
          if (Chance(p_.release_on_pause)) {
            ReleaseOwn(s, step);
          }
        }
      }
      batch = std::move(still);
    }
    MergeSoonHints();
    return std::move(trace_);
  }

 private:
  uint32_t Blocks(const Session& s) const {
    return (s.tokens + p_.block_tokens - 1) / p_.block_tokens;
  }

  uint32_t Group(const Session& s) const { return static_cast<uint32_t>(s.uid); }

  void Hint(const Session& s, uint32_t step, float kind) {
    if (p_.hints) trace_.events.push_back(TraceEvent{step, Group(s), kind, EventKind::kHint});
  }

  // Each soon hint goes before the events of its step (it was known then).
  void MergeSoonHints() {
    if (soon_.empty()) return;
    std::stable_sort(soon_.begin(), soon_.end(),
                     [](const TraceEvent& a, const TraceEvent& b) { return a.step < b.step; });
    std::vector<TraceEvent> merged;
    merged.reserve(trace_.events.size() + soon_.size());
    size_t j = 0;
    for (const TraceEvent& e : trace_.events) {
      while (j < soon_.size() && soon_[j].step <= e.step) merged.push_back(soon_[j++]);
      merged.push_back(e);
    }
    merged.insert(merged.end(), soon_.begin() + static_cast<ptrdiff_t>(j), soon_.end());
    trace_.events = std::move(merged);
  }

  BlockKey KeyOf(const Session& s, uint32_t block) const {
    return block < p_.shared_prefix_blocks ? BlockKey::FromSequence(0, block)
                                           : BlockKey::FromSequence(s.uid, block);
  }

  uint32_t KeyIndex(const Session& s, uint32_t block) {
    const BlockKey k = KeyOf(s, block);
    auto [it, fresh] = key_index_.try_emplace(k, static_cast<uint32_t>(trace_.keys.size()));
    if (fresh) {
      trace_.keys.push_back(k);
      // The shared system prompt belongs to no session's group.
      if (p_.hints) trace_.groups.push_back(block < p_.shared_prefix_blocks ? 0 : Group(s));
    }
    return it->second;
  }

  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }

  // Geometric with the given mean (at least 1).
  uint32_t Geometric(uint32_t mean) {
    if (mean <= 1) return 1;
    std::geometric_distribution<uint32_t> g(1.0 / mean);
    return 1 + g(rng_);
  }

  double Pareto() {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    return std::pow(1.0 - u, -1.0 / p_.heavy_alpha);
  }

  bool IsSink(uint32_t b) const { return b < p_.sink_blocks; }

  void SetImportance(Session& s, uint32_t b, double w) {
    s.importance[b] = w;
    s.tree->Set(b, IsSink(b) ? 0.0 : w);
  }

  void StartSession(Session& s, uint64_t ready_at) {
    s.uid = next_uid_++;
    s.tokens = std::uniform_int_distribution<uint32_t>(p_.context_min, p_.context_max - 1)(rng_);
    s.turns_left = Geometric(p_.turns);
    s.turn_left = 0;
    s.turns_done = 0;
    s.ready_at = ready_at;
    s.active = false;
    s.importance.assign(max_blocks_, 0.0);
    s.tree = std::make_unique<WeightTree>(max_blocks_);
    for (uint32_t b = 0; b < Blocks(s); ++b) SetImportance(s, b, Pareto());
  }

  void Resume(Session& s) {
    s.active = true;
    if (s.turns_done > 0) {
      // A later turn: the user's message arrives first.
      const uint32_t before = Blocks(s);
      s.tokens = std::min(s.tokens + p_.user_tokens, p_.context_max - 1);
      for (uint32_t b = before; b < Blocks(s); ++b) SetImportance(s, b, Pareto());
    }
    ++s.turns_done;
    s.turn_left = Geometric(p_.turn_tokens);
    if (s.turns_left > 0) --s.turns_left;
  }

  void ReleaseOwn(const Session& s, uint32_t step) {
    for (uint32_t b = p_.shared_prefix_blocks; b < Blocks(s); ++b) {
      const auto it = key_index_.find(KeyOf(s, b));
      if (it == key_index_.end()) continue;  // never touched: the simulator never saw it
      trace_.events.push_back(TraceEvent{step, it->second, 0.0f, EventKind::kRelease});
    }
  }

  void DecodeStep(Session& s, uint32_t step) {
    // Decode one token; a new block starts every block_tokens tokens.
    const uint32_t before = Blocks(s);
    if (s.tokens + 1 < p_.context_max) {
      ++s.tokens;
      if (Blocks(s) > before) SetImportance(s, Blocks(s) - 1, Pareto());
      if (s.turn_left > 0) --s.turn_left;
    } else {
      s.turn_left = 0;  // the context is full: this turn is the session's last step
    }
    const uint32_t n = std::min<uint32_t>(Blocks(s), max_blocks_);

    // Drift: redraw the importance of a few blocks.
    const double expected = p_.drift * n;
    uint32_t redraws = static_cast<uint32_t>(expected);
    if (Chance(expected - redraws)) ++redraws;
    for (uint32_t i = 0; i < redraws; ++i) {
      SetImportance(s, std::uniform_int_distribution<uint32_t>(0, n - 1)(rng_), Pareto());
    }

    // The attended set: sinks, the recent window, and heavy hitters sampled by
    // importance without replacement.
    chosen_.clear();
    for (uint32_t b = 0; b < std::min(p_.sink_blocks, n); ++b)
      chosen_.push_back({b, p_.sink_weight});
    const uint32_t window_start = n > p_.window_blocks ? n - p_.window_blocks : 0;
    for (uint32_t b = std::max(window_start, p_.sink_blocks); b < n; ++b) {
      chosen_.push_back({b, p_.window_weight});
    }
    // Take the window out of the sampling tree for this step.
    saved_.clear();
    for (uint32_t b = std::max(window_start, p_.sink_blocks); b < n; ++b) {
      saved_.push_back(b);
      s.tree->Set(b, 0.0);
    }
    const size_t fixed = chosen_.size();
    const size_t want = p_.topk > fixed ? p_.topk - fixed : 0;
    for (size_t k = 0; k < want && s.tree->total() > 1e-9; ++k) {
      const double u = std::uniform_real_distribution<double>(0, s.tree->total())(rng_);
      const size_t b = s.tree->Find(u);
      if (s.tree->weight(b) <= 0) break;  // rounding at the edge; nothing left worth taking
      chosen_.push_back({static_cast<uint32_t>(b), s.importance[b]});
      saved_.push_back(static_cast<uint32_t>(b));
      s.tree->Set(b, 0.0);
    }
    for (uint32_t b : saved_) s.tree->Set(b, IsSink(b) ? 0.0 : s.importance[b]);

    double total = 0;
    for (const auto& c : chosen_) total += c.second;
    std::sort(chosen_.begin(), chosen_.end());
    for (const auto& [b, w] : chosen_) {
      const float mass = total > 0 ? static_cast<float>(w / total) : 0.0f;
      trace_.events.push_back(TraceEvent{step, KeyIndex(s, b), mass, EventKind::kTouch});
    }
  }

  AttentionParams p_;
  std::mt19937_64 rng_;
  uint32_t max_blocks_;
  uint64_t next_uid_ = 1;
  Trace trace_;
  std::vector<Session> sessions_;
  std::unordered_map<BlockKey, uint32_t, BlockKeyHash> key_index_;
  std::vector<std::pair<uint32_t, double>> chosen_;
  std::vector<uint32_t> saved_;
  std::vector<TraceEvent> soon_;  // soon hints, merged in by step at the end
};

// name -> pointer to the field, for Parse and ToString.
template <typename Fn>
void ForEachParam(AttentionParams& p, Fn&& fn) {
  fn("seed", &p.seed);
  fn("steps", &p.steps);
  fn("sessions", &p.sessions);
  fn("batch", &p.batch);
  fn("context_min", &p.context_min);
  fn("context_max", &p.context_max);
  fn("topk", &p.topk);
  fn("sink_blocks", &p.sink_blocks);
  fn("window_blocks", &p.window_blocks);
  fn("sink_weight", &p.sink_weight);
  fn("window_weight", &p.window_weight);
  fn("heavy_alpha", &p.heavy_alpha);
  fn("drift", &p.drift);
  fn("turn_tokens", &p.turn_tokens);
  fn("pause_steps", &p.pause_steps);
  fn("user_tokens", &p.user_tokens);
  fn("turns", &p.turns);
  fn("shared_prefix_blocks", &p.shared_prefix_blocks);
  fn("release_on_pause", &p.release_on_pause);
  fn("block_tokens", &p.block_tokens);
  fn("hints", &p.hints);
  fn("hint_lead", &p.hint_lead);
}

template <typename T>
bool ParseNumber(std::string_view text, T* out) {
  if constexpr (std::is_floating_point_v<T>) {
    double v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size() || !std::isfinite(v)) return false;
    *out = v;
  } else {
    T v = 0;
    auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || p != text.data() + text.size()) return false;
    *out = v;
  }
  return true;
}

}  // namespace

std::string AttentionParams::Parse(std::string_view overrides) {
  while (!overrides.empty()) {
    const size_t comma = overrides.find(',');
    const std::string_view item = overrides.substr(0, comma);
    overrides = comma == std::string_view::npos ? std::string_view{} : overrides.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      return "attention parameter '" + std::string(item) + "' needs =value";
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    bool found = false, good = true;
    ForEachParam(*this, [&](const char* name, auto* field) {
      if (key != name) return;
      found = true;
      good = ParseNumber(value, field);
    });
    if (!found) return "unknown attention parameter '" + std::string(key) + "'";
    if (!good)
      return "bad value '" + std::string(value) + "' for attention parameter '" + std::string(key) +
             "'";
  }
  return Validate();
}

std::string AttentionParams::Validate() const {
  if (block_tokens == 0) return "block_tokens must be at least 1";
  if (sessions == 0 || batch == 0) return "sessions and batch must be at least 1";
  if (context_min == 0 || context_min >= context_max) return "need 0 < context_min < context_max";
  if (context_max > (1u << 24)) return "context_max above 16M tokens is not supported";
  if (topk == 0) return "topk must be at least 1";
  if (!(heavy_alpha > 0)) return "heavy_alpha must be > 0";
  if (!(drift >= 0 && drift <= 1)) return "drift must be in [0, 1]";
  if (!(release_on_pause >= 0 && release_on_pause <= 1))
    return "release_on_pause must be in [0, 1]";
  if (!(sink_weight >= 0 && window_weight >= 0)) return "weights must be >= 0";
  if (hints > 1) return "hints must be 0 or 1";
  if (static_cast<uint64_t>(sessions) * (context_max / block_tokens + 2) > (uint64_t{1} << 28)) {
    return "sessions x blocks per session is too large for memory";
  }
  return {};
}

std::string AttentionParams::ToString() const {
  std::ostringstream out;
  bool first = true;
  AttentionParams copy = *this;
  ForEachParam(copy, [&](const char* name, auto* field) {
    out << (first ? "" : ",") << name << "=" << *field;
    first = false;
  });
  return out.str();
}

Trace GenerateAttention(const AttentionParams& params) { return Generator(params).Run(); }

}  // namespace cxltier::sim
