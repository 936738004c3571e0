// GradPool: backward's gradients born in registered memory.
//
// Lightning's default, zero_grad(set_to_none=True), drops every .grad after
// the optimizer step, so each backward hands its gradients over as new
// tensors: fresh malloc'd memory (page-faulted anew every step) that the cpu
// plugin can only reach by staging it, two more passes over every byte of a
// large gradient. A GradPool serves those allocations from the plugin's
// registered memory instead. The gradient sync (hosts/python/ddplug/nn/
// gradsync.py) names the byte sizes of its large gradients; while a pool is
// active, an allocation of exactly such a size made inside a backward pass
// (torch's autograd engine runs a graph task on this thread), takes a block
// of that size from the pool's free list, or a new block from ddplug_mem_alloc
// while the pool holds less than its cap. Every other allocation, and every
// one the pool cannot serve, goes to the allocator torch had before. A block
// goes back to its free list when its tensor is freed (the next step's
// gradient of that size reuses it: no page faults), so the pool grows to the
// peak number of such tensors alive at once and stays there.
//
// torch has one CPU allocator per process (c10::SetCPUAllocator): the first
// pool installs this one, which forwards to the previous one whenever no pool
// is active or the size is not one a pool serves; it is never uninstalled
// (tensors it handed out may outlive every pool). Retiring a pool (the gradient
// sync's release: the model is detached, the context closes, the group is
// re-formed; or the sync is garbage collected) stops it serving and gives its
// free blocks back to the plugin while the context is open; a block still in
// use goes back when its tensor is freed. Once the context closes (or the
// group is re-formed, which makes the old blocks ordinary memory) the pool
// forgets the context: a block still in use then belongs to its tensor alone
// (the plugin keeps a private copy of registered memory still in use at
// close, so it never faults).

#include <Python.h>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <string>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gradpool.h"

namespace {

using mem_alloc_fn = int (*)(void*, uint64_t, void**);
using mem_free_fn = int (*)(void*, void*);

struct Pool {
  void* ctx = nullptr;  // the ddplug context; nullptr once forgotten (closed, or re-formed)
  bool serving = true;  // in g_pools; false once stopped or retired
  mem_alloc_fn alloc = nullptr;
  mem_free_fn free = nullptr;
  std::unordered_set<size_t> sizes;  // the byte sizes it serves
  std::unordered_map<size_t, std::vector<void*>> free_list;
  size_t cap = 0;    // registered bytes it may hold (in use + free)
  size_t bytes = 0;  // registered bytes it holds
  uint64_t served = 0, reused = 0, refused = 0;
  bool exhausted = false;  // ddplug_mem_alloc said no once: stop asking
};

struct Block {
  std::shared_ptr<Pool> pool;
  size_t size;
};

std::mutex g_mu;                                   // everything below
std::vector<std::shared_ptr<Pool>> g_pools;        // active
std::unordered_map<void*, Block> g_live;           // blocks handed out
std::atomic<size_t> g_min{SIZE_MAX};               // smallest size an active pool serves
c10::Allocator* g_prev = nullptr;                  // torch's allocator before this one

void update_min_locked() {
  size_t m = SIZE_MAX;
  for (const auto& p : g_pools)
    for (size_t s : p->sizes) m = std::min(m, s);
  g_min.store(m, std::memory_order_relaxed);
}

void pool_delete(void* ptr);

// A block of n bytes from an active pool that serves n, or nullptr.
void* take(size_t n) {
  std::lock_guard<std::mutex> lk(g_mu);
  for (const auto& pool : g_pools) {
    if (!pool->sizes.count(n)) continue;
    void* p = nullptr;
    auto& fl = pool->free_list[n];
    if (!fl.empty()) {
      p = fl.back();
      fl.pop_back();
      ++pool->reused;
    } else if (!pool->exhausted && pool->bytes + n <= pool->cap) {
      if (pool->alloc(pool->ctx, n, &p) != 0 || p == nullptr) {
        p = nullptr;
        pool->exhausted = true;  // NO_MEMORY, or the run failed: ordinary memory from now on
      } else {
        pool->bytes += n;
      }
    }
    if (p == nullptr) {
      ++pool->refused;
      return nullptr;
    }
    try {
      g_live.emplace(p, Block{pool, n});
    } catch (...) {
      fl.push_back(p);
      return nullptr;
    }
    ++pool->served;
    return p;
  }
  return nullptr;
}

struct GradAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t n) override {
    // only inside a backward pass on this thread: not the forward's
    // activations, nor the optimizer's state (momentum, Adam's moments: the
    // sizes of the parameters too)
    if (n >= g_min.load(std::memory_order_relaxed) && torch::autograd::get_current_graph_task_id() != -1) {
      if (void* p = take(n)) return {p, p, &pool_delete, c10::Device(c10::DeviceType::CPU)};
    }
    return g_prev->allocate(n);
  }
  // raw_allocate hands out what allocate does (data == context): pool_delete
  // tells a pool's block from the previous allocator's memory.
  c10::DeleterFnPtr raw_deleter() const override { return &pool_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

GradAllocator g_alloc;

void pool_delete(void* ptr) {
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find(ptr);
    if (it != g_live.end()) {
      Block b = std::move(it->second);
      g_live.erase(it);
      Pool& pool = *b.pool;
      if (pool.ctx == nullptr) return;  // a forgotten pool's block: the plugin keeps it (see the top)
      if (pool.serving && !pool.sizes.empty()) {  // an adopting pool (no sizes) keeps nothing
        try {
          pool.free_list[b.size].push_back(ptr);
          return;
        } catch (...) {
        }
      }
      pool.free(pool.ctx, ptr);  // a retired pool's, back to the plugin
      pool.bytes -= b.size;
      return;
    }
  }
  if (auto d = g_prev->raw_deleter()) d(ptr);  // the previous allocator's memory
}

