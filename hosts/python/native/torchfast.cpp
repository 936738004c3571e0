// ddplug_torchfast: the torch.distributed backend's hot calls in C++.
//
// ProcessGroupDdplug (hosts/python/ddplug/distributed/group.py) is a Python
// process group: every call torch makes on it runs Python, and a blocking
// 8-byte all_reduce spent more time there than in the collective. This module
// gives a group a `Fast` object whose methods take the common case of the
// hottest calls straight to libddplug:
//
//   all_reduce and broadcast that torch waits for at once (asyncOp false),
//   send, recv and recv from any rank,
//
// each of one dense, contiguous CPU tensor of a dtype (and reduction) the
// plugin takes, on a group that is not coalescing and has no dropped requests
// to release. Every other call, and every failure, goes to the group's Python
// method, which stays the one definition of what the backend does: a fast
// call either does exactly what the Python method would have done, or hands
// the call (or its request) to Python.
//
// libddplug is reached through the function pointers of the library the
// Python binding loaded (ctypes), so both sides use one copy of it; calls into
// a context hold the context's lock (Context.lock, a Python RLock), as the
// Python side does, and run with the GIL released.
//
// A send or receive returns a FastP2PWork (a c10d::Work): wait, is_completed,
// source_rank and result are answered here; a failure, a wait's own timeout,
// get_future and exception hand the request to Python (group._adopt_p2p),
// which then answers every call on the work.
//
// A ddplug Context used from torch (the strategies', ddplug.torch's, the
// backend's) gets the same for its own Context.allreduce(x, op): a dense,
// contiguous CPU torch.Tensor reduced in place; anything else, and every
// failure, goes to Context.allreduce (context_allreduce below).

#include <Python.h>

#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <initializer_list>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>

#include "gradpool.h"

namespace py = pybind11;

