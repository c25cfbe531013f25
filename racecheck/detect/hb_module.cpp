// racecheck/detect/hb_module.cpp: the native engine as Python sees it (the op log's extension module
// carries it; op_log.cpp's PyInit adds the types): `_op_log.Engine`, a tracker's engine applying
// the native log's records, used by native_engine.py; and `_op_log.HappensBefore`, the engine
// alone (hb_alone.cpp), with the report data and counters both give Python (hb_module.h).
//
//   Engine(cuda, callbacks)        a tracker's engine; `callbacks` answers what only Python knows:
//                                  current(), stream_key(stream_id, device), op_info(op_id),
//                                  watch(storage), stack_key(stack_id) (hb_tracker.h's Callbacks)
//   apply(records, items)          a drained batch's bytes (op_log.h's Record and Item arrays)
//   name_stream(key, name)
//   report_data()                  (domains, allocations, reports) as plain tuples
//   stats(), counts(), take_errors()      the counters; the failures since the last call
//
// [Note: one batch at a time]
// Batches are applied in the order they were drained, one at a time. Applying one runs Python
// (the callbacks), which may switch threads: another thread that applies meanwhile waits for the
// engine's lock with the GIL released. Should the same thread come back to apply while it applies
// (an operator a callback ran filled the log), its batch is queued and applied right after.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "hb_module.h"
#include "hb_tracker.h"

namespace hbpy {

static PyObject* access_tuple(const hb::Engine& e, const hb::Access& a) {
  return Py_BuildValue("(iLNsIL)", a.domain, static_cast<long long>(a.epoch), PyBool_FromLong(a.is_write),
                       e.name(a.op).c_str(), a.alloc, static_cast<long long>(a.stack));
}

static PyObject* alloc_tuple(const hb::Alloc& a) {
  PyObject* free_stack = a.free_stack == hb::UNSEEN ? Py_NewRef(Py_None) : PyLong_FromLongLong(a.free_stack);
  return Py_BuildValue("(KKKiLNN)", static_cast<unsigned long long>(a.serial), static_cast<unsigned long long>(a.ptr),
                       static_cast<unsigned long long>(a.nbytes), a.stream, static_cast<long long>(a.stack),
                       free_stack, PyBool_FromLong(a.live));
}

// report_data() -> (domains, allocations, reports): domains [(key or None for the host's own
// operations, name)], allocations {slot: (serial, ptr, nbytes, stream or -1, stack, free stack or
// None, live)}, reports [(kind, count, earlier, later)], an access (domain, epoch, is_write, op,
// slot, stack).
PyObject* report_data(const hb::Engine& e) {
  PyObject* domains = PyList_New(0);
  PyObject* allocs = PyDict_New();
  PyObject* reports = PyList_New(0);
  for (const hb::Domain& d : e.domains()) {
    PyObject* key = d.host_ops ? Py_NewRef(Py_None) : PyLong_FromLongLong(d.key);
    PyObject* row = Py_BuildValue("(Ns)", key, e.name(d.name).c_str());
    PyList_Append(domains, row);
    Py_DECREF(row);
  }
  for (const hb::Report& r : e.reports()) {
    for (hb::AllocId id : {r.earlier.alloc, r.later.alloc}) {
      PyObject* slot = PyLong_FromUnsignedLong(id);
      PyObject* row = alloc_tuple(e.alloc(id));
      PyDict_SetItem(allocs, slot, row);
      Py_DECREF(slot);
      Py_DECREF(row);
    }
    PyObject* row = Py_BuildValue("(iKNN)", static_cast<int>(r.kind), static_cast<unsigned long long>(r.count),
                                  access_tuple(e, r.earlier), access_tuple(e, r.later));
    PyList_Append(reports, row);
    Py_DECREF(row);
  }
  return Py_BuildValue("(NNN)", domains, allocs, reports);
}

PyObject* engine_stats(const hb::EngineStats& e) {
  return Py_BuildValue("{sKsKsKsK}", "unseen_frees", static_cast<unsigned long long>(e.unseen_frees), "unknown_frees",
                       static_cast<unsigned long long>(e.unknown_frees), "reports_dropped",
                       static_cast<unsigned long long>(e.reports_dropped), "untracked_accesses",
                       static_cast<unsigned long long>(e.untracked_accesses));
}

}  // namespace hbpy

namespace {

using racecheck_log::Item;
using racecheck_log::Record;

// The pending Python exception as "Type: message" (cleared), thrown for the record being applied.
[[noreturn]] void throw_python_error() {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  std::string what = type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "Error";
  PyObject* text = value ? PyObject_Str(value) : nullptr;
  const char* utf8 = text ? PyUnicode_AsUTF8(text) : nullptr;
  what += std::string(": ") + (utf8 ? utf8 : "");
  PyErr_Clear();
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  throw std::runtime_error(what);
}

struct PyCallbacks final : hb::Callbacks {
  PyObject* obj = nullptr;  // strong reference (the engine object's, visited by its GC)