// Stop serving new allocations; blocks freed from now on still return to the
// free list (until retire).
void stop_locked(Pool& pool) {
  if (!pool.serving) return;
  pool.serving = false;
  g_pools.erase(std::remove_if(g_pools.begin(), g_pools.end(),
                               [&](const std::shared_ptr<Pool>& p) { return p.get() == &pool; }),
                g_pools.end());
  update_min_locked();
}

// Stop serving and empty the free list: back to the plugin when free_blocks
// (the context is open and the blocks are still its registered memory; blocks
// in use go back when their tensors are freed, until forget), else the pool
// forgets the context at once.
void retire(Pool& pool, bool free_blocks) {
  std::lock_guard<std::mutex> lk(g_mu);
  stop_locked(pool);
  if (pool.ctx == nullptr) return;
  for (auto& [size, list] : pool.free_list) {
    if (free_blocks)
      for (void* p : list) pool.free(pool.ctx, p);
    pool.bytes -= size * list.size();
  }
  pool.free_list.clear();
  if (!free_blocks) pool.ctx = nullptr;
}

// The context closes: never call it again (blocks still in use stay with the
// plugin, which keeps a private copy of them).
void forget(Pool& pool) {
  retire(pool, true);
  std::lock_guard<std::mutex> lk(g_mu);
  pool.ctx = nullptr;
}

// Move a storage that torch's CPU allocator made into a block of registered
// memory, in place: the same StorageImpl, its bytes copied once, its DataPtr
// replaced (what torch's own share_memory_() does to move a storage into
// shared memory), so every tensor and view on it follows. For memory only
// torch holds (torch DDP's gradient buckets, through the communication hook):
// a raw pointer taken before (numpy's .numpy() view) would keep the old, freed
// address. Nothing else may use the storage meanwhile (DDP: the bucket is full
// and nothing touches it until its allreduce completes). An adopting pool
// serves no allocations (no sizes): a block goes back to the plugin when its
// storage is freed (a bucket the reducer re-allocated), and a failed
// allocation is tried again at the next adopt.
enum AdoptResult {
  kLeft = 0,       // not the CPU allocator's memory, or empty
  kMoved = 1,      // moved now
  kHeld = 2,       // already a block of this pool
  kNoBlock = 3,    // the plugin gave no block (registered_bytes used up), or the pool is retired
  kEarlier = 4,    // a block of an earlier pool (the group was re-formed, or an earlier context): left there
};

AdoptResult adopt(const std::shared_ptr<Pool>& pool, c10::StorageImpl& st) {
  const at::DataPtr& cur = st._mutable_data_ptr_no_checks();
  const size_t n = st.nbytes();
  void* old = cur.get();
  if (n == 0 || old == nullptr || st.device_type() != c10::DeviceType::CPU) return kLeft;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find(old);
    if (it != g_live.end()) return it->second.pool == pool ? kHeld : kEarlier;
  }
  // only plain CPU-allocator memory (data == context): not numpy's, not
  // shared memory's, not copy-on-write, not another library's
  c10::DeleterFnPtr d = cur.get_deleter();
  c10::Allocator* cpu = g_prev != nullptr ? g_prev : c10::GetCPUAllocator();
  if (cur.get_context() != old || (d != cpu->raw_deleter() && d != c10::GetDefaultCPUAllocator()->raw_deleter()))
    return kLeft;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (!pool->serving || pool->ctx == nullptr) return kNoBlock;
    if (pool->bytes + n > pool->cap || pool->alloc(pool->ctx, n, &p) != 0 || p == nullptr) {
      ++pool->refused;
      return kNoBlock;
    }
    pool->bytes += n;
    try {
      g_live.emplace(p, Block{pool, n});
    } catch (...) {
      pool->free(pool->ctx, p);
      pool->bytes -= n;
      return kNoBlock;
    }
    ++pool->served;
  }
  std::memcpy(p, old, n);
  // the old DataPtr is released here: torch's allocator frees the old memory
  st.set_data_ptr_noswap(c10::DataPtr(p, p, &pool_delete, c10::Device(c10::DeviceType::CPU)));
  return kMoved;
}

