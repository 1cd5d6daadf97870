#include "engine/hints.h"

#include <algorithm>
#include <cassert>

#include "engine/engine.h"

// ---------------------------------------------------------------- the tables

namespace cxltier::engine {

uint32_t GroupTable::Create(GroupId id, uint32_t owner) {
  const uint32_t index = TakeEntry(groups_, free_);
  index_.emplace(id, index);
  Group& g = groups_[index];
  const uint32_t serial = g.serial;  // kept across reuse: older entries stay stale
  g = Group{};
  g.serial = serial;
  g.id = id;
  g.owner = owner;
  return index;
}

void GroupTable::Free(uint32_t index) {
  Group& g = groups_[index];
  index_.erase(g.id);
  // Its entries in pending_ and jobs_ go stale with the serial and the ticket.
  const uint32_t serial = g.serial + 1;
  g = Group{};
  g.serial = serial;
  free_.push_back(index);
}

void GroupTable::Queue(uint32_t index) {
  Group& g = groups_[index];
  if (g.queued != 0) return;  // its entry serves whatever job it has then
  g.queued = ++next_ticket_;
  jobs_.push_back(JobRef{index, g.queued});
}

uint32_t GroupTable::PopJob() {
  const JobRef r = jobs_.front();
  jobs_.pop_front();
  if (groups_[r.index].queued != r.ticket) return kStale;
  groups_[r.index].queued = 0;
  return r.index;
}

uint32_t GroupTable::OwnerIndex(uint32_t owner) {
  const auto [it, added] =
      owners_.try_emplace(owner, static_cast<uint32_t>(in_set_by_owner_.size()));
  if (added) {
    in_set_by_owner_.push_back(0);
    tier_blocks_by_owner_.push_back({});
  }
  return it->second;
}

}  // namespace cxltier::engine

// ---------------------------------------------------------------- the engine's hint code

