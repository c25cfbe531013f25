// racecheck/detect/op_log.cpp: the native recording path of racecheck's PyTorch tracker.
//
// An observer on PyTorch's RecordFunction (the C++ callbacks the profiler uses) records, for every
// operator the dispatcher runs, which bytes of which storages it reads and writes, the stream it
// was issued on and a compact identifier of the Python call stack, into one ordered log, without
// entering Python. The tracker (torch_tracker.py, native mode) drains the log in batches before it
// handles any CUDA trace callback, event or report, so the happens-before engine sees operators,
// allocations and synchronizations in the order the program issued them.
//
// Which arguments an operator reads and writes is not decided here: the first time an operator is
// seen, Python compiles its plan from the schema (dispatch.py, the rules the Python path uses) and
// hands back positions; after that a call only applies them.
//
// Which calls are recorded mirrors what a TorchDispatchMode sees (the Python path):
// - an operator whose CompositeImplicitAutograd kernel decomposes it ("transparent") records
//   nothing and its callees are recorded in its place;
// - the calls a recorded operator makes from inside its kernel (temporaries, the local tensors of
//   a tensor subclass, ProcessGroupNCCL's internal copies) are its own: RecordFunction is off on
//   the thread while it runs, so they are not even observed ([Note: callees unobserved]);
// - calls made while the tracker itself runs (its planner, its drain called from here) neither.
//
// Python stacks: an identifier per distinct chain of (code object, bytecode offset), interned
// here; Python turns one into frames only for an access that ends up in a report.
//
// On CUDA the log also takes CUDA's trace events (allocations, frees, event record and wait, and
// stream, event and device synchronizations: what torch.cuda._gpu_trace's callbacks report to
// Python) through an interpreter of its own installed as c10's GPU trace for the time it records,
// so none of them enters Python either. Python drains the log when it holds DRAIN_AT records,
// when a report is asked for and when recording stops; a drain hands it the bytes of the record
// and item arrays, whose fixed layouts (op_log.h) feed_apply.py and the native engine read.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "op_log.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <ATen/record_function.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/core/impl/GPUTrace.h>
#include <c10/core/impl/PyInterpreter.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

using namespace racecheck_log;  // the record and item layouts (op_log.h)

// What a call of one operator overload records (the plan's kind, see dispatch.py's OpKind).
enum Kind : int8_t { UNPLANNED = -1, PLAIN = 0, SKIP = 1, TRANSPARENT = 2, COLLECTIVE = 3, RECORD_STREAM = 4 };
constexpr size_t DRAIN_AT = 4096;  // records that make the log call Python's drain
// Calls of its own that one call of an operator must have been seen making before RecordFunction
// is turned off around its calls ([Note: callees unobserved]): turning it off and on costs about as
// much as observing four callees. Counted by callgrind on torch 2.13's CPU build (5 steps of the
// benchmark's FSDP2-AdamW step at width 32 and AdamW MLP at width 64, this file built with each
// value in turn), 4 gave the fewest instructions of 1 (switching at the first callee), 2, 4, 6 and
// 8: 0.43 M and 0.19 M a step fewer than 1, of the 9.4 M and 1.7 M the native path adds.
constexpr uint32_t SWITCH_AT = 4;

constexpr int MAX_WALK = 96;              // frames walked at most (stacks.py's MAX_WALK)

struct Plan {
  Kind kind = UNPLANNED;
  std::vector<std::pair<int, int8_t>> inputs;  // (argument position, READ or WRITE); a position may repeat
  int8_t returns = -1;                         // -1: returns not recorded; else their Access
  int non_blocking = -1;                       // position of a `non_blocking` argument, if any
};

Record make_record(int8_t type, int32_t op, int64_t stream, int32_t device_index, int64_t frame, uint32_t first,
                   uint32_t count, int64_t extra) {
  Record r{};  // the padding zeroed: the bytes Python gets are all defined
  r.type = type;
  r.op = op;
  r.stream = stream;
  r.device_index = device_index;
  r.frame = frame;
  r.first = first;
  r.count = count;
  r.extra = extra;
  return r;
}

struct Frames {
  std::vector<std::pair<PyObject*, int>> chain;  // (code object, strong reference; bytecode offset)
};

// -- state (guarded by mu, except the thread-locals and the flags) ------------------------------
std::mutex mu;
std::vector<Record> records;
std::vector<Item> items;
struct OpName {
  std::string name, overload;
  Plan plan;
  int32_t id = 0;
  // The most calls one call of it was seen making on its own thread, nested ones included, while
  // RecordFunction stayed on ([Note: callees unobserved]); learnt while it runs, hence mutable on
  // an otherwise fixed entry.
  mutable std::atomic<uint32_t> most_callees{0};
};
// schema name pointer -> (overload name pointer, op) of each overload seen; ops never move
std::unordered_map<const char*, std::vector<std::pair<const char*, OpName*>>> op_ids;
std::vector<std::unique_ptr<OpName>> ops;
std::unordered_map<std::string, OpName*> kernel_ops;  // kernel name -> its pseudo-operator
std::unordered_map<uint64_t, int64_t> frame_ids;  // chain hash -> frame id
std::vector<Frames> frames;
// The storages seen over the host memory at one start address: one, or several where storages
// alias the same bytes (torch.from_dlpack of a pinned buffer, or of a slice at its start, makes a
// second storage, which keeps the first alive). The memory there is freed when the last dies.
using HostStorages = std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>>;
std::unordered_map<uint64_t, HostStorages> recent_host;  // seen this batch
// seen in the batch drained last: Python asks to watch them while it applies that batch
std::unordered_map<uint64_t, HostStorages> drained_host;
std::unordered_map<uint64_t, HostStorages> watched_host;  // tracked by Python
// start -> end of the pinned host memory recorded calls touched, merged where ranges meet: a
// superset of the host memory either engine may track ([Note: the host's own calls])
std::map<uint64_t, uint64_t> pinned_ranges;
// The tracker (start()'s `owner`, 0: none given) the host memory state above belongs to: kept when
// the same tracker starts the log again, as it keeps its engine, which may track that memory still.
uint64_t host_owner = 0;
std::atomic<bool> active{false};
// false: the hooks stay installed and record nothing (record(False): the native path's floor, what
// PyTorch's hooks cost alone, for benchmarks)
std::atomic<bool> recording{true};
bool with_results = true;  // whether RecordFunction gives the calls' results (start()'s `results`)
std::atomic<bool> watching{false};
// -1: CUDA is asked whether host memory is pinned; 0 or 1: the answer for all of it (answer_pinned:
// tests on a CPU build, where no memory is pinned, stand in pinned buffers)
std::atomic<int8_t> pinned_answer{-1};
bool cuda_mode = false;  // streams from CUDA's current stream (else Python's)
bool with_stacks = true;
// Where recording's time goes (costs()): the clock is read a few times per call, tens of
// nanoseconds against the microseconds a call costs, so the counts stay on.
struct Cost {
  std::atomic<uint64_t> calls{0}, ns{0};
  void add_ns(uint64_t spent) {
    calls.fetch_add(1, std::memory_order_relaxed);
    ns.fetch_add(spent, std::memory_order_relaxed);
  }
  void add(uint64_t since) { add_ns(now_ns() - since); }
  static uint64_t now_ns() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }
};
Cost record_cost;  // an operator's start and end callbacks, less the drains they call
Cost gil_cost;     // taking the GIL back to read the stack
Cost walk_cost;    // walking and interning the stack
Cost trace_cost;   // CUDA's trace callbacks that log an event (the stacks of frees among them)
Cost switch_cost;  // turning RecordFunction off and on around a call's callees ([Note: callees unobserved])
// Adds the time from its making to its end to a Cost.
struct Timed {
  Cost& cost;
  uint64_t t0 = Cost::now_ns();
  explicit Timed(Cost& c) : cost(c) {}
  ~Timed() { cost.add(t0); }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;
};
std::atomic<uint64_t> frames_walked{0};
// host items CUDA was asked whether they are pinned ([Note: the host's own calls])
std::atomic<uint64_t> pinned_questions{0};
// The calls RecordFunction showed the log while it recorded, by what became of them (costs()).
enum Seen { SEEN_CALLEE = 0, SEEN_TRANSPARENT = 1, SEEN_SKIP = 2, SEEN_RECORDED = 3, SEEN_KINDS = 4 };
std::atomic<uint64_t> seen[SEEN_KINDS];
void count_seen(Seen what) { seen[what].fetch_add(1, std::memory_order_relaxed); }
PyObject* planner = nullptr;  // Python: (name, overload) -> plan tuple
PyObject* drainer = nullptr;  // Python: drain the log (called at DRAIN_AT records)
bool draining = false;        // under mu: a drain call is on its way
std::string planner_error;
at::CallbackHandle handle = 0;
// What the log keeps per thread (`inside`, the operator cache, the call being recorded) is one
// thread-local, PerThread, defined with the call below: a callback looks it up once and passes it
// on, where each thread-local of a shared library costs a lookup of its own at every use. This
// gives the calling thread's `inside` to the tracker's own calls (planner, drain) defined before it.
int& this_thread_inside();

