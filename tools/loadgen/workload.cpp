#include "workload.h"

#include <algorithm>
#include <string>
#include <thread>

namespace cxltier::loadgen {

volatile sig_atomic_t g_stop_requested = 0;
void RequestStop(int) { g_stop_requested = 1; }

int MakeWorkload(Session& s, Workload* w) {
  const Options& o = s.opt;
  sim::AttentionParams p;
  p.seed = o.seed;
  p.steps = o.steps;
  p.sessions = o.sessions;
  p.batch = o.batch;
  p.block_tokens = s.model.block_tokens;
  // Each session's share of the pool less two blocks, at least 4 (a pool
  // smaller than its sessions need drops the touches past it).
  const uint32_t share = o.blocks / std::max<uint32_t>(1, o.sessions);
  const uint32_t per_session = std::max<uint32_t>(4, share > 2 ? share - 2 : 0);
  p.context_max = per_session * p.block_tokens;
  p.context_min = std::max<uint32_t>(p.block_tokens, p.context_max / 2);
  p.shared_prefix_blocks = 0;
  p.topk = std::min<uint32_t>(16, per_session);
  p.turn_tokens = 32;
  p.pause_steps = 40;
  p.user_tokens = p.block_tokens * 2;
  p.hints = o.hints ? 1 : 0;
  p.hint_lead = o.hint_lead;
  if (std::string err = p.Validate(); !err.empty()) return Fail("workload: " + err);
  w->trace = sim::GenerateAttention(p);
  s.trace_keys = w->trace.keys;
  if (w->trace.events.empty()) return Fail("workload: the trace is empty");
  if (o.hints) {
    for (uint32_t k = 0; k < w->trace.groups.size(); ++k) {
      if (w->trace.groups[k] != 0) w->group_keys[w->trace.groups[k]].push_back(k);
    }
    s.hint_sent.assign(w->trace.keys.size(), 0);
  }
  return 0;
}

namespace {

// The replay: the trace's events step by step, against the daemon. Each
// function but Run gives 0, or Fail's exit code.
class Replay {
 public:
  Replay(Session& s, const Workload& w, WorkloadCounts& c)
      : s_(s), o_(s.opt), trace_(w.trace), group_keys_(w.group_keys), c_(c) {
    for (uint32_t b = o_.blocks; b-- > 0;) free_blocks_.push_back(b);
  }
  int Run();

 private:
  // Releases every live block and gives the next pass fresh keys.
  int NextPass();
  // Sorts the step's releases and the new keys to admit.
  void Plan(size_t end);
  int ReleaseAndAdmit();
  int TouchAndHint(size_t end);
  int SendHint(const sim::TraceEvent& e);

