// racecheck/detect/hb_tracker.h: the PyTorch tracker's bookkeeping on the native path, in C++: the
// native log's records (op_log.h) applied to the native engine (hb_engine.h) one by one, as
// feed_apply.py applies them to the Python engine through TorchRaceTracker's methods, which stay
// the reference. Per record kind, the function here and the Python one it follows:
//   OP                  op_items             feed_apply.native_op (TorchRaceTracker._op's rules)
//   ALLOCATED / FREED   allocated / freed    apply_batch's branches ([Note: pending allocations])
//   COLLECTIVE_*        begin/end_collective  collective_begin/_end, _charge
//   STREAM_RECORDED     record_stream        record_stream_at
//   EVENT_* and syncs   event_recorded ...   on_event_record, on_event_wait, on_host_sync
//   HOST_FREED          host_freed           host_freed ([Note: host accesses])
// What only Python knows (the current stream, a c10 stream's handle, an operator's plan, whether
// a host storage can be watched) it asks through Callbacks, each answer kept where it cannot change.
//
// Streams are tracker keys: a CUDA tracker's are cudaStream_t handles (a record's c10 stream id is
// turned into one once); on a CPU tracker a record's stream is the key itself.

#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "hb_engine.h"
#include "op_log.h"

namespace hb {

using racecheck_log::Item;
using racecheck_log::Record;

// What the tracker asks Python (hb_module.cpp answers). A failure throws std::runtime_error with
// the Python exception's "Type: message".
struct Callbacks {
  virtual ~Callbacks() = default;
  virtual int64_t current() = 0;                                             // the current stream's key
  virtual bool stream_key(int64_t stream_id, int32_t device, int64_t* key) = 0;  // false: no stream
  virtual bool op_info(int32_t op, std::string* name, bool* blocks_host) = 0;   // false: not an operator
  virtual bool watch(uint64_t storage) = 0;  // whether the death of this host storage will be logged
  virtual int64_t stack_key(int64_t stack) = 0;
};

struct OpInfo {
  bool known = false;  // asked already
  bool valid = false;  // an operator with a plan
  int32_t name = 0;    // the engine's name id of its plan's name
  bool blocks_host = false;
};

// The counters TorchRaceTracker keeps in `stats` (the engine's are EngineStats).
struct TrackerStats {
  uint64_t adopted = 0, unwatched_host = 0, collectives = 0;
};

class Tracker {
 public:
  Tracker(bool cuda, Callbacks& callbacks);
  void apply(const Record* records, size_t n, const Item* items, size_t n_items);
  void name_stream(int64_t key, const std::string& name);

  Engine engine;
  TrackerStats stats;
  uint64_t ops = 0;                 // operators with tracked accesses
  std::vector<std::string> errors;  // failures (never raised into the program)

 private:
  struct Pending {  // [Note: pending allocations]: the stream, its clock once frozen
    DomainId domain;
    bool frozen = false;
    Clock clock;
  };
  struct Flight {  // a collective being issued (inflight.InFlight)
    OpInfo op;
    int64_t stack = NO_STACK;
    std::vector<Item> items;
    int64_t issuer = 0;
    bool has_stream = false;  // another stream waited during the call: the one it runs on
    int64_t stream = 0;
    bool charged = false;
  };

  void apply_one(const Record& r, const Item* items);
  void apply_event(const Record& r);
  const OpInfo& op(int32_t id);
  bool stream_of(int64_t stream_id, int32_t device, int64_t* key);
  int64_t current();
  DomainId domain(int64_t key);  // TorchRaceTracker.key
  std::string default_name(int64_t key) const;
  void op_items(const OpInfo& op, bool has_stream, int64_t stream, int64_t stack, const Item* its, uint32_t n,
                bool non_blocking);
  AllocId item_allocation(const Item& it, int64_t stack, bool* fresh);
  void host_op(const OpInfo& op, bool has_stream, int64_t stream, int64_t stack, bool non_blocking);
  AllocId host_allocation(uint64_t ptr, uint64_t nbytes, int64_t stack);
  void host_freed(uint64_t ptr);
  AllocId resolve_block(uint64_t ptr, uint64_t nbytes, int64_t stack);
  AllocId adopt_block(uint64_t ptr, uint64_t nbytes, int64_t stack);
  void allocated(const Record& r);
  void begin_collective(const Record& r, const Item* items);
  void charge(Flight& flight);
  void record_stream(const Record& r, const Item* items);
  void event_recorded(int64_t event, int64_t stream);
  void event_waited(int64_t event, int64_t stream);
  void freeze();

  bool cuda_;
  Callbacks& callbacks_;
  DomainId host_;  // the host's own work on host memory ([Note: host accesses])
  std::vector<OpInfo> ops_;
  std::unordered_map<int64_t, std::string> names_;  // stream key -> name (TorchRaceTracker._names)
  std::unordered_map<uint64_t, int64_t> stream_keys_;  // (c10 stream id, device) -> key
  bool current_known_ = false;
  int64_t current_ = 0;
  std::unordered_map<uint64_t, Pending> pending_;
  bool in_flight_ = false;
  Flight flight_;
  std::unordered_map<uint64_t, std::vector<int64_t>> host_touched_;  // host allocation -> stream keys
  std::unordered_map<uint64_t, bool> host_pinned_;                    // tracked host allocations
  std::vector<Touch> touches_;  // one operator's, reused
  std::vector<Item> fresh_;     // host items no stream touched yet, reused
};

}  // namespace hb
