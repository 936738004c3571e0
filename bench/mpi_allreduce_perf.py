#!/usr/bin/env python3
"""mpi_allreduce_perf.py — the mpi plugin side by side with what it is
measured against, in one run (tables, JSON, and a plot when matplotlib is
there):

  one node, 2 ranks (busbw by size; 8 B latency):
    cpu plugin          ddplug-allreduce-perf -n 2 --plugin cpu
    mpi, flat           the mpi plugin, intra_node "mpi" (MPI's own shared memory)
    mpi, flat, no check the same with check_mismatch "off" (what the check costs)
    mpi via cpu         intra_node "cpu" (the node's part through the cpu plugin)
    MPI_Allreduce       ddplug-mpi-raw-perf-<family>, the same MPI without ddplug
  network namespaces (tests/netns/netns.sh; skipped where not permitted), links
  limited to --rate (5 Gbit/s):
    2 x 1 rank: mpi plugin, gloo (torch, TCP), cpu plugin's TCP ring, MPI_Allreduce;
                the link's bound on busbw is the rate itself
    2 x 2 ranks: mpi plugin via cpu (hierarchical) and flat
    the 8-byte rows of both are the latency comparison
  --lightning: bench/lightning_step.py's DDP(gloo) beside ddplug-on-mpi on 2
    namespaces x 1 rank (one step time each).

    python bench/mpi_allreduce_perf.py --build build [--family openmpi|mpich]
        [-b 8] [-e 64M] [--rate 5gbit] [--json out.json] [--plot out.png] [--quick]

Numbers mean something only on a quiet machine; --quick is a smoke test of the
pipeline (few sizes, short runs). What "intra_node": "auto" should pick is
printed at the end (the size from which the cpu plugin's shared memory beats
MPI's inside a node, if any): plugins/mpi/hier.c's DDMPI_HIER_AUTO_MIN_BYTES.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NETNS = ROOT / "tests" / "netns" / "netns.sh"
NSRSH = ROOT / "tests" / "netns" / "nsrsh"
LAUNCHERS = {"openmpi": ["mpirun.openmpi", "--oversubscribe"], "mpich": ["mpiexec.hydra"]}


def parse_size(s: str) -> int:
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
    s = s.strip().lower().rstrip("b")
    return int(float(s[:-1]) * mult[s[-1]]) if s and s[-1] in mult else int(s)


def rate_gbytes(rate: str) -> float | None:
    """tc's rate ("5gbit": decimal bits per second) in GB/s: the bound on an
    allreduce's busbw over that link."""
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1.0}
    for u, f in units.items():
        if rate.endswith(u):
            return float(rate[:-len(u)]) * f / 8 / 1e9
    return None


def run(cmd: list, env: dict, timeout: float = 900) -> tuple:
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout + p.stderr