  Session& s_;
  const Options& o_;
  const sim::Trace& trace_;
  const std::unordered_map<uint32_t, std::vector<uint32_t>>& group_keys_;
  WorkloadCounts& c_;
  std::vector<uint32_t> free_blocks_;
  size_t i_ = 0;  // the step's first event
  // This step's admits and releases (Plan).
  std::vector<wire::AdmitEntry> admit_;
  std::vector<uint32_t> admit_keys_, admit_blocks_;
  std::vector<BlockKey> release_;
};

int Replay::Run() {
  c_.start = std::chrono::steady_clock::now();
  for (;;) {
    if (i_ == trace_.events.size()) {
      // The trace is done. Replay it while a --until-* condition is not met:
      // release every live block and give the next pass fresh keys (no ghost
      // of this run comes back, as in a pass of new conversations).
      const bool replay =
          o_.until_signal ? !g_stop_requested : o_.until_moves > 0 && !s_.UntilMet();
      if (!replay) break;
      if (int rc = NextPass(); rc != 0) return rc;
    }
    if (g_stop_requested) break;
    if (o_.max_seconds > 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - c_.start).count() >=
            o_.max_seconds) {
      break;
    }
    const uint32_t step = trace_.events[i_].step;
    if (o_.until_moves > 0 && c_.passes > 1 && step % 25 == 0 && s_.UntilMet()) break;
    size_t end = i_;
    while (end < trace_.events.size() && trace_.events[end].step == step) ++end;
    Plan(end);
    if (int rc = ReleaseAndAdmit(); rc != 0) return rc;
    if (int rc = TouchAndHint(end); rc != 0) return rc;
    i_ = end;
    // A heartbeat: notices a daemon that went away even in steps without calls.
    if (o_.reconnect && step % 25 == 0) {
      std::string text;
      if (Status h = s_.Call([&] { return s_.client->Stats("status", &text); }); !h.ok()) {
        return Fail("daemon gone: " + h.message);
      }
    }
    if (o_.step_ms) std::this_thread::sleep_for(std::chrono::milliseconds(o_.step_ms));
  }
  return 0;
}

int Replay::NextPass() {
  std::vector<BlockKey> all;
  for (const auto& [key, v] : s_.live) {
    all.push_back(s_.trace_keys[key]);
    free_blocks_.push_back(v.first);
    if (s_.readers) s_.readers->Withdraw(v.second);
  }
  s_.live.clear();
  for (size_t from = 0; from < all.size(); from += 256) {
    const std::vector<BlockKey> part(all.begin() + from,
                                     all.begin() + std::min(all.size(), from + 256));
    if (Status r = s_.Call([&] { return s_.client->Release(part); }); !r.ok()) {
      return Fail("release: " + r.message);
    }
  }
  c_.released += all.size();
  for (size_t k = 0; k < s_.trace_keys.size(); ++k) {
    s_.trace_keys[k] = trace_.keys[k];
    s_.trace_keys[k].hi ^= c_.passes << 40;  // sequence ids of the trace stay far below 2^40
  }
  std::fill(s_.hint_sent.begin(), s_.hint_sent.end(), 0);  // released: out of their groups
  ++c_.passes;
  i_ = 0;
  return 0;
}

void Replay::Plan(size_t end) {
  admit_.clear();
  admit_keys_.clear();
  admit_blocks_.clear();
  release_.clear();
  for (size_t k = i_; k < end; ++k) {
    const sim::TraceEvent& e = trace_.events[k];
    // Admitted at its first touch here; hints go with the touches below;
    // a recording's plans and moves are its daemon's, not ours to replay.
    if (e.kind != sim::EventKind::kTouch && e.kind != sim::EventKind::kRelease) continue;
    auto it = s_.live.find(e.key);
    if (e.kind == sim::EventKind::kRelease) {
      if (it != s_.live.end()) {
        release_.push_back(s_.trace_keys[e.key]);
        if (!s_.hint_sent.empty()) s_.hint_sent[e.key] = 0;  // a released block leaves its group
        free_blocks_.push_back(it->second.first);
        if (s_.readers) s_.readers->Withdraw(it->second.second);
        s_.live.erase(it);
      }
    } else if (it == s_.live.end() &&
               std::find(admit_keys_.begin(), admit_keys_.end(), e.key) == admit_keys_.end()) {
      if (free_blocks_.empty()) continue;
      // Copy mode: the daemon places the block; our index only counts room.
      admit_.push_back({s_.trace_keys[e.key], o_.copy ? 0 : free_blocks_.back()});
      admit_blocks_.push_back(free_blocks_.back());
      admit_keys_.push_back(e.key);
      free_blocks_.pop_back();
    }
  }
}

// Releases the released keys and admits this step's new ones in one batch.
int Replay::ReleaseAndAdmit() {
  if (!release_.empty()) {
    if (Status r = s_.Call([&] { return s_.client->Release(release_); }); !r.ok()) {
      return Fail("release: " + r.message);
    }
    c_.released += release_.size();
  }
  if (admit_.empty()) return 0;
  std::vector<wire::AdmitResult> results;
  if (Status a = s_.Call([&] { return s_.client->Admit(s_.pool_id, admit_, &results); }); !a.ok()) {
    return Fail("admit: " + a.message);
  }
  if (s_.readers) s_.readers->Admitted();
  for (size_t k = 0; k < admit_.size(); ++k) {
    s_.live[admit_keys_[k]] = {o_.copy ? admit_blocks_[k] : admit_[k].block_index, results[k].slot};
    c_.restored += results[k].restored;
    if (!o_.copy) continue;
    // The daemon placed it and gave us its write lease: fill it, let go.
    uint8_t* at = s_.client->WriteAddress(results[k].slot);
    if (!at) return Fail("admitted slot " + std::to_string(results[k].slot) + " has no place");
    FillBlock(at, o_.block_bytes, admit_[k].key);
    if (Status w = s_.client->EndWrite(results[k].slot); !w.ok()) return Fail(w.message);
    s_.readers->Publish(results[k].slot, admit_[k].key);
  }
  c_.admitted += admit_.size();
  return 0;
}

// Touches and hints in the trace's order: the daemon folds this client's
// observations before it applies a hint, so a hint after a touch comes
// after it there too.
int Replay::TouchAndHint(size_t end) {
  for (size_t k = i_; k < end; ++k) {
    const sim::TraceEvent& e = trace_.events[k];
    if (e.kind == sim::EventKind::kHint) {
      if (!o_.hints) {
        ++c_.hint_events_skipped;
        continue;
      }
      if (int rc = SendHint(e); rc != 0) return rc;
      continue;
    }
    if (e.kind != sim::EventKind::kTouch) continue;
    auto it = s_.live.find(e.key);
    if (it == s_.live.end()) {
      ++c_.dropped;
      continue;
    }
    ++c_.touches;
    c_.hits += s_.client->TierOf(it->second.second) == Tier::kFast;
    s_.client->Observe(it->second.second, e.obs);
  }
  return 0;
}

// One hint event: a Hint for its group with the group's live keys not sent
// before (computed at the call, so a retry after a reconnect sends them all).
int Replay::SendHint(const sim::TraceEvent& e) {
  const auto members = group_keys_.find(e.key);
  const Status h = s_.Call([&] {
    std::vector<uint32_t> sending;
    std::vector<BlockKey> keys;
    if (members != group_keys_.end()) {
      for (uint32_t k : members->second) {
        if (s_.hint_sent[k] || !s_.live.contains(k)) continue;
        sending.push_back(k);
        keys.push_back(s_.trace_keys[k]);
      }
    }
    wire::HintOk ok;
    Status st = s_.client->Hint(e.key, static_cast<HintKind>(static_cast<int>(e.obs)), keys, &ok);
    if (st.ok()) {
      for (uint32_t k : sending) s_.hint_sent[k] = 1;
      ++c_.hints_sent;
      c_.hints_applied += ok.applied;
      c_.hint_keys_grouped += ok.grouped;
      c_.hint_keys_unknown += ok.unknown;
    }
    return st;
  });
  if (!h.ok()) return Fail("hint: " + h.message);
  return 0;
}

}  // namespace

int ReplayWorkload(Session& s, const Workload& w, WorkloadCounts* counts) {
  return Replay(s, w, *counts).Run();
}

}  // namespace cxltier::loadgen