// Whether Python can no longer be entered (a tracker left recording at interpreter exit).
bool python_gone() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// -- planning ------------------------------------------------------------------------------------
OpName* find_locked(const char* name, const char* overload) {
  auto it = op_ids.find(name);
  if (it == op_ids.end()) return nullptr;
  for (const auto& [o, op] : it->second)
    if (o == overload) return op;
  return nullptr;
}

// Python's plan for a new overload (under the GIL): `entry`'s plan stays TRANSPARENT where the
// planner fails, and the reason is kept for planner_error().
void read_plan(OpName& entry) {
  Plan& plan = entry.plan;
  PyObject* got = PyObject_CallFunction(planner, "ss", entry.name.c_str(), entry.overload.c_str());
  if (got == nullptr) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject* s = v ? PyObject_Str(v) : nullptr;
    planner_error = entry.name + ": " + (s ? PyUnicode_AsUTF8(s) : "error");
    Py_XDECREF(s);
    Py_XDECREF(t);
    Py_XDECREF(v);
    Py_XDECREF(tb);
  } else {
    // (kind, ((position, access), ...), returns, non_blocking position)
    int kind = 0, returns = -1, nb = -1;
    PyObject* inputs = nullptr;
    if (PyArg_ParseTuple(got, "iOii", &kind, &inputs, &returns, &nb)) {
      plan.kind = static_cast<Kind>(kind);
      plan.returns = static_cast<int8_t>(returns);
      plan.non_blocking = nb;
      Py_ssize_t n = PySequence_Size(inputs);
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject* pair = PySequence_GetItem(inputs, i);
        int pos = 0, acc = 0;
        if (pair && PyArg_ParseTuple(pair, "ii", &pos, &acc)) plan.inputs.emplace_back(pos, acc);
        Py_XDECREF(pair);
      }
    }
    PyErr_Clear();
    Py_DECREF(got);
  }
}

// The overload named (name, overload) from the table, planned by Python at first sight (under the
// GIL, with mu released meanwhile).
OpName* op_of_locked(const char* name, const char* overload) {
  {
    std::lock_guard<std::mutex> g(mu);
    if (OpName* op = find_locked(name, overload)) return op;
  }
  auto entry = std::make_unique<OpName>();
  entry->name = name ? name : "";
  entry->overload = overload ? overload : "";
  entry->plan.kind = TRANSPARENT;  // a name Python cannot plan: record nothing, hide nothing
  if (python_gone()) return nullptr;
  int& inside = this_thread_inside();
  inside++;  // what the planner runs is the tracker's own
  {
    at::RecordFunctionGuard unobserved(false);  // and unobserved ([Note: callees unobserved])
    PyGILState_STATE gil = PyGILState_Ensure();
    if (planner != nullptr) read_plan(*entry);
    PyGILState_Release(gil);
  }
  inside--;
  std::lock_guard<std::mutex> g(mu);
  if (OpName* op = find_locked(name, overload)) return op;  // planned meanwhile by another thread
  entry->id = static_cast<int32_t>(ops.size());
  OpName* op = entry.get();
  ops.push_back(std::move(entry));
  op_ids[name].emplace_back(overload, op);
  return op;
}

// A thread's overloads seen lately, by their name pointers: what find_locked would answer, without
// mu or a hash of the name on every call. Direct-mapped (a collision replaces the entry, and the
// next call of the one replaced takes the locked path once); the OpName objects it points to never
// move or die while the module is loaded, and a name pair keeps its OpName, so an entry is never
// stale.
struct CachedOp {
  const char* name;
  const char* overload;
  OpName* op;
};
constexpr int OP_CACHE_BITS = 8;
using OpCache = CachedOp[1 << OP_CACHE_BITS];  // zeroed: matches no call (a name is never null)

CachedOp& cached_op(OpCache& cache, const char* name, const char* overload) {
  // Fibonacci hashing of both pointers: their low bits are alignment, their high bits shared.
  uint64_t h = reinterpret_cast<uint64_t>(name) ^ (reinterpret_cast<uint64_t>(overload) << 1);
  return cache[(h * 0x9E3779B97F4A7C15ull) >> (64 - OP_CACHE_BITS)];
}

// A RecordFunction named by a string, not by an operator's schema (autograd's
// "autograd::engine::evaluate_function: ...", a collective's "nccl:all_reduce"): no operator,
// hence nothing to record. Its name lives in the RecordFunction itself, a new pointer every call,
// so it must not reach the table, which would grow by one entry, and ask the planner, each call.
const OpName unnamed_call{"", "", Plan{TRANSPARENT}};

// The overload behind `fn` (its name pointers identify it), planned by Python at first sight.
const OpName* op_of(OpCache& cache, const at::RecordFunction& fn) {
  const char* name = fn.name();
  const char* overload = fn.overload_name();
  CachedOp& slot = cached_op(cache, name, overload);
  if (slot.name == name && slot.overload == overload) return slot.op;
  if (!fn.operator_name().has_value()) return &unnamed_call;  // rare: a miss of an operator's call
  OpName* op = op_of_locked(name, overload);
  if (op != nullptr) slot = CachedOp{name, overload, op};
  return op;
}

// -- stacks --------------------------------------------------------------------------------------
// The calling thread's Python stack as an interned id (-1: no Python frame, e.g. autograd's
// device threads). The thread may have released the GIL around the operator: take it back.
int64_t stack_id() {
  if (!with_stacks || python_gone() || PyGILState_GetThisThreadState() == nullptr) return -1;
  uint64_t t0 = Cost::now_ns();
  PyGILState_STATE gil = PyGILState_Ensure();
  uint64_t t1 = Cost::now_ns();
  gil_cost.add_ns(t1 - t0);
  std::pair<PyCodeObject*, int> chain[MAX_WALK];
  int n = 0;
  uint64_t h = 1469598103934665603ull;
  PyFrameObject* frame = PyThreadState_GetFrame(PyThreadState_Get());  // new reference
  while (frame != nullptr && n < MAX_WALK) {
    PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
    int lasti = PyFrame_GetLasti(frame);
    chain[n++] = {code, lasti};
    h = (h ^ reinterpret_cast<uint64_t>(code)) * 1099511628211ull;
    h = (h ^ static_cast<uint64_t>(lasti)) * 1099511628211ull;
    PyFrameObject* back = PyFrame_GetBack(frame);  // new reference
    Py_DECREF(frame);
    frame = back;
  }
  Py_XDECREF(frame);
  int64_t id = -1;
  {
    std::lock_guard<std::mutex> g(mu);
    auto it = frame_ids.find(h);
    if (it != frame_ids.end()) {
      id = it->second;
    } else {
      Frames f;
      for (int i = 0; i < n; i++) {
        Py_INCREF(chain[i].first);
        f.chain.emplace_back(reinterpret_cast<PyObject*>(chain[i].first), chain[i].second);
      }
      id = static_cast<int64_t>(frames.size());
      frames.push_back(std::move(f));
      frame_ids.emplace(h, id);
    }
  }
  for (int i = 0; i < n; i++) Py_DECREF(chain[i].first);
  frames_walked.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
  walk_cost.add(t1);
  PyGILState_Release(gil);
  return id;
}