namespace {

// ---- libddplug, through the binding's function pointers -------------------------------
using ctx_t = void;
using req_t = void;
using allreduce_fn = int (*)(ctx_t*, const void*, void*, uint64_t, int, int, void*);
using broadcast_fn = int (*)(ctx_t*, const void*, void*, uint64_t, int, int, void*);
using isend_fn = int (*)(ctx_t*, const void*, uint64_t, int, int, int64_t, void*, req_t**);
using irecv_fn = int (*)(ctx_t*, void*, uint64_t, int, int, int64_t, void*, req_t**);
using wait_fn = int (*)(req_t*, int64_t);
using test_fn = int (*)(req_t*, int*);
using free_fn = void (*)(req_t*);
using source_fn = int (*)(const req_t*, int*);

struct Api {
  allreduce_fn allreduce;
  broadcast_fn broadcast;
  isend_fn isend;
  irecv_fn irecv;
  wait_fn wait;
  test_fn test;
  free_fn free;
  source_fn source;
};

constexpr int kScalarTypes = static_cast<int>(c10::ScalarType::NumOptions);
constexpr int kRedOps = 16;  // c10d::ReduceOp::RedOpType values are below this

// ---- the per-group state ------------------------------------------------------------------
struct Fast {
  PyObject_HEAD
  PyObject* group_ref;  // weakref to the ProcessGroupDdplug
  PyObject* ctx;        // its ddplug Context
  PyObject* lock;       // ctx.lock
  PyObject* done;       // group._done: the work a blocking collective returns
  PyObject* py_allreduce;  // the class's Python methods (the fallbacks)
  PyObject* py_broadcast;
  PyObject* py_send;
  PyObject* py_recv;
  PyObject* py_recv_any;
  PyObject* op_names;  // a Context's Fast: op name -> ddplug op code (NULL for a group's)
  PyObject* h_obj;  // the ctx._h object h_val was read from (held: its identity stays its own)
  void* h_val;
  std::shared_ptr<struct Core>* core;  // what its sends' and receives' works share (a group's only)
  Api api;
  int world;
  int host_ok;
  std::array<int16_t, kScalarTypes> dtype;            // ScalarType -> ddplug dtype, -1: not taken
  std::array<std::array<int16_t, kScalarTypes>, kRedOps> op;  // [RedOpType][ScalarType] -> ddplug op
};

PyObject* s_acquire;
PyObject* s_release;
PyObject* s_h;
PyObject* s_value;
PyObject* s_orphans;
PyObject* s_coalescing;
PyObject* s_native_error;
PyObject* s_adopt_p2p;
PyObject* s_release_when_complete;
PyObject* s_reduce_op;
PyObject* s_op;
PyObject* s_sum;
PyObject* s_ctx_error;
const py::detail::type_info* g_work_type;  // torch's pybind11 type of c10d::Work (set at import)

// The group (a new reference), or NULL with an exception set.
PyObject* group_of(PyObject* group_ref) {
  PyObject* g = PyWeakref_GetObject(group_ref);
  if (g == nullptr) return nullptr;
  if (g == Py_None) {
    PyErr_SetString(PyExc_RuntimeError, "ddplug: the process group (or context) of this call was destroyed");
    return nullptr;
  }
  Py_INCREF(g);
  return g;
}

PyObject* group_of(Fast* f) { return group_of(f->group_ref); }

// The group's Python method `fn` with the call's own arguments (`kwnames`:
// the names of the keyword arguments that follow the nargs positional ones).
PyObject* fallback(Fast* f, PyObject* fn, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames = nullptr) {
  PyObject* g = group_of(f);
  if (g == nullptr) return nullptr;
  Py_ssize_t all = nargs + (kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0);
  PyObject* stack[16];
  if (all > 15) {
    Py_DECREF(g);
    PyErr_SetString(PyExc_TypeError, "ddplug: too many arguments");
    return nullptr;
  }
  stack[0] = g;
  for (Py_ssize_t i = 0; i < all; ++i) stack[i + 1] = args[i];
  PyObject* r = PyObject_Vectorcall(fn, stack, nargs + 1, kwnames);
  Py_DECREF(g);
  return r;
}

// The handle of f's context `ctx`, or NULL when it is closed (the Python method then says so).
void* handle(Fast* f, PyObject* ctx) {
  PyObject* h = PyObject_GetAttr(ctx, s_h);
  if (h == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  void* v = nullptr;
  if (h == f->h_obj) {
    v = f->h_val;
  } else if (h != Py_None) {
    PyObject* val = PyObject_GetAttr(h, s_value);  // a ctypes.c_void_p
    if (val != nullptr && val != Py_None) v = PyLong_AsVoidPtr(val);
    Py_XDECREF(val);
    if (PyErr_Occurred()) {
      PyErr_Clear();
      v = nullptr;
    }
    if (v != nullptr) {
      Py_INCREF(h);
      Py_XSETREF(f->h_obj, h);
      f->h_val = v;
    }
  }
  Py_DECREF(h);
  return v;
}

// The group's attribute `name` is falsy (no dropped requests; not coalescing).
bool attr_falsy(PyObject* g, PyObject* name, bool none_only) {
  PyObject* v = PyObject_GetAttr(g, name);
  if (v == nullptr) {
    PyErr_Clear();
    return false;
  }
  bool ok = none_only ? v == Py_None : PyObject_Not(v) == 1;
  Py_DECREF(v);
  return ok;
}

bool lock(PyObject* lk) {
  PyObject* r = PyObject_CallMethodNoArgs(lk, s_acquire);
  if (r == nullptr) return false;
  Py_DECREF(r);
  return true;
}

// Also on the way out of a call that failed: the failure's exception, already
// set, is kept aside while the lock's release runs (CPython calls nothing with
// an exception set) and set again after it.
void unlock(PyObject* lk) {
  PyObject *et, *ev, *tb;
  PyErr_Fetch(&et, &ev, &tb);
  PyObject* r = PyObject_CallMethodNoArgs(lk, s_release);
  if (r == nullptr)
    PyErr_WriteUnraisable(lk);
  else
    Py_DECREF(r);
  PyErr_Restore(et, ev, tb);
}

// group.`name`(args...) with new references as arguments (each released
// here, also when one is NULL: then the call is not made); a new reference or
// NULL with an exception set.
PyObject* call_method_steal(PyObject* g, PyObject* name, std::initializer_list<PyObject*> args) {
  PyObject* stack[8];
  size_t n = 0;
  bool ok = true;
  stack[n++] = g;
  for (PyObject* a : args) {
    ok = ok && a != nullptr;
    stack[n++] = a;
  }
  PyObject* r = ok ? PyObject_VectorcallMethod(name, stack, n | PY_VECTORCALL_ARGUMENTS_OFFSET, nullptr) : nullptr;
  for (size_t i = 1; i < n; ++i) Py_XDECREF(stack[i]);
  return r;
}

// group._native_error(op, status, tensor, extra) raised; returns NULL.
// Called under the context's lock, as the Python methods make their errors:
// the context's error sentence is this call's.
PyObject* raise_failure(Fast* f, const char* op, int st, PyObject* tensor, PyObject* extra) {
  if (extra == nullptr) return nullptr;
  PyObject* g = group_of(f);
  if (g == nullptr) return nullptr;
  Py_INCREF(tensor);
  Py_INCREF(extra);
  PyObject* exc = call_method_steal(g, s_native_error, {PyUnicode_FromString(op), PyLong_FromLong(st), tensor, extra});
  Py_DECREF(g);
  if (exc == nullptr) return nullptr;
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
  Py_DECREF(exc);
  return nullptr;
}

// The one tensor of a call the fast path takes: a dense contiguous CPU tensor
// of a dtype the plugin takes, held (a strong reference) from the moment it
// is chosen, so nothing another thread does to the caller's list while this
// one waits for the lock can free it.
struct OneTensor {
  PyObject* obj = nullptr;  // held
  const at::Tensor* t = nullptr;
  int dtype = -1;
  OneTensor() = default;
  OneTensor(const OneTensor&) = delete;
  OneTensor& operator=(const OneTensor&) = delete;
  ~OneTensor() { Py_XDECREF(obj); }
  explicit operator bool() const { return t != nullptr; }
  // Its data; read under the lock, right before the call. NULL for no elements.
  void* data() const {
    try {
      return t->numel() > 0 ? t->data_ptr() : nullptr;
    } catch (const std::exception&) {
      return nullptr;
    }
  }
};

// Fills `out` when `list` holds one tensor for the fast path; anything else (a
// tensor subclass that dispatches in Python, a lazily conjugated or negated
// view, a tensor without data, another layout or device) goes to the Python
// method. Never runs Python.
void one_cpu_tensor_of(Fast* f, PyObject* o, OneTensor& out) {
  if (!f->host_ok || !THPVariable_Check(o)) return;
  try {
    const at::Tensor& t = THPVariable_Unpack(o);
    if (t.unsafeGetTensorImpl()->is_python_dispatch()) return;
    if (t.layout() != c10::kStrided || !t.is_cpu() || t.is_conj() || t.is_neg() || !t.has_storage() ||
        !t.is_contiguous()) {
      return;
    }
    int st = static_cast<int>(t.scalar_type());
    if (st < 0 || st >= kScalarTypes || f->dtype[st] < 0) return;
    if (t.numel() > 0 && t.data_ptr() == nullptr) return;
    Py_INCREF(o);
    out.obj = o;
    out.t = &t;
    out.dtype = f->dtype[st];
  } catch (const std::exception&) {
    return;
  }
}

// The same for the one tensor of a list (torch's calling convention).
void one_cpu_tensor(Fast* f, PyObject* list, OneTensor& out) {
  if (PyList_CheckExact(list) && PyList_GET_SIZE(list) == 1) one_cpu_tensor_of(f, PyList_GET_ITEM(list, 0), out);
}

// An int argument as torch passes it (a Python int, or anything with
// __index__, as numpy's integers); false when it is none of those.
bool index_arg(PyObject* o, int64_t* v) {
  PyObject* i = PyNumber_Index(o);
  if (i == nullptr) {
    PyErr_Clear();
    return false;
  }
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(i, &overflow);
  Py_DECREF(i);
  if (overflow != 0 || (x == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  *v = x;
  return true;
}

// The lock held for one scope (released on every way out).
class Locked {
 public:
  explicit Locked(PyObject* lk) : lk_(lk), held_(lock(lk)) {}
  explicit Locked(Fast* f) : Locked(f->lock) {}
  ~Locked() {
    if (held_) unlock(lk_);
  }
  explicit operator bool() const { return held_; }

 private:
  PyObject* lk_;
  bool held_;
};

// ---- blocking collectives ------------------------------------------------------------------
// torch's options object of type Opts, or nullptr when `o` is not one.
template <class Opts>
const Opts* options(PyObject* o) {
  try {
    return py::handle(o).cast<const Opts*>();
  } catch (const py::cast_error&) {
    return nullptr;
  }
}

// The blocking collective `call(handle, data, count)` of x, under the lock with
// the GIL released: the group's done work, or the failure, worded under the
// lock (raise_failure, with what make_extra gives). The context's handle, and
// x's data and count, are read under the lock: a thread that closes the
// context, or resizes x, holds it too. A closed context goes to `fb` (the
// Python method, which says so; the lock is re-entrant).
template <class Call, class Extra, class Fallback>
PyObject* blocking(Fast* f, const OneTensor& x, const char* op, Call call, Extra make_extra, Fallback fb) {
  Locked held(f);
  if (!held) return nullptr;
  void* h = handle(f, f->ctx);
  if (h == nullptr) return fb();
  void* p = x.data();
  uint64_t n = static_cast<uint64_t>(x.t->numel());
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = call(h, p, n);
  Py_END_ALLOW_THREADS
  if (st == 0) {
    Py_INCREF(f->done);
    return f->done;
  }
  PyObject* extra = make_extra();
  raise_failure(f, op, st, x.obj, extra);
  Py_XDECREF(extra);
  return nullptr;
}

PyObject* Fast_allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  if (nargs != 2 || args[1] == Py_None) return fallback(f, f->py_allreduce, args, nargs);
  OneTensor x;
  one_cpu_tensor(f, args[0], x);
  const auto* o = x ? options<c10d::AllreduceOptions>(args[1]) : nullptr;
  int red = o != nullptr ? static_cast<int>(o->reduceOp.op_) : -1;
  if (o == nullptr || o->asyncOp || o->reduceOp.supplement_ || red < 0 || red >= kRedOps) {
    return fallback(f, f->py_allreduce, args, nargs);
  }
  int op = f->op[red][static_cast<int>(x.t->scalar_type())];
  if (op < 0) return fallback(f, f->py_allreduce, args, nargs);
  return blocking(
      f, x, "all_reduce",
      [&](void* h, void* p, uint64_t n) { return f->api.allreduce(h, p, p, n, x.dtype, op, nullptr); },
      [&]() -> PyObject* {  // the RedOpType, for the message
        PyObject* ro = PyObject_GetAttr(args[1], s_reduce_op);
        PyObject* redop = ro ? PyObject_GetAttr(ro, s_op) : nullptr;
        Py_XDECREF(ro);
        return redop;
      },
      [&]() { return fallback(f, f->py_allreduce, args, nargs); });
}

PyObject* Fast_broadcast(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  if (nargs != 2 || args[1] == Py_None) return fallback(f, f->py_broadcast, args, nargs);
  OneTensor x;
  one_cpu_tensor(f, args[0], x);
  const auto* o = x ? options<c10d::BroadcastOptions>(args[1]) : nullptr;
  if (o == nullptr || o->asyncOp || o->rootTensor != 0 || o->rootRank < 0 || o->rootRank >= f->world) {
    return fallback(f, f->py_broadcast, args, nargs);
  }
  int root = static_cast<int>(o->rootRank);
  return blocking(
      f, x, "broadcast",
      [&](void* h, void* p, uint64_t n) { return f->api.broadcast(h, p, p, n, x.dtype, root, nullptr); },
      [&]() { return PyLong_FromLong(root); }, [&]() { return fallback(f, f->py_broadcast, args, nargs); });
}

bool finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// ---- point-to-point ----------------------------------------------------------------------

// What the works of a group's sends and receives need of its Fast, shared
// between them without a Python reference: a work that completed without
// failure is then released without the GIL (torch releases the GIL before a
// work's last reference goes), and only the Core's last holder takes the GIL,
// to release the lock and the group's weak reference.
struct Core {
  Api api{};
  PyObject* lock = nullptr;       // ctx.lock
  PyObject* group_ref = nullptr;  // weakref to the ProcessGroupDdplug
  Core() = default;
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core() {
    if (Py_IsInitialized() == 0 || finalizing()) return;  // the process is ending: kept
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(lock);
    Py_XDECREF(group_ref);
    PyGILState_Release(g);
  }
};

// Under the ctx lock (GIL held or not): whether the request `req` just
// started completed already (an eager send; a receive whose message was
// there), and then its source and the request released. A request that
// already failed (`*failed`: its status) stays: the test took the plugin's
// sentence into the context's error, so the caller has Python word it before
// the lock is let go (FastP2PWork::fail_at_start).
// Under the ctx lock: a request that completed without failure released
// (`*src`: a receive's source, left as it is when the library has none).
void release_completed(const Api& api, req_t* req, bool receive, int* src) {
  int from = -1;
  if (receive && api.source(req, &from) == 0) *src = from;
  api.free(req);
}

bool completed_at_start(const Api& api, req_t* req, bool receive, int* src, int* failed) {
  int done = 0;
  *failed = api.test(req, &done);
  if (*failed != 0 || done == 0) return false;
  release_completed(api, req, receive, src);
  return true;
}

// A send or receive started by the fast path (see the module comment). torch
// calls its methods with the GIL released (pybind11's call guard) or from C++.
// A work that completed without failure answers them at once, without the GIL
// (its state is published with release/acquire); any other takes the GIL, and
// the context's lock where the request is touched, and looks at the request's
// state only while holding both.
class FastP2PWork : public c10d::Work {
 public:
  // req: the pending request, or NULL for one that completed at its start
  // (src: then its source rank, for a receive).
  FastP2PWork(std::shared_ptr<Core> core, req_t* req, at::Tensor t, bool receive, int peer, int64_t tag, int src)
      : c10d::Work(-1, receive ? c10d::OpType::RECV : c10d::OpType::SEND),
        core_(std::move(core)), req_(req), t_(std::move(t)), receive_(receive), peer_(peer), tag_(tag), src_(src),
        state_(req != nullptr ? kPending : kDone) {}

  ~FastP2PWork() override {
    // No other thread holds this work any more: plain loads.
    PyObject* py = py_.load(std::memory_order_relaxed);
    if (req_ == nullptr && py == nullptr) return;  // nothing of Python's to release
    if (Py_IsInitialized() == 0 || finalizing()) {
      leak();  // the process is ending: nothing may be freed under a pending request
      return;
    }
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *et, *ev, *tb;
    PyErr_Fetch(&et, &ev, &tb);  // a destructor may run while an exception is being raised
    if (req_ != nullptr) orphan();
    Py_XDECREF(py);
    PyErr_Restore(et, ev, tb);
    PyGILState_Release(g);
  }

  bool isCompleted() override {
    if (done_ok()) return true;
    py::gil_scoped_acquire gil;
    if (py() == nullptr) {
      Locked held(core_->lock);
      if (!held) throw py::error_already_set();
      if (py() == nullptr && pending()) {  // looked at again: the lock may have let others run
        int done = 0;
        int st = core_->api.test(req_, &done);
        if (st == 0 && done) finish_ok();
        if (st != 0) adopt();
      }
    }
    if (py() != nullptr) return call_bool("is_completed");
    return !pending();
  }

  bool isSuccess() const override {
    if (done_ok()) return true;
    auto* self = const_cast<FastP2PWork*>(this);
    if (!self->isCompleted()) return false;
    py::gil_scoped_acquire gil;
    return py() == nullptr || self->call_bool("is_success");
  }

  std::exception_ptr exception() const override {
    if (done_ok()) return nullptr;
    py::gil_scoped_acquire gil;
    if (py() == nullptr) return nullptr;
    py::object e = py::reinterpret_borrow<py::object>(py()).attr("exception")();
    if (e.is_none()) return nullptr;
    return std::make_exception_ptr(std::runtime_error(py::str(e).cast<std::string>()));
  }

  int sourceRank() const override {
    if (receive_ && done_ok()) return src_;
    auto* self = const_cast<FastP2PWork*>(this);
    self->wait(std::chrono::milliseconds(0));
    py::gil_scoped_acquire gil;
    if (py() == nullptr && receive_) return src_;
    {
      Locked held(core_->lock);
      if (!held) throw py::error_already_set();
      self->adopt();  // Python says what a send's source rank is
    }
    return py::reinterpret_borrow<py::object>(py()).attr("source_rank")().cast<int>();
  }

  std::vector<at::Tensor> result() override { return {t_}; }
  void synchronize() override { wait(std::chrono::milliseconds(0)); }
  void blockCurrentStream() override { wait(std::chrono::milliseconds(0)); }

  bool wait(std::chrono::milliseconds timeout) override {
    if (done_ok()) return true;
    py::gil_scoped_acquire gil;
    int64_t ms = timeout.count() > 0 ? timeout.count() : -1;
    if (py() == nullptr) {
      Locked held(core_->lock);
      if (!held) throw py::error_already_set();
      if (py() == nullptr && pending()) {
        int st;
        req_t* r = req_;
        wait_fn w = core_->api.wait;
        Py_BEGIN_ALLOW_THREADS
        st = w(r, ms);
        Py_END_ALLOW_THREADS
        if (st == 0) {
          finish_ok();
          return true;
        }
        // Python words the failure (or the wait's own timeout) under the
        // lock, as its own works do: the context's error is this one's.
        adopt();
        return py::reinterpret_borrow<py::object>(py()).attr("waited")(st, ms).cast<bool>();
      }
    }
    if (py() != nullptr) {
      py::object arg = ms < 0 ? py::object(py::none()) : py::object(py::int_(ms));
      return py::reinterpret_borrow<py::object>(py()).attr("wait")(arg).cast<bool>();
    }
    return true;
  }

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    py::gil_scoped_acquire gil;
    {
      Locked held(core_->lock);
      if (!held) throw py::error_already_set();
      adopt();
    }
    py::object fut = py::reinterpret_borrow<py::object>(py()).attr("get_future")();
    return fut.cast<std::shared_ptr<torch::jit::PythonFutureWrapper>>()->fut;
  }

  // Under the GIL and the lock, right after the start: the request already
  // failed with `st`. Python words it now (the context's error is this
  // request's), and the work's wait raises it.
  void fail_at_start(int st) { adopt(st); }

  // The request and tensor, deliberately kept forever: for a start whose work
  // could not be made (the request runs on and must find its memory).
  void leak() {
    if (req_ != nullptr) new at::Tensor(t_);  // NOLINT: intentionally never freed
    req_ = nullptr;
  }

 private:
  enum State { kPending, kDone };

  PyObject* py() const { return py_.load(std::memory_order_acquire); }
  bool pending() const { return state_.load(std::memory_order_acquire) == kPending; }
  // Completed without failure, and no Python work took over: every answer is known.
  bool done_ok() const { return !pending() && py() == nullptr; }

  // Under the lock: the request completed without failure.
  void finish_ok() {
    release_completed(core_->api, req_, receive_, &src_);
    req_ = nullptr;
    state_.store(kDone, std::memory_order_release);
  }

  bool call_bool(const char* name) const {
    return py::reinterpret_borrow<py::object>(py()).attr(name)().cast<bool>();
  }

  // Under the GIL and the lock: hand the request (or the completed outcome)
  // to a Python P2PWork, which answers every later call.
  void adopt(int failed = 0) {
    if (py() != nullptr) return;
    PyObject* g = group_of(core_->group_ref);
    if (g == nullptr) throw py::error_already_set();
    PyObject* tensor = nullptr;
    try {
      tensor = THPVariable_Wrap(t_);
    } catch (const std::exception&) {
      tensor = nullptr;
    }
    if (tensor == nullptr) {
      Py_DECREF(g);
      if (!PyErr_Occurred()) PyErr_NoMemory();
      throw py::error_already_set();
    }
    PyObject* r = call_method_steal(
        g, s_adopt_p2p, {req_ != nullptr ? PyLong_FromVoidPtr(req_) : PyLong_FromLong(0), tensor,
                         PyBool_FromLong(receive_), PyLong_FromLong(peer_), PyLong_FromLongLong(tag_),
                         PyLong_FromLong(src_), PyLong_FromLong(failed)});
    Py_DECREF(g);
    if (r == nullptr) throw py::error_already_set();
    req_ = nullptr;  // Python owns it now
    py_.store(r, std::memory_order_release);
    state_.store(kDone, std::memory_order_release);
  }

  // At destruction, under the GIL, of a work whose request was never seen
  // complete: the group keeps it, with its tensor, and releases both once it
  // completed (release_when_complete, as a dropped Python work does; no lock
  // taken here). When that cannot be done, both are kept forever.
  void orphan() {
    PyObject* g = PyWeakref_GetObject(core_->group_ref);
    PyObject* tensor = nullptr;
    if (g != nullptr && g != Py_None) {
      try {
        tensor = THPVariable_Wrap(t_);
      } catch (const std::exception&) {
        tensor = nullptr;
      }
    }
    PyObject* r = nullptr;
    if (tensor != nullptr) {
      Py_INCREF(g);
      r = call_method_steal(g, s_release_when_complete, {PyLong_FromVoidPtr(req_), tensor});
      Py_DECREF(g);
    }
    if (r == nullptr) {
      PyErr_Clear();
      leak();
      return;
    }
    Py_DECREF(r);
    req_ = nullptr;
  }

  std::shared_ptr<Core> core_;
  req_t* req_;  // touched under the context's lock only (or by the destructor)
  at::Tensor t_;
  bool receive_;
  int peer_;
  int64_t tag_;
  int src_;  // written before state_ becomes kDone
  std::atomic<int> state_;
  std::atomic<PyObject*> py_{nullptr};  // the Python P2PWork that took over, if any
};

// send(tensors, peer, tag=0), recv(tensors, peer, tag=0), recv_anysource(tensors, tag=0)
PyObject* p2p_start(Fast* f, bool receive, PyObject* fn, PyObject* const* args, Py_ssize_t nargs,
                    bool any_source) {
  Py_ssize_t need = any_source ? 1 : 2;
  if (nargs < need || nargs > need + 1 || f->core == nullptr) return fallback(f, fn, args, nargs);
  OneTensor x;
  one_cpu_tensor(f, args[0], x);
  if (!x) return fallback(f, fn, args, nargs);
  int64_t peer = -1, tag = 0;
  if (!any_source && (!index_arg(args[1], &peer) || peer < 0 || peer >= f->world)) {
    return fallback(f, fn, args, nargs);
  }
  if (nargs > need && !index_arg(args[need], &tag)) return fallback(f, fn, args, nargs);
  at::Tensor keep = *x.t;
  Locked held(f);
  if (!held) return nullptr;
  // under the lock, as the Python method looks: the group's state, the
  // context's handle (a closing thread holds the lock), x's data and count
  PyObject* g = group_of(f);
  if (g == nullptr) return nullptr;
  bool plain = attr_falsy(g, s_orphans, false) && attr_falsy(g, s_coalescing, true);
  Py_DECREF(g);
  void* h = plain ? handle(f, f->ctx) : nullptr;
  if (h == nullptr) return fallback(f, fn, args, nargs);  // the lock is re-entrant
  uint64_t n = static_cast<uint64_t>(x.t->numel());
  void* p = x.data();
  req_t* req = nullptr;
  int st, src = -1, failed = 0;
  Py_BEGIN_ALLOW_THREADS
  st = receive ? f->api.irecv(h, p, n, x.dtype, static_cast<int>(peer), tag, nullptr, &req)
               : f->api.isend(h, p, n, x.dtype, static_cast<int>(peer), tag, nullptr, &req);
  if (st == 0 && completed_at_start(f->api, req, receive, &src, &failed)) req = nullptr;
  Py_END_ALLOW_THREADS
  if (st != 0) {
    PyObject* extra = Py_BuildValue("(LL)", static_cast<long long>(peer), static_cast<long long>(tag));
    raise_failure(f, receive ? "recv" : "send", st, x.obj, extra);
    Py_XDECREF(extra);
    return nullptr;
  }
  c10::intrusive_ptr<FastP2PWork> w;
  try {
    w = c10::make_intrusive<FastP2PWork>(*f->core, req, std::move(keep), receive, static_cast<int>(peer), tag,
                                         src);
  } catch (const std::exception& e) {
    if (req != nullptr) new at::Tensor(*x.t);  // the started request must find its memory: kept forever
    PyErr_SetString(PyExc_MemoryError, e.what());
    return nullptr;
  }
  PyObject* r = nullptr;
  try {
    if (failed != 0) w->fail_at_start(failed);  // under the lock still: its sentence is the context's error
    c10::intrusive_ptr<c10d::Work> base(w);
    // As py::cast makes it, without the look-up of the work's dynamic type
    // (FastP2PWork, never registered with pybind11) by its name on every call.
    r = py::detail::type_caster_generic::cast(
            py::detail::cast_sources(static_cast<const void*>(base.get()), g_work_type),
            py::return_value_policy::take_ownership, py::handle(), nullptr, nullptr, &base)
            .ptr();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  if (r == nullptr) {
    w->leak();
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_RuntimeError, "ddplug: cannot make the Work of a send/recv");
  }
  return r;
}

PyObject* Fast_send(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  return p2p_start(f, false, f->py_send, args, nargs, false);
}

PyObject* Fast_recv(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  return p2p_start(f, true, f->py_recv, args, nargs, false);
}

PyObject* Fast_recv_anysource(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  return p2p_start(f, true, f->py_recv_any, args, nargs, true);
}

// ---- a Context's own allreduce ------------------------------------------------------------
// ctx.allreduce(x, op="sum", out=None) of a dense contiguous CPU torch.Tensor
// (the class itself: a subclass may be refused by the Python method) reduced
// in place, under the context's lock with the GIL released; returns x. A
// failure is worded by the context (ctx._native_allreduce_error), as
// Context.allreduce words it. The Fast reaches its context through a weak
// reference (group_ref): the context holds this method in its __dict__.
PyObject* Fast_ctx_allreduce(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  Fast* f = reinterpret_cast<Fast*>(self);
  if (nargs < 1 || nargs > 3 || (nargs == 3 && args[2] != Py_None) ||
      Py_TYPE(args[0]) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    return fallback(f, f->py_allreduce, args, nargs);
  }
  PyObject* name = nargs >= 2 ? args[1] : s_sum;
  PyObject* code = PyUnicode_CheckExact(name) ? PyDict_GetItemWithError(f->op_names, name) : nullptr;
  if (code == nullptr) {
    if (PyErr_Occurred()) return nullptr;
    return fallback(f, f->py_allreduce, args, nargs);
  }
  int op = static_cast<int>(PyLong_AsLong(code));
  if (op == -1 && PyErr_Occurred()) return nullptr;
  OneTensor x;
  one_cpu_tensor_of(f, args[0], x);
  if (!x) return fallback(f, f->py_allreduce, args, nargs);
  PyObject* ctx = group_of(f);
  if (ctx == nullptr) return nullptr;
  int st;
  {
    Locked held(f);
    if (!held) {
      Py_DECREF(ctx);
      return nullptr;
    }
    // under the lock: the handle (close() holds it), x's data and count
    void* h = handle(f, ctx);
    if (h == nullptr) {  // closed: the Python method says so (the lock is re-entrant)
      Py_DECREF(ctx);
      return fallback(f, f->py_allreduce, args, nargs);
    }
    uint64_t n = static_cast<uint64_t>(x.t->numel());
    void* p = x.data();
    Py_BEGIN_ALLOW_THREADS
    st = f->api.allreduce(h, p, p, n, x.dtype, op, nullptr);
    Py_END_ALLOW_THREADS
    if (st != 0) {  // worded under the lock: the context's error sentence is this call's
      Py_INCREF(x.obj);
      Py_INCREF(name);
      PyObject* exc = call_method_steal(ctx, s_ctx_error, {PyLong_FromLong(st), x.obj, name});
      if (exc != nullptr) {
        PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc)), exc);
        Py_DECREF(exc);
      }
    }
  }
  Py_DECREF(ctx);
  if (st != 0) return nullptr;
  Py_INCREF(args[0]);
  return args[0];
}

