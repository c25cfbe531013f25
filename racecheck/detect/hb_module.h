// racecheck/detect/hb_module.h: what the native engine's two Python types share (hb_module.cpp's
// Engine, hb_alone.cpp's HappensBefore): the report data and counters they hand Python, and the
// standalone type's spec, which hb_module.cpp adds to the module.

#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hb_engine.h"

namespace hbpy {

// (domains, allocations, reports) as plain tuples (their fields: above its definition in hb_module.cpp).
PyObject* report_data(const hb::Engine& e);
// The engine's counters, as engine.py's `stats` names them.
PyObject* engine_stats(const hb::EngineStats& e);
PyType_Spec* engine_alone_spec();

}  // namespace hbpy
