// racecheck/detect/hb_clocks.h: clock domains and vector clocks of the native happens-before engine
// (hb_engine.h), as clocks.py keeps them for the Python engine ([Note: clocks] in engine.py).
//
// A clock is dense: entry i is the last epoch of domain i that it covers, a missing entry 0 (a
// Python clock's `clock.get(domain, 0)`). Domains are numbered in the order they were made, which
// is the order engine.py's dict of domains keeps.

#pragma once

#include <cstdint>
#include <vector>

namespace hb {

using Clock = std::vector<int64_t>;
using DomainId = int32_t;
constexpr DomainId NO_DOMAIN = -1;  // an allocation adopted without a stream

inline int64_t at(const Clock& clock, DomainId d) {
  return static_cast<size_t>(d) < clock.size() ? clock[static_cast<size_t>(d)] : 0;
}

// dst covers everything src covers.
inline void join(Clock& dst, const Clock& src) {
  if (dst.size() < src.size()) dst.resize(src.size(), 0);
  for (size_t i = 0; i < src.size(); i++)
    if (dst[i] < src[i]) dst[i] = src[i];
}

// A stream (or the host's own work on host memory) as a clock domain.
struct Domain {
  int64_t key = 0;        // the stream's handle (its tracker key)
  bool host_ops = false;  // the host's own operations on tracked host memory ([Note: host accesses])
  int32_t name = 0;       // the engine's name id (reports merge races by the streams' names)
  Clock clock;            // starts covering its own first epoch, 1
  int64_t host_version = -1;
};

}  // namespace hb