// ---- the type -------------------------------------------------------------------------------
// Every Python reference a Fast holds.
constexpr PyObject* Fast::*kFastRefs[] = {&Fast::group_ref, &Fast::ctx, &Fast::lock, &Fast::done,
                                          &Fast::py_allreduce, &Fast::py_broadcast, &Fast::py_send,
                                          &Fast::py_recv, &Fast::py_recv_any, &Fast::op_names,
                                          &Fast::h_obj};

int Fast_traverse(PyObject* self, visitproc visit, void* arg) {
  Fast* f = reinterpret_cast<Fast*>(self);
  for (auto ref : kFastRefs) Py_VISIT(f->*ref);
  return 0;
}

int Fast_clear(PyObject* self) {
  Fast* f = reinterpret_cast<Fast*>(self);
  for (auto ref : kFastRefs) Py_CLEAR(f->*ref);
  delete f->core;  // the works that still share it keep it
  f->core = nullptr;
  return 0;
}

void Fast_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  Fast_clear(self);
  Py_TYPE(self)->tp_free(self);
}

bool fill_tables(Fast* f, PyObject* dtypes, PyObject* ops) {
  f->dtype.fill(-1);
  for (auto& row : f->op) row.fill(-1);
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  while (PyDict_Next(dtypes, &pos, &k, &v)) {
    if (!THPDtype_Check(k)) {
      PyErr_SetString(PyExc_TypeError, "Fast: dtypes maps torch.dtype to a ddplug dtype code");
      return false;
    }
    int st = static_cast<int>(reinterpret_cast<THPDtype*>(k)->scalar_type);
    long code = PyLong_AsLong(v);
    if (code == -1 && PyErr_Occurred()) return false;
    if (st >= 0 && st < kScalarTypes) f->dtype[st] = static_cast<int16_t>(code);
  }
  pos = 0;
  while (PyDict_Next(ops, &pos, &k, &v)) {
    PyObject *red = nullptr, *dt = nullptr;
    if (!PyTuple_Check(k) || !PyArg_ParseTuple(k, "OO", &red, &dt) || !THPDtype_Check(dt)) {
      PyErr_SetString(PyExc_TypeError, "Fast: ops maps (int(RedOpType), torch.dtype) to a ddplug op code");
      return false;
    }
    long r = PyLong_AsLong(red);
    long code = PyLong_AsLong(v);
    if (PyErr_Occurred()) return false;
    int st = static_cast<int>(reinterpret_cast<THPDtype*>(dt)->scalar_type);
    if (r >= 0 && r < kRedOps && st >= 0 && st < kScalarTypes) f->op[r][st] = static_cast<int16_t>(code);
  }
  return true;
}

