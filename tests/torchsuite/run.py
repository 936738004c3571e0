#!/usr/bin/env python3
"""torch's own distributed backend suite on ddplug (make test's `torch-suite`).

torch tests its backends with DistributedTest._DistTestBase
(torch/testing/_internal/distributed/distributed_test.py, in the torch wheel).
This driver runs it on backend "ddplug" (the cpu plugin) at world sizes 2 and
3, ranks forked (the same processes torch's spawn runs, without re-importing
torch in every rank: about 1 s a test instead of 10), one pytest process per
world size running dist_suite.py, and compares every test with what it must do:

* SELECTION: the tests gloo runs on CPU with torch 2.13.0 (the same 90 at
  world 2 and 3; discovered by running the whole suite on gloo — redo that
  when torch is bumped: `run.py --backend gloo --all`). Each must pass on
  ddplug, except
* EXCEPTIONS: the tests that check something only gloo can be (torch restricts
  them to gloo), each with its reason.

Flags in SELECTION: "unskip" — gated off for any backend but gloo by an
import-time decorator (BACKEND == "gloo", require_backend_is_available({"gloo"})):
the gate is lifted, the body runs on ddplug; "gloo-body" — the body branches
on BACKEND for its CPU setup with no branch for other backends: the body sees
"gloo", the group is ddplug's.

Exit 0 when every outcome is the expected one; otherwise the unexpected ones
are listed (an exception that starts to pass counts too: take it out). Prints
passed / failed / skipped per world size.

    run.py [--world-sizes 2,3] [--build BUILD] [--out DIR] [--backend ddplug|gloo]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

SELECTION = {  # test -> flags
    "test_Backend_enum_class": "",
    "test_DistributedDataParallelCPU": "",
    "test_DistributedDataParallelCPU_grad_is_view": "",
    "test_DistributedDataParallel_requires_grad": "",
    "test_accumulate_gradients_no_sync": "unskip,gloo-body",
    "test_accumulate_gradients_no_sync_allreduce_hook": "unskip,gloo-body",
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": "unskip,gloo-body",
    "test_accumulate_gradients_no_sync_grad_is_view": "unskip,gloo-body",
    "test_all_gather": "",
    "test_all_gather_coalesced_complex": "",
    "test_all_gather_coalesced_full_group": "",
    "test_all_gather_coalesced_simple": "",
    "test_all_gather_coalesced_with_empty": "",
    "test_all_gather_complex": "",
    "test_all_gather_full_group": "",
    "test_all_gather_object_default_pg": "unskip",
    "test_all_gather_object_subgroup": "unskip",
    "test_all_reduce_coalesced_full_group_max": "unskip",
    "test_all_reduce_coalesced_full_group_min": "unskip",
    "test_all_reduce_coalesced_full_group_product": "unskip",
    "test_all_reduce_coalesced_full_group_sum": "unskip",
    "test_all_reduce_coalesced_max": "unskip",
    "test_all_reduce_coalesced_max_complex_unsupported": "",
    "test_all_reduce_coalesced_min": "unskip",
    "test_all_reduce_coalesced_product": "unskip",
    "test_all_reduce_coalesced_sum": "unskip",
    "test_all_reduce_complex_unsupported_ops": "",
    "test_all_reduce_full_group_max": "",
    "test_all_reduce_full_group_min": "",
    "test_all_reduce_full_group_product": "",
    "test_all_reduce_full_group_sum": "",
    "test_all_reduce_max": "",
    "test_all_reduce_min": "",
    "test_all_reduce_product": "",
    "test_all_reduce_sum": "",
    "test_all_reduce_sum_async": "",
    "test_all_reduce_sum_complex": "",
    "test_barrier": "",
    "test_barrier_full_group": "",
    "test_barrier_timeout_full_group": "unskip",
    "test_batch_isend_irecv_gloo": "unskip",
    "test_batch_isend_irecv_gloo_tags": "unskip",
    "test_broadcast": "",
    "test_broadcast_full_group": "",
    "test_ddp_create_graph": "",
    "test_ddp_logging_data_cpu": "",
    "test_destroy_full_group": "",
    "test_destroy_group": "",
    "test_dump_DDP_relevant_env_vars": "",
    "test_gather": "",
    "test_gather_checks": "",
    "test_gather_full_group": "",
    "test_get_backend": "",
    "test_get_future": "unskip",
    "test_get_rank": "",
    "test_get_rank_size_full_group": "",
    "test_get_rank_size_group": "",
    "test_grads_same_across_ranks_with_no_sync": "unskip",
    "test_irecv": "",
    "test_isend": "",
    "test_isend_autograd_profiler": "",
    "test_isend_torch_profiler": "",
    "test_monitored_barrier_gloo": "unskip",
    "test_monitored_barrier_gloo_rank_0_timeout": "unskip",
    "test_monitored_barrier_gloo_subgroup": "unskip",
    "test_reduce_full_group_max": "",
    "test_reduce_full_group_min": "",
    "test_reduce_full_group_product": "",
    "test_reduce_full_group_sum": "",
    "test_reduce_max": "",
    "test_reduce_min": "",
    "test_reduce_product": "",
    "test_reduce_sum": "",
    "test_reduce_sum_twice": "",
    "test_scatter": "",
    "test_scatter_checks": "",
    "test_scatter_complex": "",
    "test_scatter_full_group": "",
    "test_scatter_object_list": "unskip",
    "test_send_recv": "",
    "test_send_recv_any_source": "",
    "test_send_recv_any_source_autograd_profiler": "",
    "test_send_recv_any_source_torch_profiler": "",
    "test_send_recv_autograd_profiler": "",
    "test_send_recv_torch_profiler": "",
    "test_send_recv_with_tag": "",
    "test_send_recv_with_tag_autograd_profiler": "",
    "test_send_recv_with_tag_torch_profiler": "",
    "test_sparse_all_reduce_sum": "unskip",
    "test_static_graph_api_cpu": "",
}

EXCEPTIONS = {  # test -> why it cannot pass on any backend but gloo
    "test_monitored_barrier_gloo":
        "torch restricts it: torch.distributed.monitored_barrier raises 'monitored_barrier is only"
        " implemented for GLOO backend' unless get_backend(group) == 'gloo' (ddplug's group has"
        " monitored_barrier; torch never calls it)",
    "test_monitored_barrier_gloo_subgroup": "the same torch check, on a subgroup",
}


def first_error_line(text: str) -> str:
    """The exception line of the first failing rank ('Process i exited with
    error code 10 and exception:'), else the first exception line."""
    lines = [re.sub(r"^E {1,11}", "", ln) for ln in (text or "").splitlines()]
    body = "\n".join(lines)
    m = re.search(r"Process \d+ exited with error code \d+ and exception:\n(.*?)(?=\nProcess \d+ exited with|"
                  r"\nTo execute this test|\Z)", body, re.S)
    block = [ln for ln in (m.group(1) if m else body).splitlines() if ln.strip()]
    for ln in reversed(block) if m else block:
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Timeout|Lost|Aborted|Unsupported|Mismatch)\b", ln):
            return ln.strip()[:300]
    return (block[-1] if block else "").strip()[:300]


