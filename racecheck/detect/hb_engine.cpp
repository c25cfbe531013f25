// racecheck/detect/hb_engine.cpp: the native happens-before engine (hb_engine.h), method for method
// engine.py's HappensBefore; each function names the one it follows where the names differ.

#include "hb_engine.h"

#include <algorithm>
#include <unordered_set>

namespace hb {

Engine::Engine() { allocation_op_ = name_id("allocation"); }

int32_t Engine::name_id(const std::string& name) {
  auto it = name_ids_.find(name);
  if (it != name_ids_.end()) return it->second;
  auto id = static_cast<int32_t>(names_.size());
  names_.push_back(name);
  name_ids_.emplace(name, id);
  return id;
}

DomainId Engine::domain_of(int64_t key) const {
  auto it = by_key_.find(key);
  return it == by_key_.end() ? NO_DOMAIN : it->second;
}

DomainId Engine::add_domain(int64_t key, bool host_ops, const std::string& name) {
  auto id = static_cast<DomainId>(domains_.size());
  Domain d;
  d.key = key;
  d.host_ops = host_ops;
  d.name = name_id(name);
  d.clock.assign(static_cast<size_t>(id) + 1, 0);
  d.clock[static_cast<size_t>(id)] = 1;
  domains_.push_back(std::move(d));
  if (!host_ops) by_key_[key] = id;
  return id;
}

// -- clocks ----------------------------------------------------------------------------------------
// d's clock, after merging what the host knows complete (_now).
Clock& Engine::now(DomainId d) {
  Domain& dom = domains_[static_cast<size_t>(d)];
  if (dom.host_version != host_version_) {
    join(dom.clock, host_);
    dom.host_version = host_version_;
  }
  return dom.clock;
}

// A copy of d's clock; later work on d is not covered by it (_snapshot).
Clock Engine::snapshot(DomainId d) {
  Clock snap = now(d);
  domains_[static_cast<size_t>(d)].clock[static_cast<size_t>(d)] += 1;
  return snap;
}

void Engine::wait_event(int64_t event, DomainId stream) {
  auto it = events_.find(event);
  if (it != events_.end()) join(now(stream), it->second);  // never recorded: complete, orders nothing
}

void Engine::host_learns(const Clock& snap) {
  join(host_, snap);
  host_version_++;
}

void Engine::host_sync_event(int64_t event) {
  auto it = events_.find(event);
  if (it != events_.end()) host_learns(it->second);
}

void Engine::host_sync_all() {
  for (size_t d = 0; d < domains_.size(); d++) host_learns(snapshot(static_cast<DomainId>(d)));
}

// -- allocations -----------------------------------------------------------------------------------
AllocId Engine::allocate(DomainId stream, uint64_t ptr, uint64_t nbytes, int64_t stack, const Clock* clock) {
  uint64_t end = ptr + nbytes;
  if (allocs_.clashes(ptr, end))  // a live record at these bytes missed its free
    for (AllocId old : allocs_.overlapping(ptr, end)) retire_alloc(old);
  AllocId id = allocs_.create(next_serial_++, ptr, nbytes, stream, stack);
  if (nbytes > 0 && stream != NO_DOMAIN) check_reuse(id, stream, clock != nullptr ? *clock : now(stream));
  allocs_.add_live(id);
  return id;
}

void Engine::retire_alloc(AllocId id) {
  allocs_.remove_live(id);
  allocs_.count_freed();
  stats_.unseen_frees++;
}

void Engine::retire(uint64_t ptr) {
  AllocId id = allocs_.live_at(ptr);
  if (id != NO_ALLOC) retire_alloc(id);
}

void Engine::record_stream(uint64_t ptr, DomainId stream) {
  AllocId id = allocs_.live_at(ptr);
  if (id == NO_ALLOC) return;
  std::vector<DomainId>& rec = allocs_[id].recorded;
  auto at = std::lower_bound(rec.begin(), rec.end(), stream);
  if (at == rec.end() || *at != stream) rec.insert(at, stream);
}

void Engine::free(uint64_t ptr, const std::vector<DomainId>& deferred_to, int64_t stack) {
  AllocId id = allocs_.live_at(ptr);
  if (id == NO_ALLOC) {
    stats_.unknown_frees++;
    return;
  }
  allocs_.remove_live(id);
  allocs_.count_freed();
  Alloc& a = allocs_[id];
  a.free_stack = stack;
  if (a.recorded.empty() && deferred_to.empty()) return;
  std::vector<DomainId> held = a.recorded;
  for (DomainId d : deferred_to)
    if (std::find(held.begin(), held.end(), d) == held.end()) held.push_back(d);
  std::vector<Clock> holds;  // the allocator's event on each such stream, recorded at the free
  for (DomainId d : held)
    if (d != a.stream) holds.push_back(snapshot(d));
  a.holds = std::move(holds);
}

// Whether an access to bytes that stream d's new allocation reuses stays on them; one not ordered
// before the allocation is noted in `racing` (by its stream, a read preferred) and dropped
// (_kept_at_reuse).
bool Engine::kept_at_reuse(const Access& acc, DomainId d, const Clock& clock, std::vector<Access>& racing) const {
  DomainId dom = acc.domain;
  int64_t epoch = acc.epoch;
  const Alloc& gen = allocs_[acc.alloc];
  if (at(host_, dom) >= epoch || (gen.stream != NO_DOMAIN && gen.stream != d)) return false;  // complete
  for (const Clock& h : gen.holds)
    if (at(h, dom) >= epoch) return false;
  if (dom == d || at(clock, dom) >= epoch) return true;  // ordered before the allocation, not known complete
  for (Access& prev : racing)
    if (prev.domain == dom) {
      if (prev.is_write && !acc.is_write) prev = acc;  // a read names the consumer the reuse cheats
      return false;
    }
  racing.push_back(acc);
  return false;
}

// _check_reuse: the cells overlapping the block, visited without splitting any (most reuses drop
// nothing), then the accesses that are complete or race dropped from the block's bytes only.
void Engine::check_reuse(AllocId id, DomainId d, const Clock& clock) {
  const uint64_t ptr = allocs_[id].ptr, end = allocs_[id].end;
  std::vector<Access> others;  // accesses that are not d's own to d's own block: only these can go or race
  auto other = [&](const Access& acc) {
    const Alloc& gen = allocs_[acc.alloc];
    return acc.domain != d || gen.stream != d || !gen.holds.empty();
  };
  for (auto it = shadow_.first_from(ptr); it != shadow_.end() && it->first < end; ++it) {
    const Cell& cell = it->second;
    if (cell.has_write && other(cell.write)) others.push_back(cell.write);
    for (const Access& r : cell.reads)
      if (other(r)) others.push_back(r);
  }
  if (others.empty()) return;
  std::vector<Access> racing;  // one report per racing stream: its read if any
  std::vector<uint64_t> dropped;
  for (const Access& acc : others)
    if (!kept_at_reuse(acc, d, clock, racing)) dropped.push_back(acc.id);
  if (!dropped.empty()) drop_from_block(ptr, end, dropped);
  if (racing.empty()) return;
  const Alloc& a = allocs_[id];
  Access later = make_access(d, at(clock, d), true, allocation_op_, id, a.stack);
  for (const Access& acc : racing) report(REUSE, acc, later);
}

void Engine::drop_from_block(uint64_t ptr, uint64_t end, const std::vector<uint64_t>& dropped) {
  std::unordered_set<uint64_t> gone(dropped.begin(), dropped.end());
  auto [i, j] = shadow_.span(ptr, end, false);
  for (auto it = i; it != j; ++it) {
    Cell& cell = it->second;
    if (cell.has_write && gone.count(cell.write.id)) cell.has_write = false;
    auto& reads = cell.reads;
    reads.erase(std::remove_if(reads.begin(), reads.end(), [&](const Access& r) { return gone.count(r.id) > 0; }),
                reads.end());
  }
  shadow_.drop_empty(i, j);
}

// -- accesses --------------------------------------------------------------------------------------
// One operator's accesses, all inside live allocations: a whole-cell access (a tensor touched as it
// was last time) is checked inline; anything else goes through access().
void Engine::access_many(DomainId d, const std::vector<Touch>& touches, int32_t op, int64_t stack) {
  const Clock& clock = now(d);
  const int64_t epoch = at(clock, d);
  for (const Touch& t : touches) {
    uint64_t end = t.ptr + t.nbytes;
    auto it = shadow_.find(t.ptr);
    if (it == shadow_.end() || it->second.end != end || end > allocs_[t.alloc].end) {
      access(d, clock, t, op, stack);  // clamps to the allocation
      continue;
    }
    Cell& cell = it->second;
    Access acc = make_access(d, epoch, t.is_write, op, t.alloc, stack);
    const Access& w = cell.write;
    if (cell.has_write && w.domain != d && at(clock, w.domain) < w.epoch)
      report(t.is_write ? WRITE_AFTER_WRITE : READ_AFTER_WRITE, w, acc);
    if (t.is_write) {
      for (const Access& r : cell.reads)
        if (r.domain != d && at(clock, r.domain) < r.epoch) report(WRITE_AFTER_READ, r, acc);
      cell.reads.clear();
      cell.has_write = true;
      cell.write = acc;
    } else {
      cell.set_read(acc);
    }
  }
  accesses_ += touches.size();
}

// _access: a write leaves one history on all its bytes (the cells it covers, gaps need none, are
// checked, then replaced by one cell); a read adds itself to every cell, gaps filled.
bool Engine::access_one(DomainId d, uint64_t ptr, uint64_t nbytes, bool is_write, int32_t op, int64_t stack,
                        bool record) {
  if (nbytes == 0) return false;
  AllocId alloc = allocs_.containing(ptr);
  if (alloc == NO_ALLOC) {
    stats_.untracked_accesses++;
    return false;
  }
  access(d, now(d), Touch{ptr, nbytes, is_write, alloc}, op, stack, record);
  accesses_++;
  return true;
}

void Engine::access(DomainId d, const Clock& clock, const Touch& t, int32_t op, int64_t stack, bool record) {
  uint64_t end = std::min(t.ptr + t.nbytes, allocs_[t.alloc].end);
  if (end <= t.ptr) return;  // no byte of the allocation (one of 0 bytes at this address), as engine.py
  Access acc = make_access(d, at(clock, d), t.is_write, op, t.alloc, stack);
  auto [i, j] = shadow_.span(t.ptr, end, !t.is_write);
  std::vector<uint64_t> reported;  // one report per earlier access, however many cells
  auto first_time = [&](const Access& earlier) {
    if (std::find(reported.begin(), reported.end(), earlier.id) != reported.end()) return false;
    reported.push_back(earlier.id);
    return true;
  };
  for (auto it = i; it != j; ++it) {
    Cell& cell = it->second;
    const Access& w = cell.write;
    if (cell.has_write && w.domain != d && at(clock, w.domain) < w.epoch && first_time(w))
      report(t.is_write ? WRITE_AFTER_WRITE : READ_AFTER_WRITE, w, acc);
    if (t.is_write) {
      for (const Access& r : cell.reads)
        if (r.domain != d && at(clock, r.domain) < r.epoch && first_time(r)) report(WRITE_AFTER_READ, r, acc);
    } else if (record) {
      cell.set_read(acc);
    }
  }
  if (t.is_write) shadow_.replace(i, j, t.ptr, end, acc);
}

// -- reports ---------------------------------------------------------------------------------------
int64_t Engine::key_of(int64_t stack) {
  auto it = stack_keys_.find(stack);
  if (it != stack_keys_.end()) return it->second;
  int64_t key = stack_key ? stack_key(stack) : stack;
  stack_keys_.emplace(stack, key);
  return key;
}

// _report: races with the same streams' names, operators, earlier access kind and user frames are
// one report, counted.
void Engine::report(RaceKind kind, const Access& earlier, const Access& later) {
  std::vector<int64_t> key{kind,
                           domains_[static_cast<size_t>(earlier.domain)].name,
                           earlier.op,
                           earlier.is_write,
                           key_of(earlier.stack),
                           domains_[static_cast<size_t>(later.domain)].name,
                           later.op,
                           key_of(later.stack)};
  for (size_t i = 0; i < report_keys_.size(); i++)
    if (report_keys_[i] == key) {
      reports_[i].count++;
      return;
    }
  if (reports_.size() < MAX_REPORTS) {
    reports_.push_back(Report{kind, earlier, later, 1});
    report_keys_.push_back(std::move(key));
  } else {
    stats_.reports_dropped++;
  }
}

// [Note: allocation slots]: the generations that the live table, the shadow memory or a report
// still names are kept; the others' slots are reused. Sweeps once enough have been freed since.
void Engine::collect() {
  if (allocs_.freed_since_sweep() < 4096 + allocs_.live().size() + shadow_.cells().size()) return;
  std::vector<bool> marked(allocs_.slots(), false);
  for (const auto& [start, cell] : shadow_.cells()) {
    if (cell.has_write) marked[cell.write.alloc] = true;
    for (const Access& r : cell.reads) marked[r.alloc] = true;
  }
  for (const Report& r : reports_) marked[r.earlier.alloc] = marked[r.later.alloc] = true;
  allocs_.sweep(marked);
}

}  // namespace hb