// api from fns: the addresses of ddplug_allreduce, _broadcast, _isend, _irecv,
// _request_wait, _request_test, _request_free, _request_source.
bool read_api(PyObject* fns, Api* api) {
  if (PyTuple_GET_SIZE(fns) != 8) {
    PyErr_SetString(PyExc_ValueError, "Fast: 8 function addresses");
    return false;
  }
  void* p[8];
  for (int i = 0; i < 8; ++i) {
    p[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
    if (p[i] == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "Fast: a NULL function address");
      return false;
    }
  }
  *api = Api{reinterpret_cast<allreduce_fn>(p[0]), reinterpret_cast<broadcast_fn>(p[1]),
             reinterpret_cast<isend_fn>(p[2]),     reinterpret_cast<irecv_fn>(p[3]),
             reinterpret_cast<wait_fn>(p[4]),      reinterpret_cast<test_fn>(p[5]),
             reinterpret_cast<free_fn>(p[6]),      reinterpret_cast<source_fn>(p[7])};
  return true;
}

// Fast(group, ctx, fallbacks, fns, dtypes, ops, host_ok)
//   fallbacks: (allreduce, broadcast, send, recv, recv_anysource): the class's Python methods
//   fns: the addresses of ddplug_allreduce, _broadcast, _isend, _irecv, _request_wait,
//        _request_test, _request_free, _request_source in the binding's library
int Fast_init(PyObject* self, PyObject* args, PyObject* kw) {
  Fast* f = reinterpret_cast<Fast*>(self);
  PyObject *group, *ctx, *fallbacks, *fns, *dtypes, *ops;
  int host_ok = 0;
  if (!PyArg_ParseTuple(args, "OOO!O!O!O!p", &group, &ctx, &PyTuple_Type, &fallbacks, &PyTuple_Type, &fns,
                        &PyDict_Type, &dtypes, &PyDict_Type, &ops, &host_ok)) {
    return -1;
  }
  if (PyTuple_GET_SIZE(fallbacks) != 5) {
    PyErr_SetString(PyExc_ValueError, "Fast: 5 fallbacks");
    return -1;
  }
  if (!read_api(fns, &f->api)) return -1;
  PyObject* world = PyObject_CallMethod(group, "size", nullptr);
  if (world == nullptr) return -1;
  f->world = static_cast<int>(PyLong_AsLong(world));
  Py_DECREF(world);
  if (PyErr_Occurred()) return -1;
  PyObject* lk = PyObject_GetAttrString(ctx, "lock");
  PyObject* done = lk ? PyObject_GetAttrString(group, "_done") : nullptr;
  PyObject* ref = done ? PyWeakref_NewRef(group, nullptr) : nullptr;
  if (ref == nullptr) {
    Py_XDECREF(lk);
    Py_XDECREF(done);
    return -1;
  }
  Fast_clear(self);
  f->group_ref = ref;
  f->lock = lk;
  f->done = done;
  Py_INCREF(ctx);
  f->ctx = ctx;
  PyObject** slots[5] = {&f->py_allreduce, &f->py_broadcast, &f->py_send, &f->py_recv, &f->py_recv_any};
  for (int i = 0; i < 5; ++i) {
    *slots[i] = PyTuple_GET_ITEM(fallbacks, i);
    Py_INCREF(*slots[i]);
  }
  f->host_ok = host_ok;
  f->h_val = nullptr;
  try {
    auto core = std::make_shared<Core>();
    core->api = f->api;
    Py_INCREF(lk);
    core->lock = lk;
    Py_INCREF(ref);
    core->group_ref = ref;
    f->core = new std::shared_ptr<Core>(std::move(core));
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  return fill_tables(f, dtypes, ops) ? 0 : -1;
}

// ---- the methods a group gets --------------------------------------------------------------
// Not builtin methods: pybind11, which torch's C++ callers (DDP, _broadcast_coalesced)
// reach the group's Python methods through, takes any builtin function for
// the C++ base's own and would call ProcessGroup's instead (which has no
// backend for a Python group). A FastMethod is a callable of its own type.
using impl_fn = PyObject* (*)(PyObject*, PyObject* const*, Py_ssize_t);

struct FastMethod {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* fast;      // the Fast
  PyObject* fallback;  // the class's Python method (also for keyword arguments it does not name)
  impl_fn impl;
  const char* const* params;  // the names of impl's parameters, in order (NULL: positional only)
  Py_ssize_t nparams;
};

// Keyword arguments given by the names of the method's own parameters, in
// `params`, are put in their places: impl sees positional arguments only, as
// when the call spelled them so. False (nothing filled) for a keyword it does
// not name, one given twice, or one left before a missing parameter: the
// Python method then says what is wrong.
bool keywords_in_place(const FastMethod* m, PyObject* const* args, Py_ssize_t n, PyObject* kwnames,
                       PyObject** out, Py_ssize_t* nout) {
  constexpr Py_ssize_t kMax = 8;
  if (m->params == nullptr || m->nparams > kMax || n > m->nparams) return false;
  PyObject* slot[kMax] = {};
  for (Py_ssize_t i = 0; i < n; ++i) slot[i] = args[i];
  Py_ssize_t last = n;
  for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); ++k) {
    Py_ssize_t len = 0;
    const char* name = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(kwnames, k), &len);
    if (name == nullptr) {
      PyErr_Clear();
      return false;
    }
    Py_ssize_t i = 0;  // the whole name: one with an embedded NUL names no parameter
    while (i < m->nparams &&
           (strlen(m->params[i]) != static_cast<size_t>(len) || strcmp(m->params[i], name) != 0)) {
      ++i;
    }
    if (i == m->nparams || slot[i] != nullptr) return false;
    slot[i] = args[n + k];
    last = i + 1 > last ? i + 1 : last;
  }
  for (Py_ssize_t i = 0; i < last; ++i) {
    if (slot[i] == nullptr) return false;  // a parameter before a given one left to its default
    out[i] = slot[i];
  }
  *nout = last;
  return true;
}