def outcomes(xml: Path) -> dict:
    got = {}
    if not xml.exists():
        return got
    for tc in ET.parse(xml).getroot().iter("testcase"):
        fail = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if fail is not None:
            got[tc.get("name")] = ("failed", first_error_line(fail.text or fail.get("message") or ""))
        elif tc.find("skipped") is not None:
            got[tc.get("name")] = ("skipped", tc.find("skipped").get("message") or "")
        else:
            got[tc.get("name")] = ("passed", "")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world-sizes", default="2,3")
    ap.add_argument("--build", default=os.environ.get("DDPLUG_BUILD_DIR", str(ROOT / "build")))
    ap.add_argument("--out", default=None, help="JUnit XML and logs (default: a temporary folder)")
    ap.add_argument("--backend", default="ddplug", choices=["ddplug", "gloo"])
    ap.add_argument("--all", action="store_true", help="every test of the suite, not the selection")
    ap.add_argument("--test-timeout", type=int, default=120, help="per test, as a hang guard")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="torchsuite-out-"))
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "hosts" / "python")]
                                        + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["DDPLUG_BUILD_DIR"] = str(Path(args.build).resolve())
    env.setdefault("DDPLUG_LOG", "error")
    env["DDPLUG_CONFIG"] = json.dumps({"plugin": "cpu", "rendezvous": {"timeout_s": 60}})
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONWARNINGS="ignore",
               TORCHSUITE_BACKEND=args.backend, TORCHSUITE_START="fork",
               DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(args.test_timeout))
    if args.backend == "ddplug":
        env["TORCHSUITE_UNSKIP"] = ",".join(t for t, f in SELECTION.items() if "unskip" in f)
        env["TORCHSUITE_GLOO_BODY"] = ",".join(t for t, f in SELECTION.items() if "gloo-body" in f)
    cls = "TestDistBackend" + args.backend.capitalize()
    tests = [f"dist_suite.py::{cls}"] if args.all else [f"dist_suite.py::{cls}::{t}" for t in SELECTION]
    unexpected = []
    for world in [int(w) for w in args.world_sizes.split(",")]:
        xml = out / f"junit-{args.backend}-w{world}.xml"
        tmp = tempfile.mkdtemp(prefix="torchsuite-")
        os.makedirs(os.path.join(tmp, "barrier"), exist_ok=True)
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN", "--rootdir", str(HERE),
               "-o", "junit_family=xunit1", f"--junitxml={xml}", *tests]
        t0 = time.monotonic()
        log = out / f"log-{args.backend}-w{world}.txt"
        with open(log, "w") as f:
            subprocess.run(cmd, cwd=str(HERE), env=dict(env, WORLD_SIZE=str(world), TEMP_DIR=tmp),
                           stdout=f, stderr=subprocess.STDOUT)
        got = outcomes(xml)
        counts = {k: sum(1 for v in got.values() if v[0] == k) for k in ("passed", "failed", "skipped")}
        print(f"world size {world}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']}"
              f" skipped in {time.monotonic() - t0:.0f} s (log: {log})", flush=True)
        if args.all:
            continue
        for t in SELECTION:
            want = "failed" if args.backend == "ddplug" and t in EXCEPTIONS else "passed"
            have, msg = got.get(t, ("not run", ""))
            if have != want:
                unexpected.append(f"world {world}: {t}: expected {want}, got {have}" + (f": {msg}" if msg else ""))
            if have == "failed" and t in EXCEPTIONS:
                print(f"  exception (expected to fail): {t}: {EXCEPTIONS[t]}")
    for u in unexpected:
        print("UNEXPECTED", u)
    return 1 if unexpected else 0


if __name__ == "__main__":
    sys.exit(main())
