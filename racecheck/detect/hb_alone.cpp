// racecheck/detect/hb_alone.cpp: `_op_log.HappensBefore`, the native engine alone, for the runtime
// observer (native_hb.py); hb_module.cpp adds the type to the op log's module.
//
// [Note: the engine alone]
// `_op_log.HappensBefore(stack_key)` is hb::Engine itself, called as engine.py's HappensBefore is
// called, one method per event: what racecheck's runtime observer (observer.RaceDetector) feeds
// it, through native_hb.py, which turns its keys (streams, events, stacks: Python objects) into
// integers. Domains are made by `domain(key, name)` before any other call names them. Every method
// runs with the GIL held, but `stack_key` runs Python, where the interpreter may switch threads:
// native_hb.py's lock keeps the calls of several threads (the emulation's stream workers free
// blocks) one at a time.
//   domain(key, name), rename(key, name)
//   record_event(event, key), wait_event(event, key), forget_event(event)
//   host_sync_stream(key), host_sync_event(event), host_sync_all()
//   allocate(key or None, ptr, nbytes, stack), free(ptr, keys, stack), record_stream(ptr, key)
//   access(key, ptr, nbytes, is_write, op, stack, record) -> tracked
//   allocation_at(ptr) -> (ptr, nbytes) or None: the live allocation containing ptr
//   report_data(), stats(), accesses()

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "hb_engine.h"
#include "hb_module.h"

namespace {

struct HbObject {
  PyObject_HEAD
  PyObject* stack_key;  // callable: a stack id -> the id of its user frames
  hb::Engine* engine;
  bool failed;  // stack_key raised: its exception is set, returned by the method that called it
};

hb::DomainId domain_arg(HbObject* self, long long key) {
  hb::DomainId d = self->engine->domain_of(key);
  if (d == hb::NO_DOMAIN) PyErr_Format(PyExc_KeyError, "no domain %lld: domain() makes it first", key);
  return d;
}

PyObject* hb_domain(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long key;
  const char* name;
  if (!PyArg_ParseTuple(args, "Ls", &key, &name)) return nullptr;
  if (self->engine->domain_of(key) == hb::NO_DOMAIN) self->engine->add_domain(key, false, name);
  Py_RETURN_NONE;
}

PyObject* hb_rename(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long key;
  const char* name;
  if (!PyArg_ParseTuple(args, "Ls", &key, &name)) return nullptr;
  hb::DomainId d = domain_arg(self, key);
  if (d == hb::NO_DOMAIN) return nullptr;
  self->engine->rename(d, name);
  Py_RETURN_NONE;
}

// record_event / wait_event (event, key)
template <void (hb::Engine::*method)(int64_t, hb::DomainId)>
PyObject* hb_event_on(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long event, key;
  if (!PyArg_ParseTuple(args, "LL", &event, &key)) return nullptr;
  hb::DomainId d = domain_arg(self, key);
  if (d == hb::NO_DOMAIN) return nullptr;
  (self->engine->*method)(event, d);
  Py_RETURN_NONE;
}

// forget_event / host_sync_event (event)
template <void (hb::Engine::*method)(int64_t)>
PyObject* hb_event(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long event;
  if (!PyArg_ParseTuple(args, "L", &event)) return nullptr;
  (self->engine->*method)(event);
  Py_RETURN_NONE;
}

PyObject* hb_host_sync_stream(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long key;
  if (!PyArg_ParseTuple(args, "L", &key)) return nullptr;
  hb::DomainId d = domain_arg(self, key);
  if (d == hb::NO_DOMAIN) return nullptr;
  self->engine->host_sync_stream(d);
  Py_RETURN_NONE;
}

PyObject* hb_host_sync_all(PyObject* obj, PyObject*) {
  reinterpret_cast<HbObject*>(obj)->engine->host_sync_all();
  Py_RETURN_NONE;
}

// The method's result, or its failure: stack_key raised while it ran (its exception is set).
PyObject* hb_result(HbObject* self, PyObject* result) {
  if (!self->failed) return result;
  self->failed = false;
  Py_XDECREF(result);
  return nullptr;
}

PyObject* hb_allocate(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  PyObject* key;
  unsigned long long ptr, nbytes;
  long long stack;
  if (!PyArg_ParseTuple(args, "OKKL", &key, &ptr, &nbytes, &stack)) return nullptr;
  hb::DomainId d = hb::NO_DOMAIN;  // None: an allocation no stream owns
  if (key != Py_None) {
    long long k = PyLong_AsLongLong(key);
    if (k == -1 && PyErr_Occurred()) return nullptr;
    if ((d = domain_arg(self, k)) == hb::NO_DOMAIN) return nullptr;
  }
  self->engine->allocate(d, ptr, nbytes, stack, nullptr);
  return hb_result(self, Py_NewRef(Py_None));
}

PyObject* hb_free(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  unsigned long long ptr;
  PyObject* keys;
  long long stack;
  if (!PyArg_ParseTuple(args, "KOL", &ptr, &keys, &stack)) return nullptr;
  PyObject* seq = PySequence_Fast(keys, "free(): the streams the free is deferred to, as a sequence");
  if (seq == nullptr) return nullptr;
  std::vector<hb::DomainId> deferred;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
    long long k = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
    hb::DomainId d = (k == -1 && PyErr_Occurred()) ? hb::NO_DOMAIN : domain_arg(self, k);
    if (d == hb::NO_DOMAIN) {
      Py_DECREF(seq);
      return nullptr;
    }
    deferred.push_back(d);
  }
  Py_DECREF(seq);
  self->engine->free(ptr, deferred, stack);
  self->engine->collect();  // between calls no slot index is held ([Note: allocation slots])
  return hb_result(self, Py_NewRef(Py_None));
}