// ---- the Python type -------------------------------------------------------------------
struct PyGradPool {
  PyObject_HEAD
  std::shared_ptr<Pool>* pool;
};

// GradPool(ctx_handle, mem_alloc_addr, mem_free_addr, sizes, cap_bytes)
int GradPool_init(PyObject* self, PyObject* args, PyObject* kw) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  PyObject *h, *fa, *ff, *sizes;
  unsigned long long cap = 0;
  if (!PyArg_ParseTuple(args, "OOOO!K", &h, &fa, &ff, &PyTuple_Type, &sizes, &cap)) return -1;
  if (g->pool != nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "GradPool: already initialised");
    return -1;
  }
  void* ctx = PyLong_AsVoidPtr(h);
  void* a = ctx ? PyLong_AsVoidPtr(fa) : nullptr;
  void* f = a ? PyLong_AsVoidPtr(ff) : nullptr;
  if (f == nullptr) {
    if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "GradPool: a NULL context or function address");
    return -1;
  }
  std::shared_ptr<Pool> pool;
  try {
    pool = std::make_shared<Pool>();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(sizes); ++i) {
      unsigned long long s = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(sizes, i));
      if (PyErr_Occurred()) return -1;
      if (s > 0) pool->sizes.insert(static_cast<size_t>(s));
    }
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
    return -1;
  }
  pool->ctx = ctx;
  pool->alloc = reinterpret_cast<mem_alloc_fn>(a);
  pool->free = reinterpret_cast<mem_free_fn>(f);
  pool->cap = static_cast<size_t>(cap);
  {
    std::lock_guard<std::mutex> lk(g_mu);
    if (g_prev == nullptr) {
      c10::Allocator* cur = c10::GetCPUAllocator();
      g_prev = cur;
      c10::SetCPUAllocator(&g_alloc, /*priority=*/0);
      if (c10::GetCPUAllocator() != &g_alloc) {
        c10::SetCPUAllocator(cur, 0);  // keeps what was there (a higher priority may hold it)
        g_prev = nullptr;
        PyErr_SetString(PyExc_RuntimeError,
                        "GradPool: torch's CPU allocator was set with a priority above the default; "
                        "gradients stay in ordinary memory");
        return -1;
      }
    } else if (c10::GetCPUAllocator() != &g_alloc) {
      PyErr_SetString(PyExc_RuntimeError,
                      "GradPool: torch's CPU allocator was replaced after ddplug installed its own; "
                      "gradients stay in ordinary memory");
      return -1;
    }
    try {
      g_pools.push_back(pool);
    } catch (const std::bad_alloc&) {
      PyErr_NoMemory();
      return -1;
    }
    update_min_locked();
  }
  try {
    g->pool = new std::shared_ptr<Pool>(std::move(pool));
  } catch (const std::bad_alloc&) {
    retire(*pool, false);
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

PyObject* GradPool_retire(PyObject* self, PyObject* arg) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  int free_blocks = PyObject_IsTrue(arg);
  if (free_blocks < 0) return nullptr;
  if (g->pool != nullptr) {
    Py_BEGIN_ALLOW_THREADS retire(**g->pool, free_blocks != 0);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

PyObject* GradPool_forget(PyObject* self, PyObject*) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  if (g->pool != nullptr) {
    Py_BEGIN_ALLOW_THREADS forget(**g->pool);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

PyObject* GradPool_stop(PyObject* self, PyObject*) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  if (g->pool != nullptr) {
    std::lock_guard<std::mutex> lk(g_mu);
    stop_locked(**g->pool);
  }
  Py_RETURN_NONE;
}

PyObject* GradPool_holds(PyObject* self, PyObject* arg) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  void* p = PyLong_AsVoidPtr(arg);
  if (p == nullptr && PyErr_Occurred()) return nullptr;
  bool held = false;
  if (g->pool != nullptr) {
    std::lock_guard<std::mutex> lk(g_mu);
    auto it = g_live.find(p);
    held = it != g_live.end() && it->second.pool.get() == g->pool->get();
  }
  return PyBool_FromLong(held);
}

PyObject* GradPool_adopt(PyObject* self, PyObject* arg) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  if (!THPVariable_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "GradPool.adopt: a torch.Tensor, not %s", Py_TYPE(arg)->tp_name);
    return nullptr;
  }
  if (g->pool == nullptr) return PyLong_FromLong(kNoBlock);
  c10::StorageImpl* st = nullptr;
  try {
    const at::Tensor& t = THPVariable_Unpack(arg);
    if (t.has_storage() && t.layout() == c10::kStrided && t.device().is_cpu())
      st = t.storage().unsafeGetStorageImpl();
  } catch (const std::exception& e) {
    PyErr_Format(PyExc_RuntimeError, "GradPool.adopt: %s", e.what());
    return nullptr;
  }
  if (st == nullptr) return PyLong_FromLong(kLeft);
  AdoptResult r = kLeft;
  bool failed = false;
  std::string why;
  Py_BEGIN_ALLOW_THREADS
  try {
    r = adopt(*g->pool, *st);
  } catch (const std::exception& e) {
    failed = true;
    try {
      why = e.what();
    } catch (...) {
    }
  }
  Py_END_ALLOW_THREADS
  if (failed) {
    PyErr_Format(PyExc_RuntimeError, "GradPool.adopt: %s", why.c_str());
    return nullptr;
  }
  return PyLong_FromLong(r);
}