namespace cxltier::engine {

GroupId Engine::group(Slot s) const {
  return s < slot_hints_.size() && slot_hints_[s].group != 0 ? groups_[slot_hints_[s].group - 1].id
                                                             : kNoGroup;
}

bool Engine::SetGroup(Slot s, GroupId id) {
  assert(IsLive(s));
  if (id == kNoGroup) {
    LeaveGroup(s);
    return true;
  }
  if (group(s) == id) return true;
  Group* g = groups_.Find(id);
  if (g != nullptr && g->owner != owners_[s]) return false;
  LeaveGroup(s);
  if (g == nullptr) g = &groups_[groups_.Create(id, owners_[s])];
  slot_hints_[s].group = groups_.IndexOf(*g) + 1;
  slot_hints_[s].pos = static_cast<uint32_t>(g->members.size());
  g->members.push_back(s);
  if (states_[s].flags & kFlagInTarget) ++g->in_set;
  return true;
}

void Engine::LeaveGroup(Slot s) {
  const uint32_t index1 = slot_hints_[s].group;
  if (index1 == 0) return;
  Group& g = groups_[index1 - 1];
  if (states_[s].flags & kFlagInTarget) --g.in_set;
  const uint32_t pos = slot_hints_[s].pos;
  const uint32_t last = static_cast<uint32_t>(g.members.size() - 1);
  if (g.job.phase == HintJob::kWalk && pos < g.job.cursor) {
    // A walk is under way: the members before its cursor stay those it has
    // looked at. The last one it looked at fills the hole, and the last
    // member (not looked at yet) takes that one's place, past the cursor.
    const uint32_t c = --g.job.cursor;
    if (pos != c) PlaceMember(g, pos, g.members[c]);
    if (c != last) PlaceMember(g, c, g.members[last]);
  } else if (pos != last) {
    PlaceMember(g, pos, g.members[last]);
  }
  g.members.pop_back();
  slot_hints_[s].group = 0;
  groups_.PoolRemove(s);
  if (g.members.empty()) groups_.Free(index1 - 1);
}

void Engine::Displace(Slot v, uint64_t* counter) {
  BlockState& st = states_[v];
  policy_->Erase(v);
  ClearSet(v);
  ++*counter;
  Log(EngineEvent::kEvict, v);
  ForgetIfReset(st);
  if (options_.mode == Mode::kDemand) {
    DemoteNow(v);
  } else {
    LeftSetTick(v);
  }
}

bool Engine::PlaceAhead(Slot s, uint32_t owner, uint64_t now) {
  if (capacity_ == 0 || (accounts_.on() && !accounts_.MayEnterSet(s))) return false;
  // An account at its cap makes room with its own coldest block.
  if (in_set_ >= set_capacity_ && !(accounts_.on() && accounts_.AtSetCap(s))) {
    const Slot v = PoolBack();
    if (v != kNoSlot && !(accounts_.on() && accounts_.Guaranteed(v, s))) {
      Unrank(s);  // on its way in
      Displace(v, &counters_.hint_displaced);
    } else if (groups_.InSetOf(owner) != in_set_) {
      return false;  // the policy might evict another owner's block
    }
  }
  BlockState& st = states_[s];
  // A pause does not age the block: its touch time moves on by the time its
  // group was idle (so an EMA's score is what it was when the group stopped).
  const uint64_t idle_for = Elapsed(now, groups_[slot_hints_[s].group - 1].idle_at);
  st.touch_time = Resumed(st.touch_time, idle_for, now);
  policy_->OnResume(s, idle_for, now);
  JoinSet(s, engine::Touch{0.0, now, kNever, /*ahead=*/true});
  ++counters_.hint_prefetched;
  slot_hints_[s].placed_ahead = 1;
  if (options_.mode == Mode::kTick) {
    // Needed soon: planned with the blocks in use, ahead of those merely queued.
    if (queues_.ListOf(s) == kPromoteQueue) {
      queues_.Remove(s);
      queues_.PushFront(kRetouchedQueue, s);
    }
  }
  return true;
}

void Engine::ServePending(uint64_t now, size_t* units) {
  // Rounds over the waiting groups, a block each per round, while a round
  // places any. A round cut short by the units goes on where it stopped.
  std::vector<PendingRef>& pending = groups_.pending();
  ServeCursor& cursor = groups_.serve();
  size_t i = cursor.left ? cursor.from : 0;
  bool progress = cursor.left && cursor.progress;
  cursor.left = false;
  for (;;) {
    size_t keep = i;  // entries before `keep` stay; stale and finished ones are dropped
    bool cut = false;
    for (; i < pending.size(); ++i) {
      if (*units == 0) {
        cut = true;
        break;
      }
      --*units;
      const PendingRef r = pending[i];
      Group& g = groups_[r.index];
      if (!g.pending || g.serial != r.serial) continue;  // stale: dropped
      // The next block still out of the set (a candidate may have been
      // touched, released or regrouped since the hint).
      bool found = false;
      while (!g.candidates.empty()) {
        const Group::Candidate& c = g.candidates.back();
        if (IsLive(c.slot) && states_[c.slot].generation == c.generation &&
            slot_hints_[c.slot].group == r.index + 1 && !(states_[c.slot].flags & kFlagInTarget)) {
          found = true;
          break;
        }
        if (*units == 0) break;
        g.candidates.pop_back();
        --*units;
      }
      if (!found && !g.candidates.empty()) {  // out of units: this one goes on next time
        cut = true;
        break;
      }
      if (!found || g.prefetch_left == 0) {
        g.pending = false;
        g.candidates = {};
        continue;
      }
      if (PlaceAhead(g.candidates.back().slot, g.owner, now)) {
        g.candidates.pop_back();
        --g.prefetch_left;
        progress = true;
      }
      pending[keep++] = r;
    }
    if (cut) {
      cursor = ServeCursor{true, keep, progress};
    }
    for (; i < pending.size(); ++i) pending[keep++] = pending[i];
    pending.resize(keep);
    if (cut || !progress || pending.empty()) return;
    i = 0;
    progress = false;
  }
}

size_t Engine::SliceUnits() const {
  return options_.mode == Mode::kTick && options_.hint_slice_units > 0 ? options_.hint_slice_units
                                                                       : SIZE_MAX;
}

size_t Engine::ReleaseUnits() const {
  const size_t slice = SliceUnits();
  if (slice == SIZE_MAX) return slice;  // demand mode, or no slices: all at once
  const size_t release = options_.hint_release_units;
  return release > 0 && release < slice ? release : slice;
}

size_t Engine::TickUnits() const {
  return options_.hint_tick_units > 0 ? options_.hint_tick_units : SIZE_MAX;
}

void Engine::StartJob(uint32_t index, HintKind kind, uint32_t keep) {
  HintJob& job = groups_[index].job;
  job = HintJob{};
  job.phase = HintJob::kWalk;
  job.kind = kind;
  job.keep = keep;
}

bool Engine::RunJob(uint32_t index, size_t* units) {
  Group& g = groups_[index];
  HintJob& job = g.job;
  const bool soon = job.kind == HintKind::kSoon;
  // The walk: an idle or done hint wants the members in the set, a soon the
  // hottest `keep` of those outside it that were touched.
  while (job.phase == HintJob::kWalk && *units > 0) {
    if (job.cursor == g.members.size()) {
      job.phase = HintJob::kDrain;
      break;
    }
    --*units;
    const Slot m = g.members[job.cursor++];
    const BlockState& st = states_[m];
    const bool in_set = st.flags & kFlagInTarget;
    if (!soon) {
      if (!in_set) continue;
      job.heap.push_back(OrderOf(m));
      std::push_heap(job.heap.begin(), job.heap.end(), Ordered::Hotter);
    } else if (!in_set && st.touch_count > 0) {
      const Ordered o = OrderOf(m);
      if (job.heap.size() < job.keep) {
        job.heap.push_back(o);
        std::push_heap(job.heap.begin(), job.heap.end(), Ordered::Hotter);
      } else if (Ordered::Colder(job.heap.front(), o)) {
        std::pop_heap(job.heap.begin(), job.heap.end(), Ordered::Hotter);
        job.heap.back() = o;
        std::push_heap(job.heap.begin(), job.heap.end(), Ordered::Hotter);
      }
    }
  }
  // The drain, coldest first. Idle and done: each block pushed in front of
  // the pool, so that the group's coldest leave first, and groups hinted
  // earlier before those hinted later. Soon: candidates, hottest at the back.
  while (job.phase == HintJob::kDrain && !job.heap.empty() && *units > 0) {
    --*units;
    std::pop_heap(job.heap.begin(), job.heap.end(), Ordered::Hotter);
    const Ordered o = job.heap.back();
    job.heap.pop_back();
    if (soon) {
      g.candidates.push_back(Group::Candidate{o.slot, o.generation});
    } else if (IsLive(o.slot) && states_[o.slot].generation == o.generation &&
               slot_hints_[o.slot].group == index + 1 && (states_[o.slot].flags & kFlagInTarget)) {
      groups_.PoolPut(job.kind == HintKind::kDone ? GroupTable::kDonePool : GroupTable::kIdlePool,
                      o.slot, g.serial);
    }
  }
  if (job.phase == HintJob::kDrain && job.heap.empty()) FinishJob(index, units);
  return job.phase == HintJob::kNone;
}

void Engine::FinishJob(uint32_t index, size_t* units) {
  Group& g = groups_[index];
  const bool soon = g.job.kind == HintKind::kSoon;
  const uint32_t keep = g.job.keep;
  g.job = HintJob{};
  if (!soon) {
    if (!groups_.pending().empty()) ServePending(now_, units);  // room it may give a waiting soon
    return;
  }
  if (g.candidates.empty()) return;
  g.prefetch_left = keep;
  g.pending = true;
  groups_.pending().push_back(PendingRef{index, g.serial});
  ServePending(now_, units);
}

void Engine::RunHints() {
  if (!groups_.WorkPending()) return;
  size_t units = TickUnits();
  const size_t budget = units;
  const size_t slice = SliceUnits();
  // Each queued job a slice in turn, until the units run out.
  while (groups_.HasJobs() && units > 0) {
    const uint32_t index = groups_.PopJob();
    if (index == GroupTable::kStale) {
      --units;
      continue;
    }
    size_t give = std::min(slice, units);
    const size_t given = give;
    const bool done = RunJob(index, &give);
    units -= given - give;
    if (!done) groups_.Queue(index);
  }
  uint64_t work = budget - units;
  // A round of waiting soons cut short (a release serves only a few units)
  // goes on with what is left, and at least a slice whatever the jobs took:
  // room a release left is not held back behind a long job that new hints
  // keep restarting.
  if (groups_.serve().left) {
    size_t give = std::max(units, std::min(slice, budget));
    const size_t given = give;
    ServePending(now_, &give);
    work += given - give;
  }
  counters_.hint_work += work;
}

bool Engine::Hint(GroupId id, HintKind kind, uint64_t now) {
  Group* found = groups_.Find(id);
  if (found == nullptr) return false;
  Group& g = *found;
  const uint32_t index = groups_.IndexOf(g);
  ++counters_.hints;
  now_ = now;
  if (policy_->NeedsFuture() || capacity_ == 0) return true;
  // A new hint ends what the last one still had to do: its soon's placing,
  // its work, its blocks' places in the pool.
  ++g.serial;
  g.pending = false;
  g.candidates = {};
  g.prefetch_left = 0;
  g.job = HintJob{};
  uint32_t keep = 0;
  if (kind == HintKind::kIdle || kind == HintKind::kDone) {
    g.working_set = g.in_set;
    g.idle_at = now;
    g.hinted_out = true;
    g.last = kind;
  } else {
    if (g.hinted_out) g.Activate();
    g.last = kind;
    if (g.working_set <= g.in_set) return true;
    keep = g.working_set - g.in_set;
  }
  size_t units = SliceUnits();
  const size_t budget = units;
  if (kind != HintKind::kSoon && g.in_set == 0) {
    // Nothing of it to mark: no walk.
    if (!groups_.pending().empty()) ServePending(now, &units);
  } else {
    StartJob(index, kind, keep);
    if (!RunJob(index, &units)) {
      groups_.Queue(index);
      ++counters_.hint_deferred;
    }
  }
  counters_.hint_work += budget - units;
  return true;
}

}  // namespace cxltier::engine
