// racecheck/detect/hb_engine.h: the happens-before engine in C++, for the PyTorch tracker's native
// path: vector clocks per stream and for the host, allocations and frees, record_stream holds and
// byte-range access histories, checked at every access and every reuse.
//
// It is engine.py ported rule for rule, and engine.py stays the reference: [Note: clocks] and
// [Note: reuse] there are this engine's rules too, and the same inputs give the same reports, in
// the same order, with the same counts (tests/test_detect_engines.py feeds both the same records).
// What differs is representation only: domains, names and operators are small integers
// (hb_clocks.h), accesses are values with ids ([Note: access identity], hb_shadow.h), and
// generations live in slots ([Note: allocation slots], hb_allocations.h). Python sees reports
// alone, built from report_data() when it asks (hb_module.cpp).
//
// A stack is an opaque id (the native log's stack table; -1 for none). Two races are one report
// when the user frames of their stacks match, which only Python can tell: `stack_key` asks it,
// once per stack id, when a race is reported.

#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "hb_allocations.h"
#include "hb_clocks.h"
#include "hb_shadow.h"

namespace hb {

enum RaceKind : int8_t { REUSE = 0, READ_AFTER_WRITE = 1, WRITE_AFTER_READ = 2, WRITE_AFTER_WRITE = 3 };
constexpr size_t MAX_REPORTS = 64;  // engine.py's: distinct races kept; more are only counted

struct Report {
  RaceKind kind;
  Access earlier;  // the access not ordered before `later`
  Access later;    // the racing access, or the reusing allocation (op "allocation")
  uint64_t count = 1;
};

// An access an operator makes, as access_many takes it: all inside a live allocation.
struct Touch {
  uint64_t ptr, nbytes;
  bool is_write;
  AllocId alloc;
};

// The counters engine.py keeps in `stats` (rare events).
struct EngineStats {
  uint64_t unseen_frees = 0, unknown_frees = 0, reports_dropped = 0, untracked_accesses = 0;
};

class Engine {
 public:
  Engine();

  // -- names and domains -------------------------------------------------------------------
  int32_t name_id(const std::string& name);  // interned: names are compared as ids
  const std::string& name(int32_t id) const { return names_[static_cast<size_t>(id)]; }
  DomainId domain_of(int64_t key) const;  // NO_DOMAIN where none has that key
  DomainId add_domain(int64_t key, bool host_ops, const std::string& name);
  void rename(DomainId d, const std::string& name) { domains_[static_cast<size_t>(d)].name = name_id(name); }
  const std::vector<Domain>& domains() const { return domains_; }

  // -- clocks ([Note: clocks]) -------------------------------------------------------------
  void record_event(int64_t event, DomainId stream) { events_[event] = snapshot(stream); }
  void wait_event(int64_t event, DomainId stream);
  void forget_event(int64_t event) { events_.erase(event); }
  void host_sync_stream(DomainId stream) { host_learns(snapshot(stream)); }
  void host_sync_event(int64_t event);
  void host_sync_all();
  Clock clock_now(DomainId stream) { return now(stream); }

  // -- allocations ([Note: reuse]) ----------------------------------------------------------
  AllocId allocate(DomainId stream, uint64_t ptr, uint64_t nbytes, int64_t stack, const Clock* clock);
  void retire(uint64_t ptr);
  void record_stream(uint64_t ptr, DomainId stream);
  void free(uint64_t ptr, const std::vector<DomainId>& deferred_to, int64_t stack);
  AllocId live_at(uint64_t ptr) const { return allocs_.live_at(ptr); }
  AllocId allocation_at(uint64_t ptr) const { return allocs_.containing(ptr); }
  Alloc& alloc(AllocId id) { return allocs_[id]; }
  const Alloc& alloc(AllocId id) const { return allocs_[id]; }

  // -- accesses -----------------------------------------------------------------------------
  void access_many(DomainId stream, const std::vector<Touch>& touches, int32_t op, int64_t stack);
  // engine.py's access(): one access anywhere, checked against the live allocation holding `ptr`
  // (none: untracked, false) and clamped to it; a read with `record` false is checked only.
  bool access_one(DomainId stream, uint64_t ptr, uint64_t nbytes, bool is_write, int32_t op, int64_t stack,
                  bool record);

  // -- reports and housekeeping -------------------------------------------------------------
  std::function<int64_t(int64_t)> stack_key;  // a stack id's user frames, as an id (Python's)
  const std::vector<Report>& reports() const { return reports_; }
  const EngineStats& stats() const { return stats_; }
  uint64_t accesses() const { return accesses_; }
  size_t slots() const { return allocs_.slots(); }
  int32_t allocation_op() const { return allocation_op_; }
  void collect();  // [Note: allocation slots]: only between batches

 private:
  Clock& now(DomainId d);
  Clock snapshot(DomainId d);
  void host_learns(const Clock& snap);
  void retire_alloc(AllocId id);
  void check_reuse(AllocId id, DomainId d, const Clock& clock);
  bool kept_at_reuse(const Access& acc, DomainId d, const Clock& clock, std::vector<Access>& racing) const;
  void drop_from_block(uint64_t ptr, uint64_t end, const std::vector<uint64_t>& dropped);
  void access(DomainId d, const Clock& clock, const Touch& t, int32_t op, int64_t stack, bool record = true);
  void report(RaceKind kind, const Access& earlier, const Access& later);
  Access make_access(DomainId d, int64_t epoch, bool is_write, int32_t op, AllocId alloc, int64_t stack) {
    return Access{next_access_++, epoch, stack, alloc, d, op, is_write};
  }
  int64_t key_of(int64_t stack);

  std::vector<std::string> names_;
  std::unordered_map<std::string, int32_t> name_ids_;
  std::vector<Domain> domains_;
  std::unordered_map<int64_t, DomainId> by_key_;
  Clock host_;  // what the host knows complete
  int64_t host_version_ = 0;
  std::unordered_map<int64_t, Clock> events_;  // event -> clock snapshot
  Allocations allocs_;
  Shadow shadow_;
  std::vector<Report> reports_;
  std::vector<std::vector<int64_t>> report_keys_;
  std::unordered_map<int64_t, int64_t> stack_keys_;
  EngineStats stats_;
  uint64_t accesses_ = 0;
  uint64_t next_serial_ = 1;
  uint64_t next_access_ = 1;
  int32_t allocation_op_ = 0;
};

}  // namespace hb