PyObject* hb_record_stream(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  unsigned long long ptr;
  long long key;
  if (!PyArg_ParseTuple(args, "KL", &ptr, &key)) return nullptr;
  hb::DomainId d = domain_arg(self, key);
  if (d == hb::NO_DOMAIN) return nullptr;
  self->engine->record_stream(ptr, d);
  Py_RETURN_NONE;
}

PyObject* hb_access(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  long long key, stack;
  unsigned long long ptr, nbytes;
  int is_write, record;
  const char* op;
  if (!PyArg_ParseTuple(args, "LKKpsLp", &key, &ptr, &nbytes, &is_write, &op, &stack, &record)) return nullptr;
  hb::DomainId d = domain_arg(self, key);
  if (d == hb::NO_DOMAIN) return nullptr;
  bool tracked =
      self->engine->access_one(d, ptr, nbytes, is_write != 0, self->engine->name_id(op), stack, record != 0);
  return hb_result(self, PyBool_FromLong(tracked));
}

PyObject* hb_allocation_at(PyObject* obj, PyObject* args) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  unsigned long long ptr;
  if (!PyArg_ParseTuple(args, "K", &ptr)) return nullptr;
  hb::AllocId id = self->engine->allocation_at(ptr);
  if (id == hb::NO_ALLOC) Py_RETURN_NONE;
  const hb::Alloc& a = self->engine->alloc(id);
  return Py_BuildValue("(KK)", static_cast<unsigned long long>(a.ptr), static_cast<unsigned long long>(a.nbytes));
}

PyObject* hb_report_data(PyObject* obj, PyObject*) {
  return hbpy::report_data(*reinterpret_cast<HbObject*>(obj)->engine);
}

PyObject* hb_stats(PyObject* obj, PyObject*) { return hbpy::engine_stats(reinterpret_cast<HbObject*>(obj)->engine->stats()); }

PyObject* hb_accesses(PyObject* obj, PyObject*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<HbObject*>(obj)->engine->accesses());
}