  PyObject* checked(PyObject* got) {
    if (got == nullptr) throw_python_error();
    return got;
  }
  int64_t as_int(PyObject* got) {
    long long v = PyLong_AsLongLong(got);
    Py_DECREF(got);
    if (v == -1 && PyErr_Occurred()) throw_python_error();
    return v;
  }
  int64_t current() override { return as_int(checked(PyObject_CallMethod(obj, "current", nullptr))); }
  bool stream_key(int64_t stream_id, int32_t device, int64_t* key) override {
    PyObject* got = checked(PyObject_CallMethod(obj, "stream_key", "Li", static_cast<long long>(stream_id), device));
    if (got == Py_None) {
      Py_DECREF(got);
      return false;
    }
    *key = as_int(got);
    return true;
  }
  bool op_info(int32_t op, std::string* name, bool* blocks_host) override {
    PyObject* got = checked(PyObject_CallMethod(obj, "op_info", "i", op));
    const char* text = nullptr;
    int blocks = 0;
    bool ok = got != Py_None && PyArg_ParseTuple(got, "sp", &text, &blocks);
    if (ok) {
      *name = text;
      *blocks_host = blocks != 0;
    }
    Py_DECREF(got);
    if (PyErr_Occurred()) throw_python_error();
    return ok;
  }
  bool watch(uint64_t storage) override {
    PyObject* got = checked(PyObject_CallMethod(obj, "watch", "K", static_cast<unsigned long long>(storage)));
    int truth = PyObject_IsTrue(got);
    Py_DECREF(got);
    if (truth < 0) throw_python_error();
    return truth != 0;
  }
  int64_t stack_key(int64_t stack) override {
    return as_int(checked(PyObject_CallMethod(obj, "stack_key", "L", static_cast<long long>(stack))));
  }
};

struct EngineObject {
  PyObject_HEAD
  PyCallbacks* callbacks;
  hb::Tracker* tracker;
  std::mutex* mu;  // [Note: one batch at a time]
  std::atomic<std::thread::id>* owner;
  std::deque<std::pair<std::string, std::string>>* queued;
};

// Takes the engine for this thread; false where this thread holds it already.
bool acquire(EngineObject* self) {
  if (self->owner->load() == std::this_thread::get_id()) return false;
  if (!self->mu->try_lock()) {
    Py_BEGIN_ALLOW_THREADS self->mu->lock();
    Py_END_ALLOW_THREADS
  }
  self->owner->store(std::this_thread::get_id());
  return true;
}

void release(EngineObject* self) {
  self->owner->store(std::thread::id());
  self->mu->unlock();
}

struct Held {  // the engine held for the scope of a read (a no-op inside this thread's own apply)
  EngineObject* self;
  bool mine;
  explicit Held(EngineObject* s) : self(s), mine(acquire(s)) {}
  ~Held() {
    if (mine) release(self);
  }
};

void apply_bytes(hb::Tracker& tracker, const char* records, size_t nr, const char* items, size_t ni) {
  std::vector<Record> rs(nr / sizeof(Record));  // copied: a buffer's alignment is not the arrays'
  std::vector<Item> is(ni / sizeof(Item));
  if (!rs.empty()) std::memcpy(rs.data(), records, rs.size() * sizeof(Record));
  if (!is.empty()) std::memcpy(is.data(), items, is.size() * sizeof(Item));
  tracker.apply(rs.data(), rs.size(), is.data(), is.size());
}

PyObject* engine_apply(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Py_buffer rb, ib;
  if (!PyArg_ParseTuple(args, "y*y*", &rb, &ib)) return nullptr;
  if (!acquire(self)) {  // [Note: one batch at a time]
    self->queued->emplace_back(std::string(static_cast<const char*>(rb.buf), static_cast<size_t>(rb.len)),
                               std::string(static_cast<const char*>(ib.buf), static_cast<size_t>(ib.len)));
    PyBuffer_Release(&rb);
    PyBuffer_Release(&ib);
    Py_RETURN_NONE;
  }
  try {
    apply_bytes(*self->tracker, static_cast<const char*>(rb.buf), static_cast<size_t>(rb.len),
                static_cast<const char*>(ib.buf), static_cast<size_t>(ib.len));
    while (!self->queued->empty()) {
      auto batch = std::move(self->queued->front());
      self->queued->pop_front();
      apply_bytes(*self->tracker, batch.first.data(), batch.first.size(), batch.second.data(), batch.second.size());
    }
  } catch (const std::exception& exc) {  // out of memory: the tracker reports it
    self->tracker->errors.emplace_back(std::string("native engine: ") + exc.what());
  }
  PyBuffer_Release(&rb);
  PyBuffer_Release(&ib);
  release(self);
  Py_RETURN_NONE;
}

PyObject* engine_name_stream(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  long long key;
  const char* name;
  if (!PyArg_ParseTuple(args, "Ls", &key, &name)) return nullptr;
  Held held(self);
  self->tracker->name_stream(key, name);
  Py_RETURN_NONE;
}

PyObject* engine_report_data(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Held held(self);
  return hbpy::report_data(self->tracker->engine);
}


PyObject* engine_stats(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Held held(self);
  const hb::TrackerStats& t = self->tracker->stats;
  return Py_BuildValue("(N{sKsKsK})", hbpy::engine_stats(self->tracker->engine.stats()), "adopted",
                       static_cast<unsigned long long>(t.adopted), "unwatched_host",
                       static_cast<unsigned long long>(t.unwatched_host), "collectives",
                       static_cast<unsigned long long>(t.collectives));
}

PyObject* engine_counts(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Held held(self);
  return Py_BuildValue("(KKK)", static_cast<unsigned long long>(self->tracker->ops),
                       static_cast<unsigned long long>(self->tracker->engine.accesses()),
                       static_cast<unsigned long long>(self->tracker->engine.slots()));
}

PyObject* engine_take_errors(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Held held(self);
  std::vector<std::string>& errors = self->tracker->errors;
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(errors.size()));
  for (size_t i = 0; i < errors.size(); i++)
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), PyUnicode_DecodeUTF8(errors[i].data(), errors[i].size(), "replace"));
  errors.clear();
  return out;
}