// -- tensors -------------------------------------------------------------------------------------
struct Pending {  // one call between its start and end callbacks
  const OpName* op = nullptr;
  Kind kind;
  int64_t stream = NO_STREAM;
  int32_t device_index = -1;
  int64_t frame = -1;
  int64_t non_blocking = 0;
  std::vector<Item> items;
  // Its host items on CUDA, with their storages, held until the call's end: whether each is pinned
  // is asked at its record or at its end, only where the answer may matter ([Note: the host's own
  // calls]). A host storage the call itself let go (`x.set_(...)`) dies there, after the call's
  // record, where the pinned-memory allocator's events for it are logged.
  struct Host {
    size_t index;  // into items
    c10::Storage storage;
    bool asked = false;
    bool tracked = false;  // at the call's end: its memory overlaps pinned memory a record touched
  };
  std::vector<Host> host;

  void reset(const OpName* call_op) {  // for a new call: the vectors keep their capacity
    op = call_op;
    kind = call_op->plan.kind;
    stream = NO_STREAM;
    device_index = -1;
    frame = -1;
    non_blocking = 0;
    items.clear();
    host.clear();
  }
};

// Whether host memory [start, end) overlaps pinned memory a recorded call touched: memory either
// engine may track by the time a record appended now is applied. Under mu.
bool host_may_be_tracked_locked(uint64_t start, uint64_t end) {
  auto after = pinned_ranges.upper_bound(start);
  if (after != pinned_ranges.begin() && std::prev(after)->second > start) return true;
  return after != pinned_ranges.end() && after->first < end;
}

// The end of a host item's storage (an empty one: one byte, so that it has a place among ranges).
uint64_t storage_end(const Item& it) { return it.sptr + std::max<uint64_t>(it.snbytes, 1); }

// [start, end) into pinned_ranges, merged with the ranges it meets. Under mu.
void add_pinned_range_locked(uint64_t start, uint64_t end) {
  auto at = pinned_ranges.upper_bound(start);
  if (at != pinned_ranges.begin()) {
    auto before = std::prev(at);
    if (before->second >= end) return;  // within a range already there (a buffer seen again)
    if (before->second >= start) {
      start = before->first;
      at = pinned_ranges.erase(before);
    }
  }
  while (at != pinned_ranges.end() && at->first <= end) {
    end = std::max(end, at->second);
    at = pinned_ranges.erase(at);
  }
  pinned_ranges.emplace(start, end);
}

// Asks CUDA whether a host item's memory is pinned (PyTorch's CUDA hooks: about 1.2 us a question
// on an H100, reports/gpu/pinned_query_h100.log), unless the call already asked about its storage
// (an in-place operator's argument and result, `buf.add_(1)`).
void ask_pinned(Pending& p, Item& it) {
  for (const Pending::Host& h : p.host) {
    const Item& seen = p.items[h.index];
    if (h.asked && seen.sptr == it.sptr) {
      it.pinned = seen.pinned;
      return;
    }
  }
  pinned_questions.fetch_add(1, std::memory_order_relaxed);
  int8_t answer = pinned_answer.load(std::memory_order_relaxed);
  it.pinned = answer >= 0 ? answer
                          : at::detail::getCUDAHooks().isPinnedPtr(reinterpret_cast<const void*>(it.sptr)) ? 1 : 0;
}

// At a call's end, its host items not asked yet whose memory overlaps pinned memory a record
// touched are asked now (pinned_ranges only grows while the log records: memory that overlapped
// it at the call's start still does); whether one of them is pinned. One look under the lock
// for them all, the questions after it.
bool ask_tracked(Pending& p) {
  if (p.host.empty()) return false;
  {
    std::lock_guard<std::mutex> g(mu);
    for (Pending::Host& h : p.host) {
      const Item& it = p.items[h.index];
      h.tracked = !h.asked && host_may_be_tracked_locked(it.sptr, storage_end(it));
    }
  }
  bool pinned = false;
  for (Pending::Host& h : p.host)
    if (h.tracked) {
      Item& it = p.items[h.index];
      ask_pinned(p, it);
      h.asked = true;
      pinned = pinned || it.pinned;
    }
  return pinned;
}

void add_tensor(Pending& p, const at::Tensor& t, int8_t access) {
  if (!t.defined() || !t.has_storage()) return;  // undefined, or a wrapper subclass (DTensor)
  // A Python number the dispatcher wrapped as a 0-dim CPU tensor (`buf.add_(5.0)`) is an argument,
  // not memory of the program's: a TorchDispatchMode sees the number itself, and treating it as
  // host memory would make the operator a synchronous host copy, which orders the stream's work
  // before everything the host issues next and hides races after it.
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) return;
  const c10::Storage& storage = t.storage();
  const char* base = static_cast<const char*>(storage.data());
  if (base == nullptr) return;  // meta and fake tensors
  int64_t n = t.numel();
  uint64_t itemsize = t.dtype().itemsize();
  uint64_t nbytes = 0;
  if (n > 0) {
    if (t.is_contiguous()) {
      nbytes = static_cast<uint64_t>(n) * itemsize;
    } else {  // from the first to the last element (dispatch.py's byte_range)
      int64_t span = 1;
      auto sizes = t.sizes();
      auto strides = t.strides();
      for (size_t d = 0; d < sizes.size(); d++)
        if (sizes[d] > 1) span += (sizes[d] - 1) * strides[d];
      nbytes = static_cast<uint64_t>(span) * itemsize;
    }
  }
  Item it{};
  it.ptr = reinterpret_cast<uint64_t>(base) + static_cast<uint64_t>(t.storage_offset()) * itemsize;
  it.nbytes = nbytes;
  it.sptr = reinterpret_cast<uint64_t>(base);
  it.snbytes = storage.nbytes();
  it.access = access;
  c10::DeviceType type = t.device().type();
  it.device = type == c10::DeviceType::CPU ? 0 : (type == c10::DeviceType::CUDA ? 1 : 2);
  it.pinned = 0;
  if (type == c10::DeviceType::CUDA && p.device_index < 0) {
    p.device_index = t.device().index();
  }
  if (cuda_mode && it.device == 0) {  // [Note: the host's own calls]: asked later, where it may matter
    p.items.push_back(it);
    p.host.push_back({p.items.size() - 1, storage});
    return;
  }
  p.items.push_back(it);
}

// A list's elements are read in place (toListRef), with no copy of the list nor a count taken of
// its tensors: Tensor[] (a foreach operator's), Tensor?[] and Tensor[][] (c10d's allgather).
void add_value(Pending& p, const c10::IValue& v, int8_t access) {
  if (v.isTensor()) {
    add_tensor(p, v.toTensor(), access);
    return;
  }
  if (!v.isList()) return;
  for (const c10::IValue& e : v.toListRef()) {
    if (e.isTensor()) {
      add_tensor(p, e.toTensor(), access);
    } else if (e.isList()) {
      for (const c10::IValue& t : e.toListRef())
        if (t.isTensor()) add_tensor(p, t.toTensor(), access);
    }
  }
}

void set_stream(Pending& p) {
  if (!cuda_mode || p.device_index < 0) return;
  c10::Device device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(p.device_index));
  p.stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device).id();
}

// Weak pointers to storages that the log lets go of under mu, dropped once mu is let go (a
// ReleaseAfterUnlock declared before the lock): where a storage's destructor releases the Python
// object the storage kept (PyObjectSlot's destructor on older torch releases; not on 2.11 or
// 2.13), the last weak pointer to a dead storage runs that destructor, which takes the GIL, and a
// thread holding the GIL may be waiting for mu.
thread_local HostStorages released_storages;

struct ReleaseAfterUnlock {
  ReleaseAfterUnlock() = default;
  ReleaseAfterUnlock(const ReleaseAfterUnlock&) = delete;
  ReleaseAfterUnlock& operator=(const ReleaseAfterUnlock&) = delete;
  // Taken out of released_storages first: what a release runs (Python, which may call operators
  // that the log records) may let go of storages again. Its calls are the log's own, unobserved.
  ~ReleaseAfterUnlock() {
    if (released_storages.empty()) return;
    HostStorages doomed;
    doomed.swap(released_storages);
    int& inside = this_thread_inside();
    inside++;
    {
      at::RecordFunctionGuard unobserved(false);
      doomed.clear();
    }
    inside--;
  }
};