def rows_of(path: Path) -> list:
    try:
        return json.loads(path.read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return []


class Bench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.build = Path(a.build).resolve()
        self.tmp = Path(tempfile.mkdtemp(prefix="ddplug-mpi-bench-"))
        env = dict(os.environ)
        env.update(DDPLUG_PLUGIN_PATH=str(self.build / "lib"), DDPLUG_BUILD_DIR=str(self.build),
                   OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT / "hosts" / "python"), env.get("PYTHONPATH", "")]))
        for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "DDPLUG_CONFIG"):
            env.pop(k, None)
        self.env = env
        self.sizes = ["-b", a.b, "-e", a.e, "-f", str(a.f)] + (["-w", "1", "-i", "3"] if a.quick else [])
        self.results: dict = {"sizes": [a.b, a.e, a.f], "family": a.family, "rate": a.rate}

    def perf(self, label: str, cmd: list, env: dict | None = None) -> list:
        js = self.tmp / f"{label.replace(' ', '_').replace('/', '_')}.json"
        rc, out = run(cmd + ["--json", str(js)], env or self.env)
        rows = rows_of(js)
        if rc != 0 or not rows:
            print(f"# {label}: failed (exit {rc}): {out.strip()[-600:]}", file=sys.stderr)
        return rows

    # ---- one node ------------------------------------------------------------------
    def one_node(self) -> dict:
        b, fam = self.build / "bin", self.a.family
        mpirun = LAUNCHERS[fam] + ["-n", "2"]
        ddp = [str(b / "ddplug-allreduce-perf")] + self.sizes
        res = {
            "cpu plugin": self.perf("cpu", ddp + ["-n", "2", "--plugin", "cpu"]),
            "mpi, flat": self.perf("mpi-flat", mpirun + ddp + ["--plugin", "mpi", "--options",
                                                               '{"intra_node": "mpi"}']),
            "mpi, flat, no check": self.perf("mpi-nocheck", mpirun + ddp + [
                "--plugin", "mpi", "--options", '{"intra_node": "mpi", "check_mismatch": "off"}']),
            "mpi via cpu": self.perf("mpi-cpu", mpirun + ddp + ["--plugin", "mpi", "--options",
                                                                '{"intra_node": "cpu"}']),
        }
        raw = b / f"ddplug-mpi-raw-perf-{fam}"
        if raw.exists():
            res["MPI_Allreduce"] = self.perf("raw", mpirun + [str(raw)] + self.sizes)
        return res

    # ---- network namespaces ----------------------------------------------------------------
    def netns(self) -> dict | None:
        check = subprocess.run([str(NETNS), "check"], capture_output=True, text=True)
        if check.returncode != 0:
            print(f"# network namespaces: skipped ({check.stdout.strip()})")
            return None
        prefix = f"db{os.getpid() % 10000:04d}n"
        subprocess.run([str(NETNS), "up", prefix, "2", self.a.rate], check=True)
        try:
            return self._netns(prefix)
        finally:
            subprocess.run([str(NETNS), "down", prefix, "2"])

    def _ns(self, prefix: str, i: int) -> list:
        return [str(NETNS), "exec", prefix, str(i)]

    def _mpirun_ns(self, prefix: str, n: int, slots: int) -> list:
        hosts = self.tmp / f"hosts{slots}"
        fam = self.a.family
        fmt = "hydra" if fam == "mpich" else "ompi"
        hosts.write_text(subprocess.run([str(NETNS), "hosts", prefix, "2", str(slots), fmt],
                                        capture_output=True, text=True, check=True).stdout)
        if fam == "mpich":
            return self._ns(prefix, 1) + ["mpiexec.hydra", "-f", str(hosts), "-launcher", "rsh",
                                          "-launcher-exec", str(NSRSH), "-iface", "eth0", "-genv",
                                          "UCX_TLS", "tcp,self", "-genv", "UCX_NET_DEVICES", "eth0",
                                          "-n", str(n)]
        return self._ns(prefix, 1) + ["mpirun.openmpi", "--hostfile", str(hosts), "-n", str(n),
                                      "--mca", "plm_rsh_agent", str(NSRSH), "--mca", "oob_tcp_if_include",
                                      "10.77.0.0/24", "--mca", "btl_tcp_if_include", "10.77.0.0/24",
                                      "--mca", "pml", "ob1", "--mca", "btl", "tcp,self,vader",
                                      "-x", "DDPLUG_PLUGIN_PATH", "-x", "DDPLUG_BUILD_DIR"]

    def _two_ranks(self, prefix: str, label: str, argv_of) -> list:
        """Rank r in namespace r+1 with torchrun's variables (MASTER_ADDR:
        node 1); rank 0 writes the JSON."""
        js = self.tmp / f"ns-{label}.json"
        procs = []
        for r in range(2):
            env = dict(self.env, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                       NODE_RANK=str(r), MASTER_ADDR="10.77.0.1", MASTER_PORT="29555")
            if label.startswith("lightning"):
                env.pop("RANK")  # Lightning's own environment: NODE_RANK, LOCAL_RANK, WORLD_SIZE
            procs.append(subprocess.Popen(self._ns(prefix, r + 1) + argv_of(r, js), env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=900)[0] for p in procs]
        if label.startswith("lightning"):
            return []  # the caller reads its own JSON
        rows = rows_of(js)
        if not rows:
            print(f"# {label}: failed: {outs[0][-400:]} {outs[1][-400:]}", file=sys.stderr)
        return rows

    def _netns(self, prefix: str) -> dict:
        b, fam = self.build / "bin", self.a.family
        ddp = [str(b / "ddplug-allreduce-perf")] + self.sizes
        res: dict = {}
        res["2x1 mpi plugin"] = self.perf("ns-mpi", self._mpirun_ns(prefix, 2, 1) + ddp + [
            "--plugin", "mpi", "--options", '{"intra_node": "mpi"}'])
        raw = b / f"ddplug-mpi-raw-perf-{fam}"
        if raw.exists():
            res["2x1 MPI_Allreduce"] = self.perf("ns-raw", self._mpirun_ns(prefix, 2, 1) + [str(raw)]
                                                 + self.sizes)
        # The cpu plugin advertises its node's first non-loopback address:
        # in a namespace, eth0's.
        res["2x1 cpu plugin, TCP"] = self._two_ranks(
            prefix, "cpu", lambda r, js: ddp + ["--plugin", "cpu", "--json", str(js)])
        gloo = [sys.executable, str(ROOT / "bench" / "gloo_allreduce_perf.py"), "--worker", "--mode", "tcp"]
        res["2x1 gloo"] = self._two_ranks(
            prefix, "gloo", lambda r, js: gloo + self.sizes + ["--json", str(js)])
        res["2x2 mpi via cpu"] = self.perf("ns-hier", self._mpirun_ns(prefix, 4, 2) + ddp + [
            "--plugin", "mpi", "--options", '{"intra_node": "cpu"}'])
        res["2x2 mpi, flat"] = self.perf("ns-flat", self._mpirun_ns(prefix, 4, 2) + ddp + [
            "--plugin", "mpi", "--options", '{"intra_node": "mpi"}'])
        if self.a.lightning:
            res["lightning"] = self._lightning(prefix)
        return res

    def _lightning(self, prefix: str) -> dict:
        """One Lightning step time per strategy on 2 namespaces x 1 rank."""
        out: dict = {}
        step = [sys.executable, str(ROOT / "bench" / "lightning_step.py"), "--worker", "--model", "mlp",
                "--devices", "1", "--nodes", "2",
                "--steps", "5" if self.a.quick else "30", "--warmup", "2" if self.a.quick else "5"]
        for name, strategy, kwargs in (("DDP (gloo)", "ddp", {}), ("ddplug on mpi", "ddplug", {})):
            js = self.tmp / f"ns-lightning-{strategy}.json"
            cmd = self._mpirun_ns(prefix, 2, 1) if strategy == "ddplug" else None
            if cmd is not None:
                rc, text = run(cmd + step + ["--strategy", strategy, "--kwargs", json.dumps(kwargs),
                                             "--out", str(js)], self.env)
            else:
                rows = self._two_ranks(prefix, f"lightning-{strategy}", lambda r, j: step + [
                    "--strategy", strategy, "--kwargs", json.dumps(kwargs), "--out", str(js)])
                rc, text = (0, "") if js.exists() else (1, str(rows))
            try:
                out[name] = json.loads(js.read_text())
            except (OSError, ValueError):
                out[name] = None
                print(f"# lightning {name}: failed (exit {rc}) {text[-400:]}", file=sys.stderr)
        return out


