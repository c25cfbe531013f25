// racecheck/detect/hb_shadow.h: the native engine's shadow memory, the last accesses to every
// tracked byte as sorted, non-overlapping cells (shadow.py for the Python engine, whose rules of
// splitting, filling and replacing cells these follow one for one).
//
// [Note: access identity]
// The Python engine shares one Access object between the cells a split makes and tells accesses
// apart by identity (a race is reported once per earlier access however many cells hold it; a reuse
// drops an access from every cell). Here an access is a value copied into each cell, so it carries
// an id, unique per access, that stands for that identity.

#pragma once

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "hb_allocations.h"

namespace hb {

struct Access {
  uint64_t id = 0;  // [Note: access identity]
  int64_t epoch = 0;
  int64_t stack = NO_STACK;
  AllocId alloc = NO_ALLOC;  // the generation of the bytes it touched
  DomainId domain = NO_DOMAIN;
  int32_t op = 0;  // the engine's name id of the operator
  bool is_write = false;
};

// A cell's history: its last write, and the last read by each domain since, in the order the
// domains first read (a Python dict's order, which decides the order of reports).
struct Cell {
  uint64_t end = 0;
  bool has_write = false;
  Access write;
  std::vector<Access> reads;

  bool empty() const { return !has_write && reads.empty(); }
  void set_read(const Access& acc) {  // reads[domain] = acc: an existing domain keeps its place
    for (Access& r : reads)
      if (r.domain == acc.domain) {
        r = acc;
        return;
      }
    reads.push_back(acc);
  }
};

class Shadow {
 public:
  using Cells = std::map<uint64_t, Cell>;  // by start address
  using It = Cells::iterator;

  // The cells tiling [start, end), split at both ends; with `fill`, bytes never seen get empty
  // cells, so the range is covered without gaps. `end` > `start`.
  std::pair<It, It> span(uint64_t start, uint64_t end, bool fill);
  // One cell [start, end) with `write` in place of [i, j) (which lie inside it, as from span()).
  void replace(It i, It j, uint64_t start, uint64_t end, const Access& write);
  void drop_empty(It i, It j);  // remove cells in [i, j) that hold no access any more
  // The first cell that overlaps `addr` or starts after it.
  It first_from(uint64_t addr);
  It find(uint64_t start) { return cells_.find(start); }
  It end() { return cells_.end(); }
  const Cells& cells() const { return cells_; }

 private:
  void boundary(uint64_t addr);  // no cell straddles addr afterwards
  Cells cells_;
};

}  // namespace hb