bool all_dead(const HostStorages& seen) {
  return std::all_of(seen.begin(), seen.end(), [](const auto& weak) { return weak.expired(); });
}

// The dead storages of `seen` let go of (released_storages). Under mu.
void drop_dead_locked(HostStorages& seen) {
  for (auto it = seen.begin(); it != seen.end();) {
    if (it->expired()) {
      released_storages.push_back(std::move(*it));
      it = seen.erase(it);
    } else {
      ++it;
    }
  }
}

// The storages of `seen`, let go of (released_storages). Under mu.
void release_locked(HostStorages& seen) {
  for (auto& weak : seen) released_storages.push_back(std::move(weak));
  seen.clear();
}

// The storages of `host`, let go of (released_storages). Under mu.
void forget_host_locked(std::unordered_map<uint64_t, HostStorages>& host) {
  for (auto& [start, seen] : host) release_locked(seen);
  host.clear();
}

// The dead storages seen at `start` in this batch and the batch Python applies, let go of. Under mu.
void drop_dead_seen_locked(uint64_t start) {
  for (auto* batch : {&recent_host, &drained_host}) {
    auto at = batch->find(start);
    if (at != batch->end()) drop_dead_locked(at->second);
  }
}

// A HOST_FREED record: the host memory at `start`, which Python may track, was freed. Under mu.
void log_host_freed_locked(uint64_t start) {
  records.push_back(make_record(HOST_FREED, -1, NO_STREAM, -1, -1, 0, 0, static_cast<int64_t>(start)));
}

// The storage `weak` points to among the storages `seen` at its address, where it is not yet; the
// dead ones dropped (a weak pointer keeps its storage's object, so the same target is the same
// storage). Under mu: no storage is held, so none can die here.
void add_storage_locked(HostStorages& seen, const c10::weak_intrusive_ptr<c10::StorageImpl>& weak) {
  drop_dead_locked(seen);
  if (std::find(seen.begin(), seen.end(), weak) == seen.end()) seen.push_back(weak);
}

// Host memory Python tracks (pinned buffers) whose storages all died since the last check: a
// record each, before the record being appended, so a free precedes the reuse of its bytes; an
// alias that died before the storage it aliases frees nothing. The dead storages seen there in
// this batch and the one Python applies go too, so the free is logged once (freed_since_seen_locked).
// Under mu.
void host_frees_locked() {
  for (auto it = watched_host.begin(); it != watched_host.end();) {
    if (all_dead(it->second)) {
      log_host_freed_locked(it->first);
      drop_dead_seen_locked(it->first);
      release_locked(it->second);
      it = watched_host.erase(it);
    } else {
      ++it;
    }
  }
}

// Whether the memory at `start` was freed since storages were seen there: every one seen in this
// batch or the batch Python applies died (watched ones all dead were freed by host_frees_locked,
// which runs first), so a storage there now is a new allocation of the same block. Python may
// track the old one from a record before (a staging buffer uploaded, dropped and allocated again
// in one batch): its free goes into the log before the new storage's first record, once, as the
// dead storages are let go of here. An empty list (its dead let go of already) is no storage seen.
// Under mu.
bool freed_since_seen_locked(uint64_t start) {
  bool seen = false;
  for (auto* host : {&recent_host, &drained_host}) {
    auto at = host->find(start);
    if (at == host->end() || at->second.empty()) continue;
    if (!all_dead(at->second)) return false;
    seen = true;
  }
  if (!seen) return false;
  drop_dead_seen_locked(start);
  return true;
}

void append(int8_t type, Pending& p, int64_t extra) {
  for (Pending::Host& h : p.host)  // the record says of each host item whether it is pinned
    if (!h.asked) {
      ask_pinned(p, p.items[h.index]);
      h.asked = true;
    }
  ReleaseAfterUnlock release;
  std::lock_guard<std::mutex> g(mu);
  if (!watched_host.empty()) host_frees_locked();
  // Its pinned host memory, which the record may make tracked: watchable by Python from the batch
  // that holds the record on, and asked about from now on ([Note: the host's own calls]); a
  // storage over memory Python already watches is watched with the others there, so the memory
  // is freed only when they all die. Under the lock that appends the record, so no drain comes
  // between the two. The storages stay held until the call's end (Pending::host): one dying under
  // this lock would report its free to the log, which takes the lock again.
  for (const Pending::Host& h : p.host) {
    const Item& it = p.items[h.index];
    if (!it.pinned) continue;
    add_pinned_range_locked(it.sptr, storage_end(it));
    if (watching.load(std::memory_order_relaxed)) {
      if (freed_since_seen_locked(it.sptr)) log_host_freed_locked(it.sptr);
      c10::weak_intrusive_ptr<c10::StorageImpl> weak(h.storage.getWeakStorageImpl());
      add_storage_locked(recent_host[it.sptr], weak);
      auto watched = watched_host.find(it.sptr);
      if (watched != watched_host.end()) add_storage_locked(watched->second, weak);
    }
  }
  records.push_back(make_record(type, p.op->id, p.stream, p.device_index, p.frame, static_cast<uint32_t>(items.size()),
                                static_cast<uint32_t>(p.items.size()), extra));
  items.insert(items.end(), p.items.begin(), p.items.end());
}

void append_event(int8_t type, int64_t stream, int32_t device_index, int64_t frame, int64_t extra) {
  std::lock_guard<std::mutex> g(mu);
  records.push_back(make_record(type, -1, stream, device_index, frame, 0, 0, extra));
}

// At an operator's end (never inside the allocator, which may hold its lock while it reports):
// a full log is handed to Python.
void drain_if_full() {
  if (python_gone()) return;
  {
    std::lock_guard<std::mutex> g(mu);
    if (records.size() < DRAIN_AT || draining || drainer == nullptr) return;
    draining = true;
  }
  int& inside = this_thread_inside();
  inside++;
  at::RecordFunctionGuard unobserved(false);  // the drain's own calls ([Note: callees unobserved])
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* got = PyObject_CallNoArgs(drainer);
  if (got == nullptr) PyErr_Clear();  // the drain records its own errors
  Py_XDECREF(got);
  PyGILState_Release(gil);
  inside--;
  std::lock_guard<std::mutex> g(mu);
  draining = false;
}

int64_t current_stream(int32_t* device_index) {
  const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  c10::Device device = cuda->getDevice();
  *device_index = device.index();
  return cuda->getStream(device).id();
}

// -- CUDA's trace events -------------------------------------------------------------------------
// The interpreter c10 calls for them (c10/core/impl/GPUTrace.h) while the log records on CUDA.
// Only its trace_gpu_* methods are ever called through the GPU trace; the others exist because
// the interface declares them, and are never reached.
[[noreturn]] void unreachable(const char* what) {
  TORCH_INTERNAL_ASSERT(false, "racecheck's GPU trace interpreter does not implement ", what);
}