def table(title: str, res: dict, bound: float | None = None) -> None:
    cols = [k for k, v in res.items() if isinstance(v, list) and v]
    if not cols:
        return
    sizes = sorted({r["size"] for k in cols for r in res[k]})
    print(f"\n## {title}: busbw GB/s (time in µs at the smallest size)")
    print(f"{'size(B)':>12} " + " ".join(f"{c[:22]:>22}" for c in cols))
    for s in sizes:
        cells = []
        for c in cols:
            r = next((x for x in res[c] if x["size"] == s), None)
            cells.append(f"{'-':>22}" if r is None else
                         f"{r['busbw']:>12.3f} ({r['time_us']:>7.1f}µs)" if s == sizes[0] else f"{r['busbw']:>22.3f}")
        print(f"{s:>12} " + " ".join(cells))
    if bound:
        print(f"(the link's bound on busbw: {bound:.3f} GB/s)")


def auto_threshold(one: dict) -> int | None:
    """The smallest size from which "mpi via cpu" is at least as fast as
    "mpi, flat" at every larger size (what intra_node "auto" should use)."""
    flat, hier = one.get("mpi, flat") or [], one.get("mpi via cpu") or []
    h = {r["size"]: r["time_us"] for r in hier}
    pairs = [(r["size"], r["time_us"], h.get(r["size"])) for r in flat if r["size"] in h]
    best = None
    for size, tf, th in reversed(sorted(pairs)):
        if th > tf:
            break
        best = size
    return best