// -- the type --------------------------------------------------------------------------------------
PyObject* engine_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  int cuda = 0;
  PyObject* callbacks = nullptr;
  static const char* names[] = {"cuda", "callbacks", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "pO", const_cast<char**>(names), &cuda, &callbacks)) return nullptr;
  auto* self = reinterpret_cast<EngineObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->callbacks = new PyCallbacks();
  self->callbacks->obj = Py_NewRef(callbacks);
  self->tracker = new hb::Tracker(cuda != 0, *self->callbacks);
  self->mu = new std::mutex();
  self->owner = new std::atomic<std::thread::id>();
  self->queued = new std::deque<std::pair<std::string, std::string>>();
  return reinterpret_cast<PyObject*>(self);
}

int engine_traverse(PyObject* obj, visitproc visit, void* arg) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  Py_VISIT(Py_TYPE(obj));
  if (self->callbacks != nullptr) Py_VISIT(self->callbacks->obj);
  return 0;
}

int engine_clear(PyObject* obj) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  if (self->callbacks != nullptr) Py_CLEAR(self->callbacks->obj);
  return 0;
}

void engine_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<EngineObject*>(obj);
  PyTypeObject* type = Py_TYPE(obj);
  PyObject_GC_UnTrack(obj);
  engine_clear(obj);
  delete self->tracker;
  delete self->callbacks;
  delete self->mu;
  delete self->owner;
  delete self->queued;
  type->tp_free(obj);
  Py_DECREF(type);
}

PyMethodDef engine_methods[] = {
    {"apply", engine_apply, METH_VARARGS, "apply(records, items): a drained batch's bytes, in order"},
    {"name_stream", engine_name_stream, METH_VARARGS, "name_stream(key, name): name a stream in reports"},
    {"report_data", engine_report_data, METH_NOARGS, "(domains, allocations, reports) as tuples (see the source)"},
    {"stats", engine_stats, METH_NOARGS, "(the engine's counters, the tracker's counters)"},
    {"counts", engine_counts, METH_NOARGS,
     "(operators with tracked accesses, accesses, allocation slots: the generations kept, [Note: allocation slots])"},
    {"take_errors", engine_take_errors, METH_NOARGS, "the failures since the last call"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot engine_slots[] = {{Py_tp_new, reinterpret_cast<void*>(engine_new)},
                              {Py_tp_dealloc, reinterpret_cast<void*>(engine_dealloc)},
                              {Py_tp_traverse, reinterpret_cast<void*>(engine_traverse)},
                              {Py_tp_clear, reinterpret_cast<void*>(engine_clear)},
                              {Py_tp_methods, engine_methods},
                              {Py_tp_doc, const_cast<char*>("racecheck's native happens-before engine")},
                              {0, nullptr}};

PyType_Spec engine_spec = {"_op_log.Engine", sizeof(EngineObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
                           engine_slots};

int add_type(PyObject* module, PyType_Spec* spec, const char* name) {
  PyObject* type = PyType_FromSpec(spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, name, type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

}  // namespace

// Adds the Engine and HappensBefore types to the op log's module (op_log.cpp's PyInit); -1 with an
// exception set.
int racecheck_add_engine(PyObject* module) {
  if (add_type(module, &engine_spec, "Engine") < 0) return -1;
  return add_type(module, hbpy::engine_alone_spec(), "HappensBefore");
}