struct TraceVTable final : c10::impl::PyInterpreterVTable {
  std::string name() const override { return "racecheck op log (GPU trace)"; }
  void incref(PyObject*) const override { unreachable("incref"); }
  void decref(PyObject*) const override { unreachable("decref"); }
  bool try_incref(const c10::impl::PyObjectSlot&) const override { unreachable("try_incref"); }
  size_t refcnt(PyObject*) const override { unreachable("refcnt"); }
  c10::intrusive_ptr<c10::TensorImpl> detach(const c10::TensorImpl*) const override { unreachable("detach"); }
  void dispatch(const c10::OperatorHandle&, torch::jit::Stack*) const override { unreachable("dispatch"); }
  void reportErrorCallback(PyObject*, c10::DispatchKey) const override { unreachable("reportErrorCallback"); }
  void python_op_registration_trampoline(const c10::OperatorHandle&, c10::DispatchKey, c10::DispatchKeySet,
                                         torch::jit::Stack*, bool, bool) const override {
    unreachable("python_op_registration_trampoline");
  }
  void throw_abstract_impl_not_imported_error(std::string, const char*, const char*) const override {
    unreachable("throw_abstract_impl_not_imported_error");
  }
  void python_dispatcher(const c10::OperatorHandle&, c10::DispatchKeySet, torch::jit::Stack*) const override {
    unreachable("python_dispatcher");
  }
  bool is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override { unreachable("is_contiguous"); }
  c10::SymBool sym_is_contiguous(const c10::TensorImpl*, at::MemoryFormat) const override {
    unreachable("sym_is_contiguous");
  }
  bool is_strides_like(const c10::TensorImpl*, at::MemoryFormat) const override { unreachable("is_strides_like"); }
  bool is_non_overlapping_and_dense(const c10::TensorImpl*) const override { unreachable("is_non_overlapping"); }
  c10::Device device(const c10::TensorImpl*) const override { unreachable("device"); }
  int64_t dim(const c10::TensorImpl*) const override { unreachable("dim"); }
  c10::IntArrayRef strides(const c10::TensorImpl*) const override { unreachable("strides"); }
  c10::IntArrayRef sizes(const c10::TensorImpl*) const override { unreachable("sizes"); }
  c10::SymIntArrayRef sym_sizes(const c10::TensorImpl*) const override { unreachable("sym_sizes"); }
  c10::Layout layout(const c10::TensorImpl*) const override { unreachable("layout"); }
  int64_t numel(const c10::TensorImpl*) const override { unreachable("numel"); }
  c10::SymInt sym_numel(const c10::TensorImpl*) const override { unreachable("sym_numel"); }
  c10::SymIntArrayRef sym_strides(const c10::TensorImpl*) const override { unreachable("sym_strides"); }
  c10::SymInt sym_storage_offset(const c10::TensorImpl*) const override { unreachable("sym_storage_offset"); }
  void reset_backward_hooks(const c10::TensorImpl*) const override { unreachable("reset_backward_hooks"); }

  void trace_gpu_event_creation(c10::DeviceType, uintptr_t) const override {}
  void trace_gpu_stream_creation(c10::DeviceType, uintptr_t) const override {}
  static bool recorded(c10::DeviceType type) {
    return type == c10::DeviceType::CUDA && recording.load(std::memory_order_relaxed);
  }
  void trace_gpu_event_deletion(c10::DeviceType type, uintptr_t event) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(EVENT_DELETED, NO_STREAM, -1, -1, static_cast<int64_t>(event));
  }
  void trace_gpu_event_record(c10::DeviceType type, uintptr_t event, uintptr_t stream) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(EVENT_RECORDED, static_cast<int64_t>(stream), -1, -1, static_cast<int64_t>(event));
  }
  void trace_gpu_event_wait(c10::DeviceType type, uintptr_t event, uintptr_t stream) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(EVENT_WAITED, static_cast<int64_t>(stream), -1, -1, static_cast<int64_t>(event));
  }
  void trace_gpu_memory_allocation(c10::DeviceType type, uintptr_t ptr) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    int32_t device_index = -1;
    int64_t stream = current_stream(&device_index);  // the allocation is for the current stream
    append_event(ALLOCATED, stream, device_index, -1, static_cast<int64_t>(ptr));
  }
  void trace_gpu_memory_deallocation(c10::DeviceType type, uintptr_t ptr) const override;
  void trace_gpu_device_synchronization(c10::DeviceType type) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(DEVICE_SYNCED, NO_STREAM, -1, -1, 0);
  }
  void trace_gpu_stream_synchronization(c10::DeviceType type, uintptr_t stream) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(STREAM_SYNCED, static_cast<int64_t>(stream), -1, -1, 0);
  }
  void trace_gpu_event_synchronization(c10::DeviceType type, uintptr_t event) const override {
    if (!recorded(type)) return;
    Timed timed(trace_cost);
    append_event(EVENT_SYNCED, NO_STREAM, -1, -1, static_cast<int64_t>(event));
  }
};

TraceVTable trace_vtable;
c10::impl::PyInterpreter trace_interpreter(&trace_vtable);
const c10::impl::PyInterpreter* saved_trace = nullptr;  // c10's GPU trace before start()
bool saved_have = false;
bool tracing = false;


void TraceVTable::trace_gpu_memory_deallocation(c10::DeviceType type, uintptr_t ptr) const {
  if (!recorded(type)) return;
  Timed timed(trace_cost);
  append_event(FREED, NO_STREAM, -1, stack_id(), static_cast<int64_t>(ptr));
}

void trace_on() {  // c10's GPU trace reports to this log until trace_off()
  saved_have = c10::impl::GPUTrace::haveState;
  saved_trace = c10::impl::GPUTrace::gpuTraceState.load();
  c10::impl::GPUTrace::gpuTraceState.store(&trace_interpreter);
  c10::impl::GPUTrace::haveState = true;
  tracing = true;
}

void trace_off() {
  if (!tracing) return;
  c10::impl::GPUTrace::gpuTraceState.store(saved_trace);
  c10::impl::GPUTrace::haveState = saved_have;
  tracing = false;
}

// -- the observer --------------------------------------------------------------------------------
// [Note: one call at a time]
// A thread records one call at a time: from a recorded (or skipped) call's start to its end,
// `inside` is > 0 on its thread, so every call nested in it (what its kernel calls, where
// RecordFunction still runs) returns from on_start at once. The call being recorded therefore
// lives in the thread's `Call` (PerThread) rather than in an ObserverContext allocated per call,
// and its items vector keeps its capacity from call to call. on_start returns no context;
// RecordFunction runs the end callback all the same, with a null context (record_function.cpp: the
// end callbacks run for every callback whose start ran), and on_end tells its own call from every
// other by the RecordFunction's address, which is fixed while the call runs (a RecordFunction is neither
// copied nor moved) and differs from that of any call nested in it, alive meanwhile.
struct Call {
  const at::RecordFunction* fn = nullptr;  // the call this thread records; null: none
  bool record = false;                     // false: only leave it at its end (skipped, or unreadable)
  bool rf_off = false;                     // it turned RecordFunction off on this thread (its end turns it on)
  uint64_t cost_ns = 0;                    // its start callback's time (record_cost)
  uint32_t callees = 0;                    // its callees that reached on_start (RecordFunction on)
  Pending pending;
};

struct PerThread {
  int inside = 0;  // > 0: within a recorded operator or the tracker itself
  OpCache op_cache = {};
  Call call;
};
thread_local PerThread per_thread;

int& this_thread_inside() { return per_thread.inside; }

// [Note: callees unobserved]
// The calls a recorded (or skipped) operator makes from inside its kernel are not recorded: they
// see `inside` > 0 ([Note: one call at a time]). Whether they are observed at all is a matter of
// cost: a callee observed pays for a RecordFunction and its boxed inputs and outputs, while turning
// RecordFunction off for the call and on again (at::enableRecordFunction) rebuilds RecordFunction's
// thread-local callback cache twice, which costs more than the rest of recording a tiny operator.
// So a call turns it off on its thread, its callees then taking the dispatcher's fast path, only
// - where one call of its operator has been seen making SWITCH_AT calls or more on this thread
//   (`most_callees`, counted while a call of it ran with RecordFunction on): below that, observing
//   them costs less than the switch;
// - for a collective, which may hand work to other threads: those copy the caller's thread-local
//   state, so RecordFunction is off there too, and that work, the collective's own, goes unobserved
//   instead of recorded as the other thread's;
// - while another observer listens on this thread (a thread-local callback: torch.profiler's), so
//   that it sees the operator and none of its callees, as a TorchDispatchMode would.
// This call's own end callback runs either way: it was chosen when the call started; the thread's
// setting comes back at that end. No verdict depends on the choice, as a callee on the call's
// thread is never recorded either way. What it changes, next to turning RecordFunction off for
// every call: an operator's calls run with it on until one of them has made SWITCH_AT calls, so an
// observer registered globally by someone else sees the callees of those first calls, and those of
// every call of an operator that makes fewer; and should an operator making fewer than SWITCH_AT
// calls on its own thread hand work to another thread that calls operators (c10d's collectives,
// which do, are covered above), that work would be observed there, and recorded as that thread's
// own.
void enter_call(PerThread& t, const OpName& op) {
  Call& c = t.call;
  t.inside++;
  c.callees = 0;
  c.rf_off = (op.plan.kind == COLLECTIVE || op.most_callees.load(std::memory_order_relaxed) >= SWITCH_AT ||
              at::hasThreadLocalCallbacks()) &&
             at::isRecordFunctionEnabled();
  if (c.rf_off) {
    Timed timed(switch_cost);
    at::enableRecordFunction(false);
  }
}

