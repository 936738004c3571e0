"""torch's distributed backend suite (DistributedTest._DistTestBase from
torch/testing/_internal/distributed/distributed_test.py, shipped in the torch
wheel) on ddplug, or on gloo for reference. run.py drives it (make test).

It plays the role of torch's test/distributed/test_distributed_spawn.py (not in
the wheel): one TestCase = TestDistBackend (a MultiProcessTestCase: the parent
starts WORLD_SIZE rank processes per test, each runs TestDistBackend._run:
init_process_group(init_method=file://<per-test file>, backend=BACKEND), a file
barrier, the test body, a file barrier, destroy) + DistributedTest._DistTestBase.

Environment (read in the parent and, with spawn, again in every rank, which
re-imports this module to unpickle the test class):

  TORCHSUITE_BACKEND    gloo | ddplug (default ddplug)
  TORCHSUITE_START      fork (default: ranks forked from the pytest process, ~1 s
                        a test) | spawn (torch's default: every rank re-imports
                        torch + distributed_test, ~5-15 s a test on 2 cores)
  TORCHSUITE_UNSKIP     comma-separated tests whose import-time skip (a gate on
                        BACKEND == "gloo" / require_backend_is_available({"gloo"})
                        / "gloo" in a feature set) is lifted. The skip decorators
                        only set __unittest_skip__ on the function, and only the
                        parent's runner (pytest/unittest) reads it: the ranks call
                        the method directly. So lifting it in the parent opens the
                        test while BACKEND stays "ddplug" for the body.
  TORCHSUITE_GLOO_BODY  comma-separated tests whose body branches on BACKEND for
                        its CPU setup (`if BACKEND == "mpi" or BACKEND == "gloo":`)
                        with no else: for those the rank sets the module's BACKEND
                        to "gloo" after the "ddplug" group exists.
  WORLD_SIZE            ranks (default 2); TEMP_DIR set here if missing.

ddplug declares itself the way torch's suite expects a third-party backend to:
"ddplug" is added to DistTestCases.backend_feature["plugin"] (makes
require_backend_is_available accept it), ["ddp"] and ["subgroup"] before
distributed_test is imported (its decorators are evaluated at import).
"""

from __future__ import annotations

import os
import sys
import tempfile

BACKEND = os.environ.get("TORCHSUITE_BACKEND", "ddplug")
START = os.environ.get("TORCHSUITE_START", "fork")
UNSKIP = [t for t in os.environ.get("TORCHSUITE_UNSKIP", "").split(",") if t]
GLOO_BODY = {t for t in os.environ.get("TORCHSUITE_GLOO_BODY", "").split(",") if t}
if BACKEND not in ("gloo", "ddplug"):
    raise RuntimeError(f"TORCHSUITE_BACKEND={BACKEND!r}: expected gloo or ddplug")

os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # read at import; TestDistBackend.setUp makes a fresh one per test
    _tmp = tempfile.mkdtemp(prefix="torchsuite-")
    os.makedirs(os.path.join(_tmp, "barrier"), exist_ok=True)
    os.environ["TEMP_DIR"] = _tmp
os.environ["BACKEND"] = BACKEND  # distributed_test.BACKEND = os.environ["BACKEND"] at import

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

if BACKEND == "ddplug":
    import ddplug  # noqa: E402,F401  registers "ddplug" with torch.distributed (Backend.register_backend)

    if "ddplug" not in dist.Backend.backend_list:
        raise RuntimeError("import ddplug did not register the torch.distributed backend 'ddplug'")
    from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("ddplug")

from torch.testing._internal.distributed import distributed_test as _dt  # noqa: E402
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend  # noqa: E402

for _t in UNSKIP:
    _fn = getattr(DistributedTest._DistTestBase, _t)
    for _attr in ("__unittest_skip__", "__unittest_skip_why__"):
        if hasattr(_fn, _attr):
            delattr(_fn, _attr)


class _Suite(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if START == "fork":
            self._start_processes(torch.multiprocessing.get_context("fork").Process)
        else:
            self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    if GLOO_BODY:
        @classmethod
        def _run(cls, rank, test_name, file_name, pipe, **kwargs):
            # TestDistBackend._run, plus BACKEND="gloo" for the body of a GLOO_BODY test
            from datetime import timedelta

            self = cls(test_name)
            self.rank = rank
            self.file_name = file_name
            timeout = timedelta(seconds=_dt.CUSTOM_PG_TIMEOUT.get(test_name, _dt.default_pg_timeout))
            dist.init_process_group(init_method=self.init_method, backend=_dt.BACKEND,
                                    world_size=int(self.world_size), rank=self.rank, timeout=timeout)
            if test_name in GLOO_BODY:
                _dt.BACKEND = "gloo"
            self._barrier()
            self.run_test(test_name, pipe)
            self._barrier()
            dist.destroy_process_group()
            sys.exit(0)


_name = "TestDistBackend" + BACKEND.capitalize()  # TestDistBackendDdplug / TestDistBackendGloo
_Suite.__name__ = _Suite.__qualname__ = _name
globals()[_name] = _Suite  # spawned ranks find the class by module + qualname
del _Suite
