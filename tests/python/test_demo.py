"""`make demo` end to end (examples/demo.sh -> examples/lightning/train.py), 2 CPU
ranks, with fewer sequences than the default to keep the suite short: the lines
the README promises — plugin and ABI versions, each loader's owner decision, the
audit reports, steps per epoch and samples/s."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import ROOT, free_port


def test_demo_runs_end_to_end(tmp_path: Path) -> None:
    venv = Path(sys.executable).parents[1]  # demo.sh runs VENV/bin/python
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    proc = subprocess.run(
        ["bash", str(ROOT / "examples" / "demo.sh"), os.environ["DDPLUG_BUILD_DIR"], str(venv),
         "--samples", "1024"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=240,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-6000:]
    # every registered gradient bucket (the first plan's too, replaced when the
    # buckets follow the backward order) is freed before the context closes
    assert "still allocated" not in out + proc.stderr, (out + proc.stderr)[-6000:]
    assert re.search(r"^ddplug: plugin cpu \S+ \(plugin ABI \d+\.\d+\), 2 ranks on 1 node\(s\), library \S+"
                     r" \(host ABI \d+\.\d+\)$", out, re.M), out
    owners = dict(re.findall(r"^ddplug: stream '(\w+)': owner plugin \(auto: [^)]*\); ddplug's length-bucketed"
                             r" batch sampler; (\d+) batches per epoch per rank$", out, re.M))
    assert set(owners) == {"train"}, out  # bucketing and padding for train only
    assert re.search(r"^ddplug: stream 'val': owner plugin \(auto: [^)]*\); ddplug's distributed sampler \(exact:"
                     r" every sample once\); 8 batches per epoch per rank$", out, re.M), out
    reports = re.findall(r"^ddplug audit: stream '(\w+)'(?: \(evaluation\))?, epoch (\d), 2 ranks, N = (\d+).*\n"
                         r"  verdict: (\w+)$", out, re.M)
    assert sorted(reports) == [("train", "0", "1024", "PASS"), ("train", "1", "1024", "PASS"),
                               ("val", "0", "256", "PASS"), ("val", "1", "256", "PASS")], out
    # the validation stream carries no repeats: 256 deliveries of 256 samples
    assert re.search(r"^ddplug audit: stream 'val' \(evaluation\), epoch 0, 2 ranks, N = 256 \(exact\)\n"
                     r"(?:  .*\n)*?  repeats: 0 \(declared padding 0\); never delivered: 0", out, re.M), out
    epochs = re.findall(r"^demo: epoch (\d): (\d+) steps per epoch per rank, (\d+) samples on 2 ranks in \S+ s ="
                        r" [\d,]+ samples/s, val_acc [\d.]+$", out, re.M)
    steps = int(owners["train"])
    assert [(e, int(s), int(n)) for e, s, n in epochs] == [("0", steps, 2 * steps * 16), ("1", steps, 2 * steps * 16)]