PyObject* FastMethod_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  FastMethod* m = reinterpret_cast<FastMethod*>(self);
  Py_ssize_t n = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    PyObject* placed[8];
    Py_ssize_t np = 0;
    if (keywords_in_place(m, args, n, kwnames, placed, &np)) return m->impl(m->fast, placed, np);
    return fallback(reinterpret_cast<Fast*>(m->fast), m->fallback, args, n, kwnames);
  }
  return m->impl(m->fast, args, n);
}

int FastMethod_traverse(PyObject* self, visitproc visit, void* arg) {
  FastMethod* m = reinterpret_cast<FastMethod*>(self);
  Py_VISIT(m->fast);
  Py_VISIT(m->fallback);
  return 0;
}

int FastMethod_clear(PyObject* self) {
  FastMethod* m = reinterpret_cast<FastMethod*>(self);
  Py_CLEAR(m->fast);
  Py_CLEAR(m->fallback);
  return 0;
}

void FastMethod_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  FastMethod_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyTypeObject FastMethodType = {PyVarObject_HEAD_INIT(nullptr, 0)};
PyTypeObject FastType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// A FastMethod calling impl on fast, falling back to `fallback` (params:
// the names of impl's parameters, for keyword arguments; NULL: only the
// positional ones are taken natively).
PyObject* new_method(PyObject* fast, impl_fn impl, PyObject* fallback, const char* const* params = nullptr,
                     Py_ssize_t nparams = 0) {
  FastMethod* m = PyObject_GC_New(FastMethod, &FastMethodType);
  if (m == nullptr) return nullptr;
  m->vectorcall = FastMethod_vectorcall;
  Py_INCREF(fast);
  m->fast = fast;
  Py_INCREF(fallback);
  m->fallback = fallback;
  m->impl = impl;
  m->params = params;
  m->nparams = nparams;
  PyObject_GC_Track(m);
  return reinterpret_cast<PyObject*>(m);
}

