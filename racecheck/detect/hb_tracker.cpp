// racecheck/detect/hb_tracker.cpp: the native log's records applied to the native engine
// (hb_tracker.h says which Python function each part follows).

#include "hb_tracker.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <stdexcept>

namespace hb {

using namespace racecheck_log;

Tracker::Tracker(bool cuda, Callbacks& callbacks) : cuda_(cuda), callbacks_(callbacks) {
  engine.stack_key = [this](int64_t stack) { return callbacks_.stack_key(stack); };
  host_ = engine.add_domain(0, true, "host");  // TorchRaceTracker.__init__ makes it first
}

void Tracker::apply(const Record* records, size_t n, const Item* items, size_t n_items) {
  engine.collect();  // between batches: no slot index is held ([Note: allocation slots])
  current_known_ = false;
  for (size_t i = 0; i < n; i++) {
    const Record& r = records[i];
    try {
      if (static_cast<size_t>(r.first) + r.count > n_items) throw std::runtime_error("IndexError: items out of range");
      apply_one(r, items);
    } catch (const std::exception& exc) {  // never break the program under test
      errors.emplace_back(exc.what());
    }
  }
}

void Tracker::apply_one(const Record& r, const Item* items) {
  switch (r.type) {
    case OP: {
      const OpInfo& info = op(r.op);
      if (!info.valid) return;
      int64_t key = 0;
      bool has_stream = r.stream != NO_STREAM && stream_of(r.stream, r.device_index, &key);
      op_items(info, has_stream, key, r.frame, items + r.first, r.count, r.extra != 0);
      return;
    }
    case KERNEL: {  // a kernel launched below the dispatcher: its items, on the raw stream in `extra`
      const OpInfo& info = op(r.op);
      if (!info.valid) return;
      op_items(info, true, r.extra, r.frame, items + r.first, r.count, false);
      return;
    }
    case ALLOCATED:
      return allocated(r);
    case FREED:  // no operator ever touched a block still pending
      if (pending_.erase(static_cast<uint64_t>(r.extra)) == 0) engine.free(static_cast<uint64_t>(r.extra), {}, r.frame);
      return;
    case COLLECTIVE_BEGIN:
      return begin_collective(r, items);
    case COLLECTIVE_END:
      if (in_flight_) {
        in_flight_ = false;
        if (!flight_.charged) charge(flight_);
      }
      return;
    case STREAM_RECORDED:
      return record_stream(r, items);
    case HOST_FREED:
      return host_freed(static_cast<uint64_t>(r.extra));
    default:
      return apply_event(r);
  }
}

void Tracker::apply_event(const Record& r) {
  switch (r.type) {
    case EVENT_RECORDED:
      return event_recorded(r.extra, r.stream);
    case EVENT_WAITED:
      return event_waited(r.extra, r.stream);
    case EVENT_DELETED:
      return engine.forget_event(r.extra);
    case DEVICE_SYNCED:
      if (!pending_.empty()) freeze();
      return engine.host_sync_all();
    case STREAM_SYNCED:
      if (!pending_.empty()) freeze();
      return engine.host_sync_stream(domain(r.stream));
    case EVENT_SYNCED:
      if (!pending_.empty()) freeze();
      return engine.host_sync_event(r.extra);
    default:
      return;
  }
}

// -- what Python knows -----------------------------------------------------------------------------
const OpInfo& Tracker::op(int32_t id) {
  static const OpInfo none;
  if (id < 0) return none;
  if (static_cast<size_t>(id) >= ops_.size()) ops_.resize(static_cast<size_t>(id) + 1);
  OpInfo& info = ops_[static_cast<size_t>(id)];
  if (!info.known) {
    std::string name;
    bool blocks_host = false;
    info.valid = callbacks_.op_info(id, &name, &blocks_host);
    info.known = true;
    if (info.valid) {
      info.name = engine.name_id(name);
      info.blocks_host = blocks_host;
    }
  }
  return info;
}

bool Tracker::stream_of(int64_t stream_id, int32_t device, int64_t* key) {
  if (!cuda_) {  // a CPU tracker's records carry its keys
    *key = stream_id;
    return true;
  }
  uint64_t packed = static_cast<uint64_t>(stream_id) * 1000003u + static_cast<uint64_t>(device + 1);
  auto it = stream_keys_.find(packed);
  if (it != stream_keys_.end()) {
    *key = it->second;
    return true;
  }
  if (!callbacks_.stream_key(stream_id, device, key)) return false;
  stream_keys_.emplace(packed, *key);
  return true;
}

int64_t Tracker::current() {  // the current stream cannot change while a batch is applied
  if (!current_known_) {
    current_ = callbacks_.current();
    current_known_ = true;
  }
  return current_;
}

namespace {
std::string hex(int64_t key) {  // Python's f"{key:#x}"
  char buf[24];
  auto magnitude = key < 0 ? static_cast<unsigned long long>(-(key + 1)) + 1ull : static_cast<unsigned long long>(key);
  std::snprintf(buf, sizeof buf, "%s0x%llx", key < 0 ? "-" : "", magnitude);
  return buf;
}
}  // namespace

std::string Tracker::default_name(int64_t key) const {
  auto it = names_.find(key);
  if (it != names_.end()) return it->second;
  return key == 0 ? "default" : "stream " + hex(key);
}

DomainId Tracker::domain(int64_t key) {
  DomainId d = engine.domain_of(key);
  return d != NO_DOMAIN ? d : engine.add_domain(key, false, default_name(key));
}

void Tracker::name_stream(int64_t key, const std::string& name) {
  names_[key] = name;
  DomainId d = engine.domain_of(key);
  if (d == NO_DOMAIN)
    engine.add_domain(key, false, name);
  else
    engine.rename(d, name);
}

// -- operators -------------------------------------------------------------------------------------
// feed_apply.native_op: one operator's items as accesses on `stream` (or the current one): a fresh
// block's pending allocation resolved to its size, host memory handed to host_op, the rest checked
// by the engine in one call.
void Tracker::op_items(const OpInfo& info, bool has_stream, int64_t stream, int64_t stack, const Item* its, uint32_t n,
                       bool non_blocking) {
  touches_.clear();
  fresh_.clear();
  bool touches_host = false;
  for (uint32_t i = 0; i < n; i++) {
    const Item& it = its[i];
    if (it.access == RESOLVE) {  // a return that only sizes a fresh block
      if (!pending_.empty() && pending_.count(it.sptr)) resolve_block(it.sptr, it.snbytes, stack);
      continue;
    }
    bool fresh = false;
    AllocId a = item_allocation(it, stack, &fresh);
    if (fresh) {
      fresh_.push_back(it);
      continue;
    }
    if (a == NO_ALLOC) continue;
    if (engine.alloc(a).stream == host_) touches_host = true;
    if (it.nbytes) touches_.push_back(Touch{it.ptr, it.nbytes, it.access == WRITE, a});
  }
  if (touches_.empty()) return;  // nothing on a stream: host memory that no stream touched stays untracked
  if (touches_host || !fresh_.empty()) return host_op(info, has_stream, stream, stack, non_blocking);
  DomainId d = domain(has_stream ? stream : current());
  engine.access_many(d, touches_, info.name, stack);
  if (info.blocks_host) engine.host_sync_stream(d);  // .item(): the host waited for the stream
  ops++;
}

// The allocation an item touches: live, resolved from a pending one, or adopted; NO_ALLOC for an
// empty item the engine does not know; `fresh` for host memory no stream has touched yet.
AllocId Tracker::item_allocation(const Item& it, int64_t stack, bool* fresh) {
  AllocId a = engine.live_at(it.ptr);
  if (a == NO_ALLOC && !pending_.empty() && pending_.count(it.ptr)) a = resolve_block(it.sptr, it.snbytes, stack);
  if (a != NO_ALLOC) return a;
  if (!it.nbytes) return NO_ALLOC;
  a = engine.allocation_at(it.ptr);
  if (a != NO_ALLOC) return a;
  if (cuda_ && it.device != CUDA_DEVICE) {  // host memory
    *fresh = true;
    return NO_ALLOC;
  }
  return adopt_block(it.sptr, it.snbytes, stack);
}

// TorchRaceTracker.host_op ([Note: host accesses], host_accesses.py) over touches_ and fresh_.
void Tracker::host_op(const OpInfo& info, bool has_stream, int64_t stream, int64_t stack, bool non_blocking) {
  bool device = false;
  for (const Touch& t : touches_)
    if (engine.alloc(t.alloc).stream != host_) device = true;
  if (!device) {  // the host's own operation on host memory that streams touch
    engine.access_many(host_, touches_, info.name, stack);
    engine.host_sync_stream(host_);  // done when it returns: later stream work follows it
    return;
  }
  int64_t key = has_stream ? stream : current();
  DomainId d = domain(key);
  bool pinned = true;
  for (const Touch& t : touches_) {
    const Alloc& a = engine.alloc(t.alloc);
    if (a.stream == host_) {
      auto it = host_pinned_.find(a.ptr);
      if (it == host_pinned_.end() || !it->second) pinned = false;
    }
  }
  for (const Item& f : fresh_) {
    if (cuda_ && !f.pinned) {
      pinned = false;  // pageable memory: the copy is synchronous, nothing to track
      continue;
    }
    touches_.push_back(Touch{f.ptr, f.nbytes, f.access == WRITE, host_allocation(f.sptr, f.snbytes, stack)});
  }
  for (const Touch& t : touches_) {
    const Alloc& a = engine.alloc(t.alloc);
    if (a.stream != host_) continue;
    std::vector<int64_t>& keys = host_touched_[a.ptr];
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  engine.access_many(d, touches_, info.name, stack);
  ops++;
  if (!(pinned && non_blocking)) engine.host_sync_stream(d);  // a synchronous copy: the host waited
}

AllocId Tracker::host_allocation(uint64_t ptr, uint64_t nbytes, int64_t stack) {
  AllocId a = engine.allocate(host_, ptr, nbytes, stack, nullptr);
  host_pinned_[ptr] = true;
  if (!callbacks_.watch(ptr)) stats.unwatched_host++;
  return a;
}

void Tracker::host_freed(uint64_t ptr) {
  host_pinned_.erase(ptr);
  std::vector<DomainId> deferred;
  auto it = host_touched_.find(ptr);
  if (it != host_touched_.end()) {
    for (int64_t key : it->second) deferred.push_back(domain(key));
    host_touched_.erase(it);
  }
  engine.free(ptr, deferred, NO_STACK);
}

// -- allocations ([Note: pending allocations]) -----------------------------------------------------
AllocId Tracker::resolve_block(uint64_t ptr, uint64_t nbytes, int64_t stack) {
  auto it = pending_.find(ptr);
  if (it == pending_.end()) return NO_ALLOC;
  Pending found = std::move(it->second);
  pending_.erase(it);
  return engine.allocate(found.domain, ptr, nbytes, stack, found.frozen ? &found.clock : nullptr);
}

AllocId Tracker::adopt_block(uint64_t ptr, uint64_t nbytes, int64_t stack) {
  AllocId a = resolve_block(ptr, nbytes, stack);
  if (a != NO_ALLOC) return a;
  stats.adopted++;
  return engine.allocate(NO_DOMAIN, ptr, nbytes, NO_STACK, nullptr);
}

void Tracker::allocated(const Record& r) {  // the caching allocator handed out the block at `extra`
  int64_t key = 0;
  if (r.stream == NO_STREAM || !stream_of(r.stream, r.device_index, &key)) key = current();
  DomainId d = domain(key);
  auto ptr = static_cast<uint64_t>(r.extra);
  if (engine.live_at(ptr) != NO_ALLOC) engine.retire(ptr);  // free again: that record missed its free
  pending_[ptr] = Pending{d, false, {}};                     // until an operator tells its size
}

void Tracker::freeze() {  // the stream clocks of pending allocations, before a wait or sync grows them
  for (auto& [ptr, p] : pending_)
    if (!p.frozen) {
      p.clock = engine.clock_now(p.domain);
      p.frozen = true;
    }
}

// -- collectives, record_stream, events ------------------------------------------------------------
void Tracker::begin_collective(const Record& r, const Item* items) {
  const OpInfo& info = op(r.op);
  if (!info.valid) return;
  int64_t key = 0;
  bool has_stream = r.stream != NO_STREAM && stream_of(r.stream, r.device_index, &key);
  flight_ = Flight{info, r.frame, std::vector<Item>(items + r.first, items + r.first + r.count),
                   has_stream ? key : current(), false, 0, false};
  in_flight_ = true;
}

void Tracker::charge(Flight& flight) {  // its accesses, on the stream it runs on
  flight.charged = true;
  int64_t stream = flight.has_stream ? flight.stream : flight.issuer;
  op_items(flight.op, true, stream, flight.stack, flight.items.data(), static_cast<uint32_t>(flight.items.size()),
           false);
  stats.collectives++;
}

void Tracker::record_stream(const Record& r, const Item* items) {
  if (!r.count) return;
  int64_t key = 0;
  if (r.extra == NO_STREAM || !stream_of(r.extra, r.device_index, &key)) return;
  AllocId a = engine.allocation_at(items[r.first].ptr);
  if (a != NO_ALLOC) engine.record_stream(engine.alloc(a).ptr, domain(key));
}

void Tracker::event_recorded(int64_t event, int64_t stream) {
  if (in_flight_ && !flight_.charged && flight_.has_stream && flight_.stream == stream)
    charge(flight_);  // the collective's kernel precedes its end event
  engine.record_event(event, domain(stream));
}

void Tracker::event_waited(int64_t event, int64_t stream) {
  if (in_flight_ && stream != flight_.issuer && !flight_.has_stream) {
    flight_.has_stream = true;  // the internal stream the collective runs on
    flight_.stream = stream;
    names_.emplace(stream, "collective stream " + hex(stream));  // setdefault
  }
  if (!pending_.empty()) freeze();
  engine.wait_event(event, domain(stream));
}

}  // namespace hb
