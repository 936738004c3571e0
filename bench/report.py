#!/usr/bin/env python3
"""report.py — `make bench`: every side-by-side benchmark that runs on this
machine, then JSON, PNG plots (matplotlib) and a short markdown report.

    .venv/bin/python bench/report.py --build build --out out/bench [--publish docs/perf]
        [--only allreduce,sampler,lightning,torch,nccl] [--quick] [--note TEXT]
        [--before TREE --before-build DIR]

Benchmarks (each prints its own table as it runs, beside its anchor):
  allreduce  bench/compare_allreduce.py: the cpu plugin against torch gloo (TCP,
             and with LOCAL_WORLD_SIZE set), 2 ranks, 8 B .. 64 MiB, with the
             memory-traffic bound from this machine's copy bandwidth
             -> allreduce.json, allreduce_busbw.png (busbw against size)
  sampler    ddplug-sampler-perf against bench/torch_sampler_perf.py
             (DistributedSampler), world 8, one rank measured, N = 1e5 .. 3e7
             -> sampler.json, sampler.png (epoch-start time and extra memory
             against N)
  lightning  bench/lightning_step.py --phases: step time of the ddplug strategy
             against DDPStrategy (gloo) configurations and the 1-rank floor,
             and where each step's time goes on every rank (the phase tables)
             -> lightning_step.json, lightning_step.png (median step time per
             configuration)
  torch      bench/torch_backend_perf.py: torch.distributed.all_reduce on the
             ddplug backend against gloo and ddplug's own path, 8 B ..
             64 MiB, and --profile: the layers of an 8-byte call
             -> torch_backend.json
  nccl       ddplug-nccl-overhead (the nccl plugin against direct
             ncclAllReduce), only where a GPU is visible; otherwise listed as
             skipped with the reason
The report (report.md) names the machine (CPU model, cores, memory, torch), the
commit and the commands; --note adds a sentence (e.g. that the machine was
shared). --before TREE (with --before-build DIR when its build is not
TREE/build) adds that tree's rows beside this one's in the same run: its
ddplug strategy in the Lightning tables, its ddplug-allreduce-perf in the
allreduce table. --publish copies the PNGs and report.md to a directory (the README's
performance section shows docs/perf). --quick makes every benchmark short (a
smoke run of the whole pipeline, not numbers to quote).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def run(cmd: list, env: dict | None = None, log: Path | None = None) -> int:
    print("$ " + " ".join(str(c) for c in cmd), flush=True)
    p = subprocess.run([str(c) for c in cmd], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True)
    sys.stdout.write(p.stdout)
    if log:
        log.write_text(p.stdout)
    if p.returncode != 0:
        print(f"# command failed with status {p.returncode}", flush=True)
    return p.returncode


def machine() -> dict:
    info = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version()}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                info["cpu"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    try:
        with open("/proc/meminfo") as f:
            kib = int(f.readline().split()[1])
        info["memory_gib"] = round(kib / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        info["commit"] = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                        capture_output=True, text=True).stdout.strip()
    except OSError:
        pass
    info["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return info


def shown(cmd: list) -> str:
    """A command as the report shows it: paths relative to the checkout."""
    return " ".join(str(c) for c in cmd).replace(str(ROOT) + "/", "")


def human(n: float) -> str:
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{int(n // div)}{unit}"
    return str(int(n))


# ---- benchmarks ------------------------------------------------------------------

def bench_allreduce(a, env, out: Path) -> dict | None:
    d = out / "allreduce"
    e = "1M" if a.quick else "64M"
    cmd = [sys.executable, HERE / "compare_allreduce.py", "--build", a.build, "-n", "2", "-b", "8", "-e", e,
           "--out", d]
    if a.before:
        cmd += ["--before", before_build(a)]
    if run(cmd, env, out / "allreduce.log") != 0 or not (d / "summary.json").exists():
        return None
    s = json.loads((d / "summary.json").read_text())
    s["command"] = shown(cmd[1:])
    return s


def bench_sampler(a, env, out: Path) -> dict | None:
    ns = [10**4, 10**5] if a.quick else [10**5, 10**6, 10**7, 3 * 10**7]
    rows = {"ddplug": [], "torch": []}
    perf = Path(a.build) / "bin" / "ddplug-sampler-perf"
    for n in ns:
        j = out / f"sampler.ddplug.{n}.json"
        if run([perf, "-N", n, "-w", 8, "--ranks", 1, "--bucket-N", 1000, "--json", j], env) == 0:
            rows["ddplug"] += [r for r in json.loads(j.read_text())["rows"] if r["sampler"] == "distributed"]
        j = out / f"sampler.torch.{n}.json"
        if run([sys.executable, HERE / "torch_sampler_perf.py", "-N", n, "-w", 8, "--ranks", 1, "--json", j],
               env) == 0:
            rows["torch"] += json.loads(j.read_text())["rows"]
    if not rows["ddplug"] and not rows["torch"]:
        return None
    return {"world": 8, "ranks_measured": 1, "rows": rows,
            "command": shown([perf, "-N N -w 8 --ranks 1; bench/torch_sampler_perf.py -N N -w 8 --ranks 1"])}


def before_build(a) -> str:
    return str(Path(a.before_build or Path(a.before) / "build").resolve())


def bench_lightning(a, env, out: Path) -> dict | None:
    j = out / "lightning_step.raw.json"
    steps = ["--steps", "4", "--warmup", "2", "--models", "mlp"] if a.quick else \
        ["--steps", "20", "--warmup", "3", "--rounds", "2"]
    cmd = [sys.executable, HERE / "lightning_step.py", *steps, "--phases", "--json", j]
    if a.before:
        cmd += ["--before", str(Path(a.before).resolve()), "--before-build", before_build(a)]
    if run(cmd, env, out / "lightning_step.log") != 0 or not j.exists():
        return None
    r = json.loads(j.read_text())
    r["command"] = shown(cmd[1:])
    return r


def bench_torch(a, env, out: Path) -> dict | None:
    j = out / "torch_backend.raw.json"
    sizes = ["-b", "8", "-e", "1M", "-f", "16", "--repeat", "1"] if a.quick else ["-b", "8", "-e", "64M"]
    cmd = [sys.executable, HERE / "torch_backend_perf.py", *sizes, "--json", j]
    if run(cmd, env, out / "torch_backend.log") != 0 or not j.exists():
        return None
    r = json.loads(j.read_text())
    r["command"] = shown(cmd[1:])
    prof = [sys.executable, HERE / "torch_backend_perf.py", "--profile", "--repeat", "1" if a.quick else "3"]
    p = subprocess.run([str(c) for c in prof], env=env, capture_output=True, text=True)
    (out / "torch_backend_profile.log").write_text(p.stdout + p.stderr)
    lines = p.stdout.splitlines()
    r["profile"] = [ln for ln in lines if ln.startswith("|")] if p.returncode == 0 else []
    r["profile_command"] = shown(prof[1:])
    return r


def gpu_visible(a, env) -> str | None:
    """None when a GPU can run the nccl plugin, else why not."""
    perf = Path(a.build) / "bin" / "ddplug-nccl-overhead"
    if not perf.exists():
        return "ddplug-nccl-overhead was not built (no CUDA toolkit or NCCL at configure time)"
    if shutil.which("nvidia-smi") is None:
        return "no GPU visible (no nvidia-smi)"
    p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    if p.returncode != 0 or "GPU" not in p.stdout:
        return "no GPU visible (nvidia-smi -L lists none)"
    return None


def bench_nccl(a, env, out: Path) -> dict:
    why = gpu_visible(a, env)
    if why:
        return {"skipped": why}
    j = out / "nccl_overhead.raw.json"
    cmd = [Path(a.build) / "bin" / "ddplug-nccl-overhead", "-n", "1", "-b", "8", "-e", "64M", "--json", j]
    if run(cmd, env, out / "nccl_overhead.log") != 0 or not j.exists():
        return {"skipped": "ddplug-nccl-overhead failed (see nccl_overhead.log)"}
    r = json.loads(j.read_text())
    r["command"] = shown(cmd)
    return r


# ---- plots -------------------------------------------------------------------------

def plot_allreduce(plt, s: dict, path: Path, m: dict) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    labels = {"ddplug": "ddplug (cpu plugin)", "gloo_tcp": "torch gloo (TCP)",
              "gloo_shm": "torch gloo (shared memory)" if s.get("gloo_shm_used")
              else "torch gloo, LOCAL_WORLD_SIZE set (TCP path)"}
    styles = {"ddplug": "o-", "gloo_tcp": "s--", "gloo_shm": "^:"}
    for k, rows in s["rows"].items():
        rows = [r for r in rows if r["busbw"] > 0]
        if rows:
            ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], styles.get(k, "-"),
                    label=labels.get(k, k), markersize=4)
    ax.axhline(s["bound_busbw"], color="gray", linestyle="-.",
               label=f"memory-traffic bound ({s['bound_busbw']:.1f} GB/s)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"allreduce {s['dtype']} sum, {s['ranks']} ranks, one node")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.text(0.01, 0.01, f"{m['cpu']}, {m['cores']} cores", fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_sampler(plt, s: dict, path: Path, m: dict) -> None:
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(10, 4.2))
    series = [("ddplug", True, "ddplug distributed, shuffled", "o-"),
              ("ddplug", False, "ddplug distributed, sequential", "o--"),
              ("torch", True, "torch DistributedSampler, shuffled", "s-"),
              ("torch", False, "torch DistributedSampler, sequential", "s--")]
    for src, shuffle, label, style in series:
        rows = sorted((r for r in s["rows"][src] if r["shuffle"] == shuffle), key=lambda r: r["N"])
        if not rows:
            continue
        t_ax.plot([r["N"] for r in rows], [max(r["epoch_start_us"], 1e-3) for r in rows], style, label=label,
                  markersize=4)
        m_ax.plot([r["N"] for r in rows], [r["extra_memory_kib"] / 1024 for r in rows], style, label=label,
                  markersize=4)
    t_ax.set_xscale("log")
    t_ax.set_yscale("log")
    t_ax.set_xlabel("N (samples)")
    t_ax.set_ylabel("epoch start: time to the first index (µs)")
    t_ax.grid(True, which="both", alpha=0.3)
    m_ax.set_xscale("log")
    m_ax.set_xlabel("N (samples)")
    m_ax.set_ylabel("extra memory of one rank's sampler (MiB)")
    m_ax.grid(True, which="both", alpha=0.3)
    t_ax.legend(fontsize=7)
    fig.suptitle(f"samplers: world size {s['world']}, one rank measured")
    fig.text(0.01, 0.01, f"{m['cpu']}, {m['cores']} cores", fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_lightning(plt, s: dict, path: Path, m: dict) -> None:
    models = list(s["models"])
    fig, axes = plt.subplots(1, len(models), figsize=(5.5 * len(models), 4.2), squeeze=False)
    for ax, model in zip(axes[0], models):
        rows = s["models"][model]
        names = [r["config"] for r in rows]
        med = [r["median_ms"] for r in rows]
        colors = ["tab:orange" if r["strategy"] == "ddplug" else "tab:gray" if r["strategy"] == "single"
                  else "tab:blue" for r in rows]
        y = range(len(rows))
        ax.barh(list(y), med, color=colors)
        ax.set_yticks(list(y))
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        for i, v in enumerate(med):
            ax.text(v, i, f" {v:.0f}", va="center", fontsize=8)
        params = rows[0]["params"] / 1e6 if rows else 0
        ax.set_title(f"{model}: {params:.0f} M parameters", fontsize=10)
        ax.set_xlabel("median step time (ms), lower is better")
        ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(f"Lightning training step, 2 CPU ranks, batch {s['batch']} per rank")
    fig.text(0.01, 0.01, f"{m['cpu']}, {m['cores']} cores", fontsize=7, color="gray")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- report ------------------------------------------------------------------------

def markdown(res: dict, m: dict, note: str) -> str:
    L = ["# ddplug benchmarks", ""]
    L.append(f"Machine: {m['cpu']}, {m['cores']} cores, {m.get('memory_gib', '?')} GiB; Linux {m['kernel']};"
             f" Python {m['python']}, torch {m.get('torch', '-')}; commit {m.get('commit', '-')}; {m['date']}.")
    if note:
        L.append(note)
    L.append("")
    a = res.get("allreduce")
    if a:
        L += ["## Allreduce: the cpu plugin against gloo", "",
              f"`{a['command']}`. Copy bandwidth {a['copy_bw']:.1f} GB/s gives the memory-traffic bound"
              f" busbw ≤ {a['bound_busbw']:.2f} GB/s ({a['ranks']} ranks).", "",
              "![allreduce busbw](allreduce_busbw.png)", "",
              "| size | ddplug µs | busbw GB/s | gloo TCP µs | busbw GB/s | gloo ÷ ddplug |",
              "|---:|---:|---:|---:|---:|---:|"]
        gt = {r["size"]: r for r in a["rows"].get("gloo_tcp", [])}
        for r in a["rows"].get("ddplug", []):
            g = gt.get(r["size"])
            L.append(f"| {human(r['size'])} | {r['time_us']:.1f} | {r['busbw']:.2f} | "
                     f"{g['time_us']:.1f} | {g['busbw']:.2f} | {g['time_us'] / r['time_us']:.1f}x |" if g else
                     f"| {human(r['size'])} | {r['time_us']:.1f} | {r['busbw']:.2f} | - | - | - |")
        L.append("")
    s = res.get("sampler")
    if s:
        L += ["## Samplers: ddplug's distributed sampler against DistributedSampler", "",
              f"`{s['command']}`", "", "![samplers](sampler.png)", "",
              "| sampler | shuffle | N | epoch start µs | extra memory MiB | indices/s |",
              "|---|---|---:|---:|---:|---:|"]
        for src in ("ddplug", "torch"):
            for r in sorted(s["rows"][src], key=lambda r: (not r["shuffle"], r["N"])):
                name = "ddplug distributed" if src == "ddplug" else "torch DistributedSampler"
                L.append(f"| {name} | {'yes' if r['shuffle'] else 'no'} | {r['N']:,} | {r['epoch_start_us']:.1f} |"
                         f" {r['extra_memory_kib'] / 1024:.1f} | {r['indices_per_s_per_rank'] / 1e6:.1f} M |")
        L.append("")
    lt = res.get("lightning")
    if lt:
        L += ["## Lightning step time", "", f"`{lt['command']}`", "", "![Lightning step](lightning_step.png)", ""]
        for model, rows in lt["models"].items():
            L += [f"{model}:", "", "| configuration | median ms | mean ms | vs ddp default |", "|---|---:|---:|---:|"]
            for r in rows:
                vd = f"{r['vs_ddp_default']:.2f}x" if r.get("vs_ddp_default") else "-"
                L.append(f"| {r['config']} | {r['median_ms']:.1f} | {r['mean_ms']:.1f} | {vd} |")
            L.append("")
            L += phase_table(model, rows)
    t = res.get("torch")
    if t:
        L += ["## torch.distributed.all_reduce on the ddplug backend", "", f"`{t['command']}`", "",
              "| size | ddplug µs | own path µs | gloo µs | vs own | wrong |", "|---:|---:|---:|---:|---:|---:|"]
        for r in t["rows"]:
            L.append(f"| {r['size']} | {r['ddplug']:.1f} | {r['own']:.1f} | {r['gloo']:.1f} | {r['vs_own']:.2f}x |"
                     f" {r['wrong']} |")
        L.append("")
        if t.get("floor_us") is not None:
            L += [f"torch.distributed's own cost per 8-byte `dist.all_reduce` in the same run, on a group that does"
                  f" nothing (the floor of every backend): {t['floor_us']:.1f} µs.", ""]
        if t.get("profile"):
            L += [f"An 8-byte call, layer by layer (`{t['profile_command']}`):", ""] + t["profile"] + [""]
    n = res.get("nccl")
    if n is not None:
        L += ["## GPU allreduce overhead (nccl plugin against ncclAllReduce)", ""]
        L.append(f"Skipped: {n['skipped']}." if "skipped" in n else f"`{n['command']}`; see nccl_overhead.json.")
        L.append("")
    for k in ("allreduce", "sampler", "lightning", "torch"):
        if k in res and res[k] is None:
            L.append(f"{k}: the benchmark failed; see its log in this directory.")
    return "\n".join(L) + "\n"


PHASES = ["forward", "zero_grad", "backward", "copy-in", "start", "wait", "copy-out", "sync", "optimizer"]


def phase_table(model: str, rows: list) -> list:
    """Where a step's time goes (bench/lightning_step.py --phases): a row per
    configuration and rank, wall ms per phase; CPU ms and page faults per step."""
    if not any(r.get("phases") for r in rows):
        return []
    cols = [c for c in PHASES if any(c in ph for r in rows for ph in r.get("phases", {}).values())]
    L = [f"Phases of a {model} step, median wall ms per phase on each rank; per step the process's CPU ms,"
         " the main thread's page faults and the other threads' (progress, completion) CPU ms:", "",
         "| configuration, rank | " + " | ".join(cols) + " | total | CPU | faults | helpers CPU |",
         "|---|" + "---:|" * (len(cols) + 4)]
    for r in rows:
        for rank, ph in sorted(r.get("phases", {}).items()):
            cells = " | ".join(f"{ph[c]['wall_ms']:.1f}" if c in ph else "" for c in cols)
            t = ph["total"]
            L.append(f"| {r['config']}, r{rank} | {cells} | {t['wall_ms']:.1f} | {t['cpu_ms']:.1f} |"
                     f" {t['faults']:.0f} | {t.get('helpers_cpu_ms', 0):.1f} |")
    return L + [""]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--out", default="out/bench")
    p.add_argument("--publish", default=None, help="also copy the plots and report.md here")
    p.add_argument("--only", default="allreduce,sampler,lightning,torch,nccl")
    p.add_argument("--quick", action="store_true", help="short runs: a smoke test of the pipeline")
    p.add_argument("--note", default="", help="a sentence for the report (e.g. the machine was shared)")
    p.add_argument("--before", default=None, help="another source tree whose rows run beside this one's")
    p.add_argument("--before-build", default=None, help="its build folder (default TREE/build)")
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    a.build = str(Path(a.build).resolve())
    env = dict(os.environ)
    env.setdefault("DDPLUG_BUILD_DIR", a.build)
    env.setdefault("DDPLUG_PLUGIN_PATH", str(Path(a.build) / "lib"))
    env["PYTHONPATH"] = os.pathsep.join(x for x in [str(ROOT / "hosts" / "python"),
                                                    env.get("PYTHONPATH", "")] if x)
    m = machine()
    only = set(a.only.split(","))
    res: dict = {"machine": m, "note": a.note}
    plots = []
    for name, run, plot, png, js in (
            ("allreduce", bench_allreduce, plot_allreduce, "allreduce_busbw.png", "allreduce.json"),
            ("sampler", bench_sampler, plot_sampler, "sampler.png", "sampler.json"),
            ("lightning", bench_lightning, plot_lightning, "lightning_step.png", "lightning_step.json"),
            ("torch", bench_torch, None, None, "torch_backend.json")):
        if name not in only:
            continue
        res[name] = run(a, env, out)
        if res[name]:
            if plot is not None:
                plot(plt, res[name], out / png, m)
                plots.append(png)
            (out / js).write_text(json.dumps(res[name], indent=1))
    if "nccl" in only:
        res["nccl"] = bench_nccl(a, env, out)
        (out / "nccl_overhead.json").write_text(json.dumps(res["nccl"], indent=1))
    (out / "bench.json").write_text(json.dumps(res, indent=1))
    (out / "report.md").write_text(markdown(res, m, a.note))
    print(f"\nbench: wrote {out / 'bench.json'}, {out / 'report.md'} and {', '.join(plots) or 'no plots'}")
    if a.publish:
        dest = Path(a.publish)
        dest.mkdir(parents=True, exist_ok=True)
        for f in plots + ["report.md"]:
            shutil.copy(out / f, dest / f)
        print(f"bench: copied {', '.join(plots + ['report.md'])} to {dest}")
    failed = [k for k in ("allreduce", "sampler", "lightning", "torch") if k in res and res[k] is None]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