// context_allreduce(ctx, fallback, fns, dtypes, op_names): the native
// Context.allreduce of ctx (fallback: the class's Python method; fns as for
// Fast; dtypes: torch dtype -> ddplug dtype code; op_names: op name -> ddplug
// op code). Holds no strong reference to ctx, which keeps it.
PyObject* context_allreduce(PyObject*, PyObject* args) {
  PyObject *ctx, *fb, *fns, *dtypes, *names;
  if (!PyArg_ParseTuple(args, "OOO!O!O!", &ctx, &fb, &PyTuple_Type, &fns, &PyDict_Type, &dtypes, &PyDict_Type,
                        &names)) {
    return nullptr;
  }
  PyObject* self = PyType_GenericNew(&FastType, nullptr, nullptr);
  if (self == nullptr) return nullptr;
  Fast* f = reinterpret_cast<Fast*>(self);
  PyObject* empty = PyDict_New();
  bool ok = empty != nullptr && read_api(fns, &f->api) && fill_tables(f, dtypes, empty);
  Py_XDECREF(empty);
  if (ok) {
    f->group_ref = PyWeakref_NewRef(ctx, nullptr);
    f->lock = f->group_ref ? PyObject_GetAttrString(ctx, "lock") : nullptr;
    ok = f->lock != nullptr;
  }
  if (!ok) {
    Py_DECREF(self);
    return nullptr;
  }
  Py_INCREF(fb);
  f->py_allreduce = fb;
  Py_INCREF(names);
  f->op_names = names;
  f->host_ok = 1;
  static const char* const params[] = {"x", "op", "out"};  // Context.allreduce's
  PyObject* m = new_method(self, Fast_ctx_allreduce, fb, params, 3);
  Py_DECREF(self);
  return m;
}

