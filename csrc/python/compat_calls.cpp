// The hot half of torch_fl.compat's CUDA compatibility layer (torch_fl/compat/_cuda.py): translating a cuda
// device to the flagos device of the same index, and a callable that does it for the device argument of a
// wrapped torch function (Tensor.to, the tensor factories) before calling it. Written against the CPython
// API with vectorcall, because these sit on calls users make per tensor: a Python wrapper costs ~300 ns per
// call, this one a few tens (benchmarks/compat_overhead.py).
#include <pybind11/pybind11.h>

#include <torch/csrc/Device.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <cstring>
#include <vector>

#include "python/bindings.h"

namespace py = pybind11;

namespace flagos::python {
namespace {

constexpr c10::DeviceIndex kMaxCachedIndex = 64;

// Translations made so far: interned results, so that a call allocates nothing once warm. Owned for the
// process's life (module state of an extension that is never unloaded).
struct TranslationCache {
  PyObject* strings = nullptr;                           // dict: "cuda:1" -> "flagos:1"
  std::array<PyObject*, kMaxCachedIndex + 1> devices{};  // [0] flagos without index, [i + 1] flagos:i
  PyObject* device_name = nullptr;                       // "device", for keyword lookups
};

TranslationCache& cache() {
  static TranslationCache c;
  return c;
}

// A new reference to the flagos device for a cuda torch.device.
PyObject* flagos_device(const c10::Device& cuda) {
  const c10::DeviceIndex index = cuda.has_index() ? cuda.index() : -1;
  if (index >= kMaxCachedIndex) return THPDevice_New(c10::Device(c10::DeviceType::PrivateUse1, index));
  PyObject*& slot = cache().devices[static_cast<size_t>(index + 1)];
  if (slot == nullptr) {
    slot = THPDevice_New(c10::Device(c10::DeviceType::PrivateUse1, index));
    if (slot == nullptr) return nullptr;
  }
  Py_INCREF(slot);
  return slot;
}

// A new reference: `obj` translated when it is a cuda device string or torch.device, else `obj` itself.
PyObject* translate(PyObject* obj) {
  if (PyUnicode_CheckExact(obj)) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(obj, &size);
    if (text == nullptr) return nullptr;
    if (size < 4 || std::strncmp(text, "cuda", 4) != 0 || (size > 4 && text[4] != ':')) {
      Py_INCREF(obj);
      return obj;
    }
    TranslationCache& c = cache();
    if (c.strings == nullptr && (c.strings = PyDict_New()) == nullptr) return nullptr;
    PyObject* known = PyDict_GetItemWithError(c.strings, obj);
    if (known != nullptr) {
      Py_INCREF(known);
      return known;
    }
    if (PyErr_Occurred()) return nullptr;
    PyObject* translated = PyUnicode_FromFormat("flagos%s", text + 4);
    if (translated == nullptr) return nullptr;
    if (PyDict_Size(c.strings) < 1024 && PyDict_SetItem(c.strings, obj, translated) < 0) {
      Py_DECREF(translated);
      return nullptr;
    }
    return translated;
  }
  if (THPDevice_Check(obj)) {
    const c10::Device& device = reinterpret_cast<THPDevice*>(obj)->device;
    if (device.type() == c10::DeviceType::CUDA) return flagos_device(device);
  }
  Py_INCREF(obj);
  return obj;
}

// A callable wrapping `wrapped`: the positional argument at `position` (if any; -1 for none) and a `device=`
// keyword are translated, then `wrapped` is called with the same arguments. As a class attribute it binds
// like a method (Tensor.to): the instance is argument 0.
struct TranslatingCall {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* wrapped;
  PyObject* dict;  // __wrapped__, __doc__, __name__ for introspection
  Py_ssize_t position;
};

PyObject* translating_vectorcall(PyObject* callable, PyObject* const* args, size_t nargsf,
                                 PyObject* kwnames) {
  auto* self = reinterpret_cast<TranslatingCall*>(callable);
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  const Py_ssize_t total = nargs + nkw;
  // One slot before the arguments, so that the callee may use PY_VECTORCALL_ARGUMENTS_OFFSET.
  constexpr Py_ssize_t kInline = 16;
  std::array<PyObject*, kInline + 1> inline_buffer{};
  std::vector<PyObject*> heap_buffer;
  PyObject** buffer = inline_buffer.data();
  if (total + 1 > static_cast<Py_ssize_t>(inline_buffer.size())) {
    heap_buffer.resize(static_cast<size_t>(total + 1));
    buffer = heap_buffer.data();
  }
  PyObject** call_args = buffer + 1;
  PyObject* translated[2] = {nullptr, nullptr};
  int translated_count = 0;
  for (Py_ssize_t i = 0; i < total; ++i) call_args[i] = args[i];
  auto substitute = [&](Py_ssize_t i) -> bool {
    PyObject* t = translate(call_args[i]);
    if (t == nullptr) return false;
    translated[translated_count++] = t;
    call_args[i] = t;
    return true;
  };
  bool ok = true;
  if (self->position >= 0 && self->position < nargs) ok = substitute(self->position);
  for (Py_ssize_t k = 0; ok && k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    if (name == cache().device_name || PyUnicode_Compare(name, cache().device_name) == 0) {
      ok = substitute(nargs + k);
      break;
    }
  }
  PyObject* result =
      ok ? PyObject_Vectorcall(self->wrapped, call_args,
                               static_cast<size_t>(nargs) | PY_VECTORCALL_ARGUMENTS_OFFSET, kwnames)
         : nullptr;
  for (int i = 0; i < translated_count; ++i) Py_DECREF(translated[i]);
  return result;
}

PyObject* translating_get(PyObject* self, PyObject* obj, PyObject* /*type*/) {
  if (obj == nullptr || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

void translating_dealloc(PyObject* self) {
  auto* t = reinterpret_cast<TranslatingCall*>(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(t->wrapped);
  Py_CLEAR(t->dict);
  Py_TYPE(self)->tp_free(self);
}

int translating_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* t = reinterpret_cast<TranslatingCall*>(self);
  Py_VISIT(t->wrapped);
  Py_VISIT(t->dict);
  return 0;
}

PyObject* translating_repr(PyObject* self) {
  return PyUnicode_FromFormat("<torch_fl.compat wrapper of %R>",
                              reinterpret_cast<TranslatingCall*>(self)->wrapped);
}

PyTypeObject* translating_type() {
  static PyTypeObject type = [] {
    PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
    t.tp_name = "torch_fl._C._CompatTranslatingCall";
    t.tp_basicsize = sizeof(TranslatingCall);
    t.tp_flags =
        Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
    t.tp_vectorcall_offset = offsetof(TranslatingCall, vectorcall);
    t.tp_call = PyVectorcall_Call;
    t.tp_descr_get = translating_get;
    t.tp_dealloc = translating_dealloc;
    t.tp_traverse = translating_traverse;
    t.tp_repr = translating_repr;
    t.tp_dictoffset = offsetof(TranslatingCall, dict);
    t.tp_doc = "A torch function whose cuda device argument is translated to flagos (torch_fl.compat).";
    return t;
  }();
  static const bool ready = PyType_Ready(&type) == 0;
  if (!ready) throw py::error_already_set();
  return &type;
}

py::object make_translating(py::object wrapped, Py_ssize_t position) {
  PyTypeObject* type = translating_type();
  auto* self = PyObject_GC_New(TranslatingCall, type);
  if (self == nullptr) throw py::error_already_set();
  self->vectorcall = translating_vectorcall;
  self->wrapped = wrapped.release().ptr();
  self->dict = nullptr;
  self->position = position;
  PyObject_GC_Track(reinterpret_cast<PyObject*>(self));
  py::object result = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(self));
  py::handle original = self->wrapped;
  result.attr("__wrapped__") = original;
  for (const char* name : {"__name__", "__qualname__", "__doc__"}) {
    if (py::hasattr(original, name)) result.attr(name) = original.attr(name);
  }
  return result;
}

}  // namespace

void bind_compat_calls(py::module_& m) {
  cache().device_name = PyUnicode_InternFromString("device");
  m.def("_compat_translate_device", [](py::handle obj) {
    PyObject* t = translate(obj.ptr());
    if (t == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(t);
  });
  m.def("_compat_translating", &make_translating, py::arg("wrapped"), py::arg("position"));
}

}  // namespace flagos::python