void leave_call(PerThread& t) {
  const Call& c = t.call;
  t.inside--;
  if (c.rf_off) {
    Timed timed(switch_cost);
    at::enableRecordFunction(true);
  } else if (c.callees > c.pending.op->most_callees.load(std::memory_order_relaxed)) {
    c.pending.op->most_callees.store(c.callees, std::memory_order_relaxed);  // a lost race only delays the switch
  }
}

// A callee of the call this thread records reached on_start: RecordFunction stayed on for the call.
void saw_callee(Call& c) {
  if (c.fn != nullptr) c.callees++;
}

// A call the log could not record (a tensor it could not read): counted, the last reason kept,
// and reported by Python as a tracker error; never raised into the program.
std::atomic<uint64_t> failures{0};
std::string last_failure;  // under mu

void failed(const char* what) {
  failures++;
  std::lock_guard<std::mutex> g(mu);
  last_failure = what;
}

void start_call(const at::RecordFunction& fn, Call& c);
void end_call(const at::RecordFunction& fn, Call& c);

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!active.load(std::memory_order_relaxed) || !recording.load(std::memory_order_relaxed)) return nullptr;
  PerThread& t = per_thread;
  if (t.inside > 0) {  // a callee of a recorded operator, or the tracker's own call
    count_seen(SEEN_CALLEE);
    saw_callee(t.call);
    return nullptr;
  }
  const OpName* op = op_of(t.op_cache, fn);
  if (op == nullptr) return nullptr;  // the interpreter is shutting down
  const Plan& plan = op->plan;  // fixed once planned
  count_seen(plan.kind == TRANSPARENT ? SEEN_TRANSPARENT : plan.kind == SKIP ? SEEN_SKIP : SEEN_RECORDED);
  if (plan.kind == TRANSPARENT) return nullptr;
  Call& c = t.call;
  c.fn = &fn;
  c.record = false;
  c.pending.reset(op);
  enter_call(t, *op);  // from here on the end callback, which runs whatever happens, undoes it
  if (plan.kind == SKIP) return nullptr;
  uint64_t t0 = Cost::now_ns();
  try {
    start_call(fn, c);
  } catch (const std::exception& exc) {
    failed(exc.what());
    c.record = false;  // this call goes unrecorded, and says so
  }
  c.cost_ns = Cost::now_ns() - t0;
  return nullptr;
}

void start_call(const at::RecordFunction& fn, Call& c) {
  Pending& p = c.pending;
  const Plan& plan = p.op->plan;
  auto inputs = fn.inputs();
  for (const auto& [pos, access] : plan.inputs)
    if (pos < static_cast<int>(inputs.size())) add_value(p, inputs[pos], access);
  if (plan.non_blocking >= 0 && plan.non_blocking < static_cast<int>(inputs.size())) {
    const c10::IValue& v = inputs[plan.non_blocking];
    p.non_blocking = v.isBool() && v.toBool() ? 1 : 0;
  }
  if (plan.kind == RECORD_STREAM) {  // aten::record_stream(Tensor(a!) self, Stream s)
    int64_t sid = NO_STREAM;
    if (inputs.size() > 1 && inputs[1].isStream()) sid = inputs[1].toStream().id();
    append(STREAM_RECORDED, p, sid);
    return;
  }
  set_stream(p);
  if (plan.kind == COLLECTIVE) {  // Python learns of it before the trace callbacks it causes
    p.frame = stack_id();
    append(COLLECTIVE_BEGIN, p, 0);
    p.items.clear();
    p.host.clear();
  }
  c.record = true;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  PerThread& t = per_thread;
  Call& c = t.call;
  if (c.fn != &fn) return;  // a call this thread does not record ([Note: one call at a time])
  c.fn = nullptr;
  leave_call(t);
  if (!c.record) {
    c.pending.host.clear();  // the call's storages, held no longer than the call
    return;
  }
  uint64_t t0 = Cost::now_ns();
  try {
    end_call(fn, c);
  } catch (const std::exception& exc) {
    failed(exc.what());
  }
  c.pending.host.clear();
  record_cost.add_ns(c.cost_ns + (Cost::now_ns() - t0));  // its start's time and its end's
  drain_if_full();
}

// [Note: the host's own calls]
// On CUDA, a call that touches only host memory no stream may have touched (AdamW's `step.item()`
// for every parameter, arithmetic on CPU scalars) makes no record: neither engine tracks that
// memory (host_accesses.py: pageable memory never, a copy between it and the device being
// synchronous, so the host learns the stream complete; pinned memory once stream work touched
// it), and an operator none of whose memory is tracked changes nothing in either
// (hb_tracker.cpp's op_items, feed_apply.py). Asking CUDA whether host memory is pinned costs about
// 1.2 us a question, so a host item is asked only where the answer may matter: in a call recorded
// anyway (append: it touches device memory), and, at the call's end, where its storage overlaps
// pinned memory a recorded call touched (pinned_ranges, which holds all the host memory the
// tracker's engine may track, and more: a range stays after its storage dies, costing a question,
// and a record where the memory there is pinned again; it is kept while the same tracker starts
// the log again, start's `owner`, and forgotten for another). Read at the call's end, the ranges
// hold those a record appended meanwhile added too (another thread's upload of the same buffer,
// whose record the call's own then follows, as it would have); a call whose memory asked about
// turns out pinned is recorded. A call none of whose memory is device
// memory or pinned memory in pinned_ranges is left out: host work before a stream's first touch
// of a buffer is ordered before that work by the program itself (it is enqueued after), so leaving
// it out loses no race. The CPU tracker's memory is all stream memory: there every call is
// recorded.
std::atomic<uint64_t> host_only_calls{0};

bool streams_may_touch(const Pending& p) {
  for (const Item& it : p.items)
    if (it.device != 0 || it.pinned) return true;
  return false;
}

void end_call(const at::RecordFunction& fn, Call& c) {
  Pending& p = c.pending;
  if (p.kind == COLLECTIVE) {
    append(COLLECTIVE_END, p, 0);
    return;
  }
  const Plan& plan = p.op->plan;
  if (plan.returns >= 0)
    for (const c10::IValue& v : fn.outputs()) add_value(p, v, plan.returns);
  // [Note: the host's own calls]: its host memory that may be pinned memory a record touched
  bool touched = !cuda_mode || streams_may_touch(p) || ask_tracked(p);
  if (!touched) {
    host_only_calls.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // Its stack, read at its end rather than its start (a call that makes no record reads none):
  // the same frames, as the caller's frame waits in the call meanwhile.
  p.frame = stack_id();
  // A factory (zeros, empty) has no CUDA input: its stream is the one current on its outputs'
  // device, which the call did not change.
  if (p.stream == NO_STREAM) set_stream(p);
  append(OP, p, p.non_blocking);
}

// -- Python API ----------------------------------------------------------------------------------
PyObject* py_start(PyObject*, PyObject* args) {
  PyObject *plan_fn, *drain_fn;
  int cuda, stacks, trace, results = 1;
  unsigned long long owner = 0;
  if (!PyArg_ParseTuple(args, "OOppp|pK", &plan_fn, &drain_fn, &cuda, &stacks, &trace, &results, &owner))
    return nullptr;
  if (active.load()) {
    PyErr_SetString(PyExc_RuntimeError, "the native op log is already recording");
    return nullptr;
  }
  Py_INCREF(plan_fn);
  Py_XSETREF(planner, plan_fn);
  Py_INCREF(drain_fn);
  Py_XSETREF(drainer, drain_fn);
  cuda_mode = cuda != 0;
  with_stacks = stacks != 0;
  {
    ReleaseAfterUnlock release;
    std::lock_guard<std::mutex> g(mu);  // the plans stay: they depend on the operator alone
    records.clear();
    items.clear();
    if (owner == 0 || owner != host_owner) {  // another tracker's engine: none of it is tracked
      forget_host_locked(recent_host);
      forget_host_locked(drained_host);
      forget_host_locked(watched_host);
      pinned_ranges.clear();
    }
    host_owner = owner;
  }
  // Without the calls' results a recorded operator would lose its writes to them: such a log is
  // a benchmark's floor (what RecordFunction costs without them) and records nothing.
  with_results = results != 0;
  handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end)
                                     .needsInputs(true)
                                     .needsOutputs(with_results)
                                     .scopes({at::RecordScope::FUNCTION}));
  recording.store(with_results);
  active.store(true);
  if (trace) trace_on();
  Py_RETURN_NONE;
}