def plot(path: Path, res: dict) -> None:
    try:
        import matplotlib
    except ImportError:
        print("# no matplotlib: no plot")
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title in ((axes[0], "one_node", "one node, 2 ranks"),
                           (axes[1], "netns", "2 namespaces (links rate-limited)")):
        sec = res.get(key) or {}
        for name, rows in sec.items():
            if not isinstance(rows, list):
                continue
            rows = [r for r in rows if r["busbw"] > 0]
            if rows:
                ax.plot([r["size"] for r in rows], [r["busbw"] for r in rows], "o-", markersize=3, label=name)
        if key == "netns" and res.get("link_bound"):
            ax.axhline(res["link_bound"], color="gray", linestyle="-.", label="link bound")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"allreduce float32 sum, {title}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--family", default="openmpi", choices=sorted(LAUNCHERS))
    p.add_argument("-b", default="8")
    p.add_argument("-e", default="64M")
    p.add_argument("-f", type=float, default=4)
    p.add_argument("--rate", default="5gbit", help="tc tbf rate of every namespace's link")
    p.add_argument("--no-netns", action="store_true")
    p.add_argument("--lightning", action="store_true", help="also a Lightning step on 2 namespaces")
    p.add_argument("--quick", action="store_true", help="a smoke test: few sizes, short runs")
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None)
    a = p.parse_args()
    if a.quick:
        a.b, a.e, a.f = "8", "1M", 32.0
    if shutil.which(LAUNCHERS[a.family][0]) is None:
        print(f"{LAUNCHERS[a.family][0]} is not installed", file=sys.stderr)
        return 2
    bench = Bench(a)
    res = bench.results
    res["one_node"] = bench.one_node()
    table("one node, 2 ranks", res["one_node"])
    if not a.no_netns:
        res["link_bound"] = rate_gbytes(a.rate)
        ns = bench.netns()
        res["netns"] = ns
        if ns:
            table(f"2 namespaces, links at {a.rate}", ns, res["link_bound"])
            if ns.get("lightning"):
                print("\n## Lightning step on 2 namespaces x 1 rank")
                for name, r in ns["lightning"].items():
                    print(f"  {name:>16}: {json.dumps(r)[:200] if r else 'failed'}")
    t = auto_threshold(res["one_node"])
    res["intra_node_auto_min_bytes"] = t
    print(f"\nintra_node \"auto\": {'the cpu plugin from ' + str(t) + ' bytes per rank' if t else 'MPI at every size measured'}"
          " (plugins/mpi/hier.c, DDMPI_HIER_AUTO_MIN_BYTES)")
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    if a.plot:
        plot(Path(a.plot), res)
    shutil.rmtree(bench.tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
