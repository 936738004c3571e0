// GradPool (gradpool.cpp): backward's large gradients in registered memory.
#pragma once

#include <Python.h>

// Add the GradPool type to the module; false with an exception set.
bool ddplug_add_gradpool(PyObject* module);