PyObject* hb_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  PyObject* stack_key = nullptr;
  static const char* names[] = {"stack_key", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O", const_cast<char**>(names), &stack_key)) return nullptr;
  auto* self = reinterpret_cast<HbObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->stack_key = Py_NewRef(stack_key);
  self->engine = new hb::Engine();
  self->failed = false;
  // Asked once per stack id, when a race is reported; a failure fails the method that reported.
  // The engine keeps the answer: a failed one is a key of that stack alone (negative, where the
  // user frames' ids count from 0), so that it merges with no other stack's races.
  self->engine->stack_key = [self](int64_t stack) -> int64_t {
    if (self->failed) return -2 - stack;
    PyObject* got = PyObject_CallFunction(self->stack_key, "L", static_cast<long long>(stack));
    long long key = got == nullptr ? -1 : PyLong_AsLongLong(got);
    Py_XDECREF(got);
    if (PyErr_Occurred()) {
      self->failed = true;
      return -2 - stack;
    }
    return key;
  };
  return reinterpret_cast<PyObject*>(self);
}

int hb_traverse(PyObject* obj, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(obj));
  Py_VISIT(reinterpret_cast<HbObject*>(obj)->stack_key);
  return 0;
}

int hb_clear(PyObject* obj) {
  Py_CLEAR(reinterpret_cast<HbObject*>(obj)->stack_key);
  return 0;
}

void hb_dealloc(PyObject* obj) {
  auto* self = reinterpret_cast<HbObject*>(obj);
  PyTypeObject* type = Py_TYPE(obj);
  PyObject_GC_UnTrack(obj);
  hb_clear(obj);
  delete self->engine;
  type->tp_free(obj);
  Py_DECREF(type);
}

PyMethodDef hb_methods[] = {
    {"domain", hb_domain, METH_VARARGS, "domain(key, name): a stream's clock domain, made once"},
    {"rename", hb_rename, METH_VARARGS, "rename(key, name)"},
    {"record_event", hb_event_on<&hb::Engine::record_event>, METH_VARARGS, "record_event(event, key)"},
    {"wait_event", hb_event_on<&hb::Engine::wait_event>, METH_VARARGS, "wait_event(event, key)"},
    {"forget_event", hb_event<&hb::Engine::forget_event>, METH_VARARGS, "forget_event(event)"},
    {"host_sync_stream", hb_host_sync_stream, METH_VARARGS, "host_sync_stream(key)"},
    {"host_sync_event", hb_event<&hb::Engine::host_sync_event>, METH_VARARGS, "host_sync_event(event)"},
    {"host_sync_all", hb_host_sync_all, METH_NOARGS, "host_sync_all()"},
    {"allocate", hb_allocate, METH_VARARGS, "allocate(key or None, ptr, nbytes, stack)"},
    {"free", hb_free, METH_VARARGS, "free(ptr, keys deferred to, stack)"},
    {"record_stream", hb_record_stream, METH_VARARGS, "record_stream(ptr, key)"},
    {"access", hb_access, METH_VARARGS, "access(key, ptr, nbytes, is_write, op, stack, record) -> tracked"},
    {"allocation_at", hb_allocation_at, METH_VARARGS, "allocation_at(ptr) -> (ptr, nbytes) or None"},
    {"report_data", hb_report_data, METH_NOARGS, "(domains, allocations, reports), as Engine.report_data"},
    {"stats", hb_stats, METH_NOARGS, "the engine's counters"},
    {"accesses", hb_accesses, METH_NOARGS, "accesses checked"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot hb_slots[] = {{Py_tp_new, reinterpret_cast<void*>(hb_new)},
                          {Py_tp_dealloc, reinterpret_cast<void*>(hb_dealloc)},
                          {Py_tp_traverse, reinterpret_cast<void*>(hb_traverse)},
                          {Py_tp_clear, reinterpret_cast<void*>(hb_clear)},
                          {Py_tp_methods, hb_methods},
                          {Py_tp_doc, const_cast<char*>("the native happens-before engine, called as engine.py's")},
                          {0, nullptr}};

PyType_Spec hb_spec = {"_op_log.HappensBefore", sizeof(HbObject), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
                       hb_slots};

}  // namespace

namespace hbpy {
PyType_Spec* engine_alone_spec() { return &hb_spec; }
}  // namespace hbpy
