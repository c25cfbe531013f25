// racecheck/detect/hb_allocations.h: allocations as the native happens-before engine keeps them, one
// generation of a block each, and the live ones by address (allocations.py for the Python engine).
//
// [Note: allocation slots]
// A generation outlives its free for as long as anything refers to it: the accesses the shadow
// memory keeps on its bytes (their record_stream holds decide a later reuse, [Note: reuse] in
// engine.py) and the reports that name it. So generations live in slots, referred to by index, and
// `sweep` hands back the slots of freed generations that nothing marked (the engine marks from its
// live table, shadow memory and reports between two batches, never while it holds slot indices in
// locals). A slot's Alloc never moves (a deque), so a reference stays good while slots are added.

#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "hb_clocks.h"

namespace hb {

using AllocId = uint32_t;
constexpr AllocId NO_ALLOC = UINT32_MAX;
constexpr int64_t NO_STACK = -1;        // the empty stack, ()
constexpr int64_t UNSEEN = INT64_MIN;  // a free the engine never saw (Allocation.free_stack None)

struct Alloc {
  uint64_t serial = 0, ptr = 0, nbytes = 0, end = 0;
  DomainId stream = NO_DOMAIN;  // NO_DOMAIN: allocated before the engine saw it
  bool live = false;
  bool used = false;  // the slot holds a generation
  int64_t stack = NO_STACK;
  int64_t free_stack = UNSEEN;
  std::vector<Clock> holds;        // clock snapshots of record_stream'd streams at the free
  std::vector<DomainId> recorded;  // streams given to record_stream while live, sorted
};

class Allocations {
 public:
  AllocId create(uint64_t serial, uint64_t ptr, uint64_t nbytes, DomainId stream, int64_t stack);
  Alloc& operator[](AllocId id) { return slots_[id]; }
  const Alloc& operator[](AllocId id) const { return slots_[id]; }

  // The live generations by start address (live blocks never share one).
  void add_live(AllocId id);
  void remove_live(AllocId id);
  AllocId live_at(uint64_t ptr) const;     // the live allocation starting at ptr
  AllocId containing(uint64_t ptr) const;  // the live allocation containing ptr
  bool clashes(uint64_t start, uint64_t end) const;
  std::vector<AllocId> overlapping(uint64_t start, uint64_t end) const;
  const std::map<uint64_t, AllocId>& live() const { return live_; }

  // [Note: allocation slots]
  size_t slots() const { return slots_.size(); }
  size_t freed_since_sweep() const { return freed_since_sweep_; }
  void count_freed() { freed_since_sweep_++; }
  void sweep(const std::vector<bool>& marked);

 private:
  std::deque<Alloc> slots_;
  std::vector<AllocId> free_;
  std::map<uint64_t, AllocId> live_;
  size_t freed_since_sweep_ = 0;
};

}  // namespace hb