PyObject* GradPool_stats(PyObject* self, PyObject*) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  if (g->pool == nullptr) return PyDict_New();
  unsigned long long served, reused, refused, bytes, free_bytes = 0, in_use = 0;
  int active;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    const Pool& p = **g->pool;
    served = p.served;
    reused = p.reused;
    refused = p.refused;
    bytes = p.bytes;
    active = p.serving;
    for (const auto& [size, list] : p.free_list) free_bytes += size * list.size();
    for (const auto& [ptr, b] : g_live) in_use += b.pool.get() == &p ? 1 : 0;
  }
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K,s:O}", "served", served, "reused", reused, "refused",
                       refused, "bytes", bytes, "free_bytes", free_bytes, "blocks_in_use", in_use,
                       "active", active ? Py_True : Py_False);
}

void GradPool_dealloc(PyObject* self) {
  auto* g = reinterpret_cast<PyGradPool*>(self);
  if (g->pool != nullptr) {
    retire(**g->pool, false);  // the context may be gone: the blocks stay with the plugin
    delete g->pool;
    g->pool = nullptr;
  }
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef GradPool_methods[] = {
    {"retire", GradPool_retire, METH_O,
     "retire(free_blocks): stop serving; release the free blocks, and blocks in use when freed, if "
     "free_blocks (the context is open, same generation), else forget the context."},
    {"forget", GradPool_forget, METH_NOARGS,
     "forget(): retire, releasing the free blocks, and never call the context again (it closes)."},
    {"stop", GradPool_stop, METH_NOARGS,
     "stop(): serve no new allocations (blocks freed later still return to the free list)."},
    {"adopt", GradPool_adopt, METH_O,
     "adopt(tensor): move the tensor's whole storage into a block of registered memory, in place "
     "(1: moved; 2: already this pool's; 0: not torch's CPU allocator's memory; 3: no block (registered "
     "memory used up, or the pool is retired); 4: a block of an earlier pool, left there)."},
    {"holds", GradPool_holds, METH_O, "holds(data_ptr): whether that address is a block this pool handed out."},
    {"stats", GradPool_stats, METH_NOARGS,
     "{served, reused, refused, bytes, free_bytes, blocks_in_use, active}"},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject GradPoolType = {PyVarObject_HEAD_INIT(nullptr, 0)};

}  // namespace

bool ddplug_add_gradpool(PyObject* module) {
  GradPoolType.tp_name = "ddplug_torchfast.GradPool";
  GradPoolType.tp_basicsize = sizeof(PyGradPool);
  GradPoolType.tp_flags = Py_TPFLAGS_DEFAULT;
  GradPoolType.tp_doc = "Backward's large gradients in registered memory (see gradpool.cpp).";
  GradPoolType.tp_new = PyType_GenericNew;
  GradPoolType.tp_init = GradPool_init;
  GradPoolType.tp_dealloc = GradPool_dealloc;
  GradPoolType.tp_methods = GradPool_methods;
  if (PyType_Ready(&GradPoolType) < 0) return false;
  Py_INCREF(&GradPoolType);
  if (PyModule_AddObject(module, "GradPool", reinterpret_cast<PyObject*>(&GradPoolType)) < 0) {
    Py_DECREF(&GradPoolType);
    return false;
  }
  return true;
}