// fast.method(name): the callable a group gets as its attribute `name`.
PyObject* Fast_method(PyObject* self, PyObject* name) {
  Fast* f = reinterpret_cast<Fast*>(self);
  if (f->core == nullptr) {
    PyErr_SetString(PyExc_ValueError, "Fast.method: this Fast was not initialized with a group");
    return nullptr;
  }
  struct Entry {
    const char* name;
    impl_fn impl;
    PyObject* fallback;
  } table[] = {{"allreduce", Fast_allreduce, f->py_allreduce},
               {"broadcast", Fast_broadcast, f->py_broadcast},
               {"send", Fast_send, f->py_send},
               {"recv", Fast_recv, f->py_recv},
               {"recv_anysource", Fast_recv_anysource, f->py_recv_any}};
  const char* n = PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : nullptr;
  for (const Entry& e : table) {
    if (n != nullptr && strcmp(n, e.name) == 0) return new_method(self, e.impl, e.fallback);
  }
  PyErr_Format(PyExc_ValueError, "Fast.method: no native %R (allreduce, broadcast, send, recv, recv_anysource)",
               name);
  return nullptr;
}

PyMethodDef Fast_methods[] = {
    {"method", Fast_method, METH_O, "method(name): the native method `name` of the group"},
    {nullptr, nullptr, 0, nullptr}};

