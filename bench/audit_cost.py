"""The data-split audit's cost, side by side with its anchors:

1. ``ddplug-audit-cost`` at N = 1e6 and 1e8 on 8 ranks: time per epoch of the
   sampler alone and of the sampler with the audit (recording + the collective
   finish), and the audit's memory;
2. its share of the ``make demo`` epoch: a real run of examples/demo.sh (the
   Trainer's epoch, validation included) prints the time spent in the audit
   calls (begin, the collective finish, the report, from Python) on the rank
   that spent least: a rank that reaches the collective finish early also
   waits there for the others, which is skew, not the audit's cost; the
   recording inside ddplug's sampler is measured here with the demo's streams
   (4096 training samples through the bucket sampler, 1024 validation samples
   split exactly, 2 ranks) and added; the sum is divided by the epoch time.

    .venv/bin/python bench/audit_cost.py [--build build] [--skip-large] [--json FILE]

Prints a table and one JSON line. Times depend on the machine's other load: the
rows of one run are comparable; rerun on a quiet machine for final numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cost(build: Path, *args: str) -> dict:
    env = dict(os.environ, DDPLUG_PLUGIN_PATH=str(build / "lib"))
    out = subprocess.run([str(build / "bin" / "ddplug-audit-cost"), *args], env=env, check=True,
                         capture_output=True, text=True, timeout=1800).stdout
    sys.stdout.write(out)
    return json.loads(out.strip().splitlines()[-1])


def demo_epoch_s(build: Path, venv: Path, epochs: int = 3) -> tuple:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000))
    out = subprocess.run(["bash", str(ROOT / "examples" / "demo.sh"), str(build), str(venv),
                          "--epochs", str(epochs)], env=env, check=True, capture_output=True, text=True,
                         timeout=1800, cwd=str(ROOT)).stdout
    times = [float(t) for t in re.findall(r"^demo: epoch \d+: .* in ([\d.]+) s =", out, re.M)]
    audits = [float(t) / 1000 for t in re.findall(r"^demo: epoch \d+: the data-split audit .* took ([\d.]+) ms",
                                                    out, re.M)]
    if len(times) != epochs or len(audits) != epochs:
        raise SystemExit(f"bench/audit_cost.py: could not read the demo's epoch times:\n{out[-3000:]}")
    return times, audits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--venv", default=str(Path(sys.executable).parents[1]))
    p.add_argument("--skip-large", action="store_true", help="skip N = 1e8 (needs ~2 GiB and minutes on 2 cores)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    build, venv = Path(a.build).resolve(), Path(a.venv)
    ns = "1000000" if a.skip_large else "1000000,100000000"
    large = cost(build, "-N", ns, "-w", "8", "--epochs", "2", "--batch", "64")
    train = cost(build, "-N", "4096", "-w", "2", "--epochs", "5", "--kind", "bucket", "--boundaries",
                 "16,32,64,96", "--batch", "16")
    val = cost(build, "-N", "1024", "-w", "2", "--epochs", "5", "--batch", "16", "--evaluation")
    epochs, in_demo = demo_epoch_s(build, venv)
    epoch = min(epochs[1:]) if len(epochs) > 1 else epochs[0]  # the first epoch pays warm-up
    # recording (inside the sampler, measured by the C program) + what the demo
    # measured of begin, the collective finish and the report (Python included)
    record = (train["rows"][0]["audited_s"] - train["rows"][0]["finish_s"] - train["rows"][0]["anchor_s"]) + \
             (val["rows"][0]["audited_s"] - val["rows"][0]["finish_s"] - val["rows"][0]["anchor_s"])
    audit = max(0.0, record) + max(in_demo[1:] if len(in_demo) > 1 else in_demo)
    share = 100.0 * audit / epoch
    print()
    print(f"{'what':44} {'per epoch':>12}")
    for r in large["rows"]:
        print(f"{'N = %d, 8 ranks: sampler alone (anchor)' % r['N']:44} {r['anchor_s']:11.4f}s")
        print(f"{'N = %d, 8 ranks: audit (record + finish)' % r['N']:44} {r['cost_s']:11.4f}s"
              f"   finish {r['finish_s']:.4f}s, bitmap {r['bitmap_bytes'] / 2**20:.2f} MiB per rank")
    print(f"{'make demo: epoch (anchor, 2 ranks)':44} {epoch:11.4f}s   epochs {', '.join(f'{t:.2f}' for t in epochs)}")
    print(f"{'make demo: audit of train + val':44} {audit:11.4f}s   = {share:.2f}% of the epoch (goal <= 2%);"
          f" in the demo's epochs: {', '.join(f'{1000 * t:.1f} ms' for t in in_demo)}")
    summary = {"bench": "audit_cost", "large": large["rows"], "demo": {
        "epoch_s": epoch, "epochs_s": epochs, "train_audit_s": train["rows"][0]["cost_s"],
        "val_audit_s": val["rows"][0]["cost_s"], "in_demo_s": in_demo, "audit_s": audit,
        "share_percent": share}}
    print(json.dumps(summary))
    if a.json:
        Path(a.json).write_text(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
