// racecheck/detect/hb_shadow.cpp: the native engine's shadow memory (hb_shadow.h), cell for cell as
// shadow.py's ShadowMemory splits, fills and replaces.

#include "hb_shadow.h"

#include <iterator>

namespace hb {

void Shadow::boundary(uint64_t addr) {
  auto it = cells_.upper_bound(addr);
  if (it == cells_.begin()) return;
  --it;
  Cell& cell = it->second;
  if (it->first == addr || cell.end <= addr) return;
  Cell right = cell;  // Cell.split: the right part copies the history
  cell.end = addr;
  cells_.emplace_hint(std::next(it), addr, std::move(right));
}

std::pair<Shadow::It, Shadow::It> Shadow::span(uint64_t start, uint64_t end, bool fill) {
  auto exact = cells_.find(start);  // fast path: the range is exactly one cell (a whole-tensor access)
  if (exact != cells_.end() && exact->second.end == end) return {exact, std::next(exact)};
  boundary(start);
  boundary(end);
  It j = cells_.lower_bound(end);
  if (fill) {
    uint64_t pos = start;
    It k = cells_.lower_bound(start);
    while (pos < end) {
      if (k != j && k->first == pos) {
        pos = k->second.end;
        ++k;
        continue;
      }
      uint64_t gap_end = k != j ? k->first : end;
      Cell gap;
      gap.end = gap_end;
      cells_.emplace_hint(k, pos, std::move(gap));
      pos = gap_end;
    }
  }
  return {cells_.lower_bound(start), j};
}

void Shadow::replace(It i, It j, uint64_t start, uint64_t end, const Access& write) {
  It hint = cells_.erase(i, j);
  Cell cell;
  cell.end = end;
  cell.has_write = true;
  cell.write = write;
  cells_.emplace_hint(hint, start, std::move(cell));
}

void Shadow::drop_empty(It i, It j) {
  while (i != j) i = i->second.empty() ? cells_.erase(i) : std::next(i);
}

Shadow::It Shadow::first_from(uint64_t addr) {
  auto it = cells_.upper_bound(addr);
  if (it != cells_.begin()) {
    auto prev = std::prev(it);
    if (prev->second.end > addr) return prev;
  }
  return it;
}

}  // namespace hb