PyObject* py_stop(PyObject*, PyObject*) {
  trace_off();
  if (active.exchange(false)) at::removeCallback(handle);
  Py_RETURN_NONE;
}

// drain(known) -> (records, items, new op names from `known` on): records and items are the bytes
// of the log's Record and Item arrays (feed_apply.py's RECORD and ITEM read them); a record's
// items are items[first:first + count]. Bytes rather than tuples: a batch is thousands of records,
// and as many tuples would cost an allocation each and wake Python's cyclic collector.
PyObject* py_drain(PyObject*, PyObject* args) {
  Py_ssize_t known = 0;
  if (!PyArg_ParseTuple(args, "n", &known)) return nullptr;
  std::vector<Record> rs;
  std::vector<Item> is;
  std::vector<std::pair<std::string, std::string>> names;
  {
    // Taken over by a swap, so threads that record wait for no copy (the log's arrays grow again
    // from empty: a few reallocations a batch).
    ReleaseAfterUnlock release;
    std::lock_guard<std::mutex> g(mu);
    if (!watched_host.empty()) host_frees_locked();
    rs.swap(records);
    is.swap(items);
    forget_host_locked(drained_host);
    drained_host.swap(recent_host);  // watchable while Python applies the batch
    for (size_t i = static_cast<size_t>(known); i < ops.size(); i++) names.emplace_back(ops[i]->name, ops[i]->overload);
  }
  PyObject* out_r = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(rs.data()),
                                              static_cast<Py_ssize_t>(rs.size() * sizeof(Record)));
  PyObject* out_i = PyBytes_FromStringAndSize(reinterpret_cast<const char*>(is.data()),
                                              static_cast<Py_ssize_t>(is.size() * sizeof(Item)));
  PyObject* out_n = PyList_New(static_cast<Py_ssize_t>(names.size()));
  if (out_r == nullptr || out_i == nullptr || out_n == nullptr) {  // out of memory: the batch is lost, and says so
    Py_XDECREF(out_r);
    Py_XDECREF(out_i);
    Py_XDECREF(out_n);
    return nullptr;
  }
  for (size_t i = 0; i < names.size(); i++)
    PyList_SET_ITEM(out_n, i, Py_BuildValue("(ss)", names[i].first.c_str(), names[i].second.c_str()));
  return Py_BuildValue("(NNN)", out_r, out_i, out_n);
}