PyMethodDef module_methods[] = {
    {"context_allreduce", context_allreduce, METH_VARARGS,
     "context_allreduce(ctx, fallback, fns, dtypes, op_names): ctx's native allreduce"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "ddplug_torchfast",
                          "The torch.distributed backend's hot calls in C++ (see torchfast.cpp).", -1,
                          module_methods};

bool intern(PyObject** slot, const char* s) {
  *slot = PyUnicode_InternFromString(s);
  return *slot != nullptr;
}

}  // namespace

#ifndef DDPLUG_TORCH_VERSION
#error "DDPLUG_TORCH_VERSION: the torch build this is built against (native.py's stamp)"
#endif

PyMODINIT_FUNC PyInit_ddplug_torchfast(void) {
  if (!intern(&s_acquire, "acquire") || !intern(&s_release, "release") || !intern(&s_h, "_h") ||
      !intern(&s_value, "value") || !intern(&s_orphans, "_orphans") || !intern(&s_coalescing, "_coalescing") ||
      !intern(&s_native_error, "_native_error") || !intern(&s_adopt_p2p, "_adopt_p2p") ||
      !intern(&s_release_when_complete, "_release_native_request") || !intern(&s_reduce_op, "reduceOp") ||
      !intern(&s_op, "op") || !intern(&s_sum, "sum") || !intern(&s_ctx_error, "_native_allreduce_error")) {
    return nullptr;
  }
  // The C++ types this module hands to and takes from torch's own bindings
  // must be the ones torch registered with pybind11 (a build against another
  // torch, or another pybind11 ABI, would not see them): refuse to load.
  g_work_type = py::detail::get_type_info(typeid(c10d::Work));
  if (g_work_type == nullptr ||
      py::detail::get_type_info(typeid(c10d::AllreduceOptions)) == nullptr ||
      py::detail::get_type_info(typeid(c10d::BroadcastOptions)) == nullptr) {
    PyErr_SetString(PyExc_ImportError,
                    "ddplug_torchfast: torch's c10d types (Work, AllreduceOptions, BroadcastOptions) are not "
                    "registered for this build's pybind11: import torch.distributed first, with the torch it "
                    "was built against");
    return nullptr;
  }
  FastType.tp_name = "ddplug_torchfast.Fast";
  FastType.tp_basicsize = sizeof(Fast);
  FastType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  FastType.tp_doc = "The fast path of one ProcessGroupDdplug (see torchfast.cpp).";
  FastType.tp_new = PyType_GenericNew;
  FastType.tp_init = Fast_init;
  FastType.tp_dealloc = Fast_dealloc;
  FastType.tp_traverse = Fast_traverse;
  FastType.tp_clear = Fast_clear;
  FastType.tp_methods = Fast_methods;
  if (PyType_Ready(&FastType) < 0) return nullptr;
  FastMethodType.tp_name = "ddplug_torchfast.FastMethod";
  FastMethodType.tp_basicsize = sizeof(FastMethod);
  FastMethodType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  FastMethodType.tp_doc = "A native method of one ProcessGroupDdplug (see torchfast.cpp).";
  FastMethodType.tp_vectorcall_offset = offsetof(FastMethod, vectorcall);
  FastMethodType.tp_call = PyVectorcall_Call;
  FastMethodType.tp_dealloc = FastMethod_dealloc;
  FastMethodType.tp_traverse = FastMethod_traverse;
  FastMethodType.tp_clear = FastMethod_clear;
  if (PyType_Ready(&FastMethodType) < 0) return nullptr;
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&FastType);
  if (PyModule_AddObject(m, "Fast", reinterpret_cast<PyObject*>(&FastType)) < 0 ||
      PyModule_AddStringConstant(m, "TORCH_VERSION", DDPLUG_TORCH_VERSION) < 0 || !ddplug_add_gradpool(m)) {
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
