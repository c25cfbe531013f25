// racecheck/detect/hb_allocations.cpp: the native engine's allocation slots and live table
// (hb_allocations.h); the queries answer as allocations.py's LiveAllocations does.

#include "hb_allocations.h"

#include <iterator>

namespace hb {

AllocId Allocations::create(uint64_t serial, uint64_t ptr, uint64_t nbytes, DomainId stream, int64_t stack) {
  AllocId id;
  if (!free_.empty()) {
    id = free_.back();
    free_.pop_back();
  } else {
    id = static_cast<AllocId>(slots_.size());
    slots_.emplace_back();
  }
  Alloc& a = slots_[id];
  a = Alloc{};
  a.serial = serial;
  a.ptr = ptr;
  a.nbytes = nbytes;
  a.end = ptr + nbytes;
  a.stream = stream;
  a.stack = stack;
  a.used = true;
  return id;
}

void Allocations::add_live(AllocId id) {
  Alloc& a = slots_[id];
  a.live = true;
  live_[a.ptr] = id;
}

void Allocations::remove_live(AllocId id) {
  Alloc& a = slots_[id];
  a.live = false;
  live_.erase(a.ptr);
}

AllocId Allocations::live_at(uint64_t ptr) const {
  auto it = live_.find(ptr);
  return it == live_.end() ? NO_ALLOC : it->second;
}

AllocId Allocations::containing(uint64_t ptr) const {
  auto it = live_.upper_bound(ptr);
  if (it == live_.begin()) return NO_ALLOC;
  --it;
  return ptr < slots_[it->second].end || it->first == ptr ? it->second : NO_ALLOC;
}

// Whether a live allocation overlaps [start, end) (its free was missed): the last one starting at
// or before `start` starts there or reaches past it, or the next one starts before `end`.
bool Allocations::clashes(uint64_t start, uint64_t end) const {
  auto it = live_.upper_bound(start);
  if (it != live_.begin()) {
    auto prev = std::prev(it);
    if (prev->first == start || slots_[prev->second].end > start) return true;
  }
  return it != live_.end() && it->first < end;
}

std::vector<AllocId> Allocations::overlapping(uint64_t start, uint64_t end) const {
  std::vector<AllocId> out;
  auto it = live_.upper_bound(start);
  if (it != live_.begin()) --it;
  for (; it != live_.end() && it->first <= end; ++it) {
    const Alloc& a = slots_[it->second];
    if (a.ptr == start || (a.end > start && a.ptr < end)) out.push_back(it->second);
  }
  return out;
}

void Allocations::sweep(const std::vector<bool>& marked) {
  for (AllocId id = 0; id < slots_.size(); id++) {
    Alloc& a = slots_[id];
    if (a.used && !a.live && !(id < marked.size() && marked[id])) {
      a = Alloc{};  // its holds and streams released
      free_.push_back(id);
    }
  }
  freed_since_sweep_ = 0;
}

}  // namespace hb