// watch(storage ptr): Python tracks the host memory this storage starts; the death of the last
// storage seen there becomes a HOST_FREED record.
PyObject* py_watch(PyObject*, PyObject* args) {
  unsigned long long sptr;
  if (!PyArg_ParseTuple(args, "K", &sptr)) return nullptr;
  ReleaseAfterUnlock release;
  std::lock_guard<std::mutex> g(mu);
  // Every storage seen at that address in the batch Python applies and since: the memory is freed
  // when the last of them dies (at once where they all died already).
  bool seen = false;
  for (auto* batch : {&drained_host, &recent_host}) {
    auto it = batch->find(sptr);
    if (it == batch->end()) continue;
    seen = true;
    if (it->second.empty()) continue;  // its storages died, and their free is logged: nothing to watch
    HostStorages& watched = watched_host[sptr];
    for (const auto& weak : it->second) add_storage_locked(watched, weak);
  }
  if (!seen) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

// note(type, stream, extra[, ptr]): a trace event that Python saw (the stand-ins for CUDA's trace
// callbacks that a CPU tracker is given: tests, patch mode's recording twin), logged in order with
// the operators as the GPU trace interpreter logs CUDA's: a FREED record with the caller's stack;
// `ptr` gives the record one item at that address (STREAM_RECORDED's block).
PyObject* py_note(PyObject*, PyObject* args) {
  int type;
  long long stream, extra, ptr = -1;
  if (!PyArg_ParseTuple(args, "iLL|L", &type, &stream, &extra, &ptr)) return nullptr;
  if (type < 0 || type >= TYPES || type == OP || type == COLLECTIVE_BEGIN || type == KERNEL) {
    PyErr_Format(PyExc_ValueError, "note: record type %d is not a trace event", type);
    return nullptr;
  }
  if (!active.load() || !recording.load()) Py_RETURN_NONE;
  int64_t frame = type == FREED ? stack_id() : -1;
  ReleaseAfterUnlock release;
  std::lock_guard<std::mutex> g(mu);
  if (!watched_host.empty()) host_frees_locked();
  uint32_t count = ptr >= 0 ? 1 : 0;
  records.push_back(make_record(static_cast<int8_t>(type), -1, stream, -1, frame, static_cast<uint32_t>(items.size()),
                                count, extra));
  if (count) {
    Item it{};
    it.ptr = it.sptr = static_cast<uint64_t>(ptr);
    items.push_back(it);
  }
  Py_RETURN_NONE;
}

PyObject* py_record(PyObject*, PyObject* args) {
  int on;
  if (!PyArg_ParseTuple(args, "p", &on)) return nullptr;
  if (on && !with_results) {
    PyErr_SetString(PyExc_RuntimeError, "the op log was started without the calls' results: it cannot record");
    return nullptr;
  }
  recording.store(on != 0);
  Py_RETURN_NONE;
}

// pinned_ranges() -> [(start, end), ...]; add_pinned_range(start, end): what the log holds of the
// pinned memory records touched ([Note: the host's own calls]), and a range added as a record
// touching pinned memory there adds it: for tests, which on a build without CUDA have no pinned
// memory to touch.
PyObject* py_pinned_ranges(PyObject*, PyObject*) {
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  {
    std::lock_guard<std::mutex> g(mu);
    ranges.assign(pinned_ranges.begin(), pinned_ranges.end());
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(ranges.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < ranges.size(); i++) {
    PyObject* range = Py_BuildValue("(KK)", static_cast<unsigned long long>(ranges[i].first),
                                    static_cast<unsigned long long>(ranges[i].second));
    if (range == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, i, range);
  }
  return out;
}

PyObject* py_add_pinned_range(PyObject*, PyObject* args) {
  unsigned long long start, end;
  if (!PyArg_ParseTuple(args, "KK", &start, &end)) return nullptr;
  if (end <= start) {
    PyErr_SetString(PyExc_ValueError, "add_pinned_range: an empty range");
    return nullptr;
  }
  std::lock_guard<std::mutex> g(mu);
  add_pinned_range_locked(start, end);
  Py_RETURN_NONE;
}

// answer_pinned(answer): None, CUDA is asked whether host memory is pinned; True or False, the
// answer for all host memory from now on (tests on a CPU build).
PyObject* py_answer_pinned(PyObject*, PyObject* args) {
  PyObject* answer;
  if (!PyArg_ParseTuple(args, "O", &answer)) return nullptr;
  int pinned = answer == Py_None ? -1 : PyObject_IsTrue(answer);
  if (pinned == -1 && PyErr_Occurred()) return nullptr;
  pinned_answer.store(static_cast<int8_t>(pinned));
  Py_RETURN_NONE;
}

PyObject* py_watch_host(PyObject*, PyObject* args) {
  int on;
  if (!PyArg_ParseTuple(args, "p", &on)) return nullptr;
  watching.store(on != 0);
  Py_RETURN_NONE;
}

// frames(id) -> ((code, lasti), ...), innermost first.
// Python objects are made only after the lock is let go, as everywhere in this file: making one
// may run Python's collector, which may free a CUDA tensor, whose free the log takes under mu.
PyObject* py_frames(PyObject*, PyObject* args) {
  long long id;
  if (!PyArg_ParseTuple(args, "L", &id)) return nullptr;
  std::vector<std::pair<PyObject*, int>> chain;
  {
    std::lock_guard<std::mutex> g(mu);
    if (id >= 0 && static_cast<size_t>(id) < frames.size()) chain = frames[static_cast<size_t>(id)].chain;
  }  // the code objects stay: the log keeps its frames until the interpreter ends
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(chain.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < chain.size(); i++) {
    PyObject* frame = Py_BuildValue("(Oi)", chain[i].first, chain[i].second);
    if (frame == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, i, frame);
  }
  return out;
}

PyObject* py_failures(PyObject*, PyObject*) {
  std::string reason;
  {
    std::lock_guard<std::mutex> g(mu);
    reason = last_failure;
  }
  return Py_BuildValue("(Ks)", static_cast<unsigned long long>(failures.load()), reason.c_str());
}

PyObject* py_costs(PyObject*, PyObject*) {
  auto pair = [](const Cost& c) {
    return Py_BuildValue("(KK)", static_cast<unsigned long long>(c.calls.load()),
                         static_cast<unsigned long long>(c.ns.load()));
  };
  auto n = [](Seen what) { return static_cast<unsigned long long>(seen[what].load()); };
  return Py_BuildValue("{sNsNsNsNsNsKs(KKKK)sKsK}", "record", pair(record_cost), "gil", pair(gil_cost), "walk",
                       pair(walk_cost), "trace", pair(trace_cost), "switch", pair(switch_cost), "frames",
                       static_cast<unsigned long long>(frames_walked.load()), "seen",
                       n(SEEN_CALLEE), n(SEEN_TRANSPARENT), n(SEEN_SKIP), n(SEEN_RECORDED), "host_only",
                       static_cast<unsigned long long>(host_only_calls.load()), "pinned_asked",
                       static_cast<unsigned long long>(pinned_questions.load()));
}

PyObject* py_planner_error(PyObject*, PyObject*) {
  std::string error;
  {
    std::lock_guard<std::mutex> g(mu);
    error = planner_error;
  }
  return PyUnicode_FromString(error.c_str());
}

// kernel_op(name) -> the op id of the kernel `name`'s pseudo-operator (PLAIN, no planned inputs:
// its launches give their items themselves).
PyObject* py_kernel_op(PyObject*, PyObject* args) {
  const char* name;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  std::lock_guard<std::mutex> g(mu);
  auto it = kernel_ops.find(name);
  if (it != kernel_ops.end()) return PyLong_FromLong(it->second->id);
  auto entry = std::make_unique<OpName>();
  entry->name = name;
  entry->overload = KERNEL_OVERLOAD;
  entry->plan.kind = PLAIN;
  entry->id = static_cast<int32_t>(ops.size());
  OpName* op = entry.get();
  ops.push_back(std::move(entry));
  kernel_ops.emplace(op->name, op);
  return PyLong_FromLong(op->id);
}

bool add_tensors(Pending& p, PyObject* seq, int8_t access) {
  PyObject* fast = PySequence_Fast(seq, "a kernel's tensors must be a sequence");
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* obj = PySequence_Fast_GET_ITEM(fast, i);
    if (THPVariable_Check(obj)) add_tensor(p, THPVariable_Unpack(obj), access);
  }
  Py_DECREF(fast);
  return true;
}

// launch(op id, stream, reads, writes): a kernel launch below the dispatcher, in the log's order
// (called on the launching thread, before the launch).
PyObject* py_launch(PyObject*, PyObject* args) {
  int op_id;
  long long stream;
  PyObject *reads, *writes;
  if (!PyArg_ParseTuple(args, "iLOO", &op_id, &stream, &reads, &writes)) return nullptr;
  if (!active.load(std::memory_order_relaxed) || !recording.load(std::memory_order_relaxed)) Py_RETURN_NONE;
  const OpName* op = nullptr;
  {
    std::lock_guard<std::mutex> g(mu);
    if (op_id >= 0 && static_cast<size_t>(op_id) < ops.size()) op = ops[static_cast<size_t>(op_id)].get();
  }
  if (op == nullptr || op->overload != KERNEL_OVERLOAD) {
    PyErr_SetString(PyExc_ValueError, "launch: not a kernel's op id");
    return nullptr;
  }
  Pending p;
  p.reset(op);
  try {
    if (!add_tensors(p, reads, READ) || !add_tensors(p, writes, WRITE)) return nullptr;
  } catch (const std::exception& exc) {
    failed(exc.what());
    Py_RETURN_NONE;
  }
  p.frame = stack_id();
  try {
    append(KERNEL, p, static_cast<int64_t>(stream));  // may ask CUDA about its host tensors
  } catch (const std::exception& exc) {
    failed(exc.what());
    Py_RETURN_NONE;
  }
  drain_if_full();
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"kernel_op", py_kernel_op, METH_VARARGS, "kernel_op(name) -> op id of the kernel's pseudo-operator"},
    {"launch", py_launch, METH_VARARGS,
     "launch(op_id, stream, reads, writes): log a kernel launched below the dispatcher, on the raw stream given"},
    {"start", py_start, METH_VARARGS,
     "start(planner, drainer, cuda, stacks, trace[, results, owner]): record every operator (and, with trace, CUDA's "
     "trace events); with results False, RecordFunction is not asked for the calls' results and nothing is recorded "
     "(a benchmark's floor); what the log knows of host memory is kept where `owner` (a tracker's number, not 0) "
     "started it last"},
    {"stop", py_stop, METH_NOARGS, "stop recording"},
    {"drain", py_drain, METH_VARARGS,
     "drain(known_ops) -> (records, items, new op names): records and items the bytes of the log's Record and Item "
     "arrays (feed_apply.py's RECORD and ITEM), a record's items items[first:first + count]"},
    {"note", py_note, METH_VARARGS,
     "note(type, stream, extra[, ptr]): log a trace event Python saw (a CPU tracker's stand-in for CUDA's)"},
    {"watch", py_watch, METH_VARARGS, "watch(storage_ptr) -> whether that host storage's death will be logged"},
    {"record", py_record, METH_VARARGS,
     "record(on): with on False the hooks stay installed and record nothing (a benchmark's floor); start() turns "
     "recording on"},
    {"watch_host", py_watch_host, METH_VARARGS, "watch_host(on): keep weak references to host storages seen"},
    {"pinned_ranges", py_pinned_ranges, METH_NOARGS,
     "pinned_ranges() -> [(start, end), ...]: the pinned host memory records touched, merged where ranges meet"},
    {"add_pinned_range", py_add_pinned_range, METH_VARARGS,
     "add_pinned_range(start, end): as a record touching pinned memory there would (tests)"},
    {"answer_pinned", py_answer_pinned, METH_VARARGS,
     "answer_pinned(answer): None asks CUDA whether host memory is pinned; True or False answers for all of it "
     "(tests)"},
    {"frames", py_frames, METH_VARARGS, "frames(stack_id) -> ((code, lasti), ...), innermost first"},
    {"costs", py_costs, METH_NOARGS,
     "{'record': (calls, ns), 'gil': (stacks read, ns), 'walk': (stacks read, ns), 'trace': (CUDA trace events logged, "
     "ns), 'switch': (RecordFunction switched off or on, ns), 'frames': walked, 'seen': (callees, "
     "transparent, skipped, recorded calls RecordFunction showed), 'host_only': recorded calls that made no record, "
     "'pinned_asked': host items CUDA was asked whether they are pinned ([Note: the host's own calls])} since the "
     "module loaded: recorded operators' callbacks (less drains), and within them taking the GIL and walking stacks"},
    {"planner_error", py_planner_error, METH_NOARGS, "the last error the Python planner raised"},
    {"failures", py_failures, METH_NOARGS, "(calls not recorded, the last reason) since the module loaded"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT, "_op_log", "racecheck's native operator log", -1, methods};

}  // namespace

int racecheck_add_engine(PyObject* module);  // hb_module.cpp: the native engine's type

PyMODINIT_FUNC PyInit__op_log() {
  PyObject* m = PyModule_Create(&module);
  if (m != nullptr && racecheck_add_engine(m) < 0) Py_CLEAR(m);
  return m;
}
