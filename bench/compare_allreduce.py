#!/usr/bin/env python3
"""compare_allreduce.py — ddplug's cpu plugin against torch.distributed gloo,
side by side, in one run, with this machine's memory-bandwidth limit.

    .venv/bin/python bench/compare_allreduce.py --build build -n 2 -b 8 -e 256M

Runs, in this order (each --repeat times, interleaved, keeping every size's
best time, since a shared machine is noisy):
  1. ddplug-allreduce-perf --copy-bw: STREAM-style copy bandwidth BW (bytes
     read + written per second, one thread per rank), measured again after
     every round, the best kept;
  2. ddplug-allreduce-perf --plugin cpu, with malloc'd buffers, then with
     registered buffers (-R: ddplug_mem_alloc), and with --before BUILD also
     an older build's ddplug-allreduce-perf (malloc'd buffers), so before and
     after come from one run;
  3. gloo_allreduce_perf.py --mode tcp (gloo's TCP transport);
  4. gloo_allreduce_perf.py --mode shm (gloo's shared-memory allreduce, if
     this torch has it; the run says whether it was used). torch 2.13.0+cpu
     does not have it (see gloo_allreduce_perf.py: none of its strings are in
     libtorch_cpu.so), so there this column is gloo's TCP path again, run
     with LOCAL_WORLD_SIZE set, and is labelled gloo(LWS);
then prints one table: time and busbw of each, and the memory-traffic bound.
The bound: an allreduce of S bytes over n ranks in one node must read every
input and write every output, 2·n·S bytes, so time >= 2·n·S / BW, i.e.
algbw <= BW / (2n) and busbw <= BW / (2n) · 2(n-1)/n. The goals (at 1 MiB and
above: registered buffers >= 75 % of the bound, malloc'd >= 60 %; 8 bytes <= 2
µs) are checked at the end (reported, not asserted).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(cmd, env=None):
    print("$ " + " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(p.stdout)
    if p.returncode != 0:
        print(f"# command failed with status {p.returncode}", flush=True)
    return p.returncode


def load(path):
    with open(path) as f:
        return json.load(f)


def best(rows_list):
    """Merge several runs' rows: for each size keep the fastest."""
    out = {}
    for rows in rows_list:
        for r in rows:
            k = r["size"]
            if k not in out or r["time_us"] < out[k]["time_us"]:
                out[k] = dict(r)
            out[k]["wrong"] = max(out[k]["wrong"], r["wrong"])
    return out


def human(n):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("-b", default="8")
    ap.add_argument("-e", default="256M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-d", default="float32")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--out", default="out/compare")
    ap.add_argument("--options", default="{}", help="cpu plugin_options")
    ap.add_argument("--before", default=None, help="an older build directory to run beside this one")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    perf = os.path.join(a.build, "bin", "ddplug-allreduce-perf")
    gloo = os.path.join(HERE, "gloo_allreduce_perf.py")
    env = dict(os.environ)
    env.setdefault("DDPLUG_PLUGIN_PATH", os.path.abspath(os.path.join(a.build, "lib")))
    sizes = ["-b", a.b, "-e", a.e, "-f", a.f, "-n", str(a.n), "-d", a.d]

    copies = []

    def measure_copy(tag):
        j = os.path.join(a.out, f"copy.{tag}.json")
        if run([perf, "--copy-bw", "-n", str(a.n), "--json", j], env) == 0:
            c = load(j)
            copies.append(max(c["copy_bw_1"], c["copy_bw_n"]))

    measure_copy("start")
    runs = {"ddplug": [], "registered": [], "before": [], "gloo_tcp": [], "gloo_shm": []}
    shm_used = shm_in_build = False
    shm_evidence = None
    for i in range(a.repeat):
        j = os.path.join(a.out, f"ddplug.{i}.json")
        if run([perf] + sizes + ["--plugin", "cpu", "--options", a.options, "--json", j], env) == 0:
            runs["ddplug"].append(load(j)["rows"])
        j = os.path.join(a.out, f"registered.{i}.json")
        if run([perf] + sizes + ["-R", "--plugin", "cpu", "--options", a.options, "--json", j], env) == 0:
            runs["registered"].append(load(j)["rows"])
        if a.before:
            j = os.path.join(a.out, f"before.{i}.json")
            benv = dict(env, DDPLUG_PLUGIN_PATH=os.path.abspath(os.path.join(a.before, "lib")))
            bperf = os.path.join(a.before, "bin", "ddplug-allreduce-perf")
            # Builds before 0.2.0 called the cpu plugin "host" (libddplug-host.so).
            bname = "cpu" if os.path.exists(os.path.join(a.before, "lib", "libddplug-cpu.so")) else "host"
            if run([bperf] + sizes + ["--plugin", bname, "--json", j], benv) == 0:
                runs["before"].append(load(j)["rows"])
        for mode in ("tcp", "shm"):
            j = os.path.join(a.out, f"gloo_{mode}.{i}.json")
            if run([a.python, gloo] + sizes + ["--mode", mode, "--json", j], env) == 0:
                doc = load(j)
                runs["gloo_" + mode].append(doc["rows"])
                if mode == "shm":
                    shm_used = shm_used or doc.get("shm_used", False)
                    shm_in_build = doc.get("shm_in_build", False)
                    shm_evidence = doc.get("shm_evidence", shm_evidence)
        # the copy bandwidth again after every round: a busy machine
        # understates it, and an understated bound flatters the results
        measure_copy(f"round{i}")
    bw = max(copies)
    n = a.n
    bound_busbw = bw / (2 * n) * 2 * (n - 1) / n if n > 1 else float("inf")

    tables = {k: best(v) for k, v in runs.items()}
    all_sizes = sorted(set().union(*[set(t) for t in tables.values()]))
    print()
    print(f"# allreduce {a.d} sum, {n} ranks, one node; best of {a.repeat} run(s) per size")
    print(f"# copy bandwidth BW = {bw:.2f} GB/s (STREAM copy, read+write, best of 1 and {n} "
          f"threads over {len(copies)} measurements: "
          f"{', '.join(f'{c:.1f}' for c in copies)}); memory-traffic bound: "
          f"busbw <= BW/(2n)*2(n-1)/n = {bound_busbw:.2f} GB/s")
    gloo_shm_label = "gloo-shm" if shm_used else "gloo(LWS)"
    before = ["before"] if a.before else []
    hdr = (f"{'size':>7} | {'ddplug us':>10} {'busbw':>6} {'%bnd':>5} | {'registered us':>13} {'busbw':>6} "
           f"{'%bnd':>5} | " + (f"{'before us':>10} {'busbw':>6} {'%bnd':>5} | " if before else "") +
           f"{'gloo-tcp us':>11} {'busbw':>6} | {gloo_shm_label + ' us':>12} {'busbw':>6} | {'bound':>6} "
           f"{'x tcp':>6}")
    print(hdr)
    print("-" * len(hdr))

    def cell(t, s, w, pct=False):
        r = t.get(s)
        if not r:
            return f"{'-':>{w}} {'-':>6}" + (f" {'-':>5}" if pct else "")
        p = f" {100 * r['busbw'] / bound_busbw:4.0f}%" if pct and n > 1 else (f" {'-':>5}" if pct else "")
        return f"{r['time_us']:>{w}.2f} {r['busbw']:>6.2f}" + p

    for s in all_sizes:
        d, g = tables["ddplug"].get(s), tables["gloo_tcp"].get(s)
        x = f"{g['time_us'] / d['time_us']:6.1f}" if d and g else "     -"
        print(f"{human(s):>7} | {cell(tables['ddplug'], s, 10, True)} | {cell(tables['registered'], s, 13, True)} | "
              + (f"{cell(tables['before'], s, 10, True)} | " if before else "")
              + f"{cell(tables['gloo_tcp'], s, 11)} | {cell(tables['gloo_shm'], s, 12)} | {bound_busbw:>6.2f} {x:>6}")
    wrong = sum(r["wrong"] for t in tables.values() for r in t.values())
    print(f"# wrong elements in all checked results: {wrong}")
    marks = ""
    if shm_evidence and shm_evidence.get("markers"):
        marks = "; strings in " + os.path.basename(shm_evidence["library"]) + ": " + ", ".join(
            f"{k} {'yes' if v else 'no'}" for k, v in shm_evidence["markers"].items())
    print(f"# gloo shared-memory allreduce: {'used' if shm_used else 'not used'}; "
          f"{'present' if shm_in_build else 'ABSENT'} in this torch build "
          f"(switch: LOCAL_WORLD_SIZE == world size, as torchrun sets it{marks})")
    print(f"# goals ({n} ranks):")
    for key, goal, label in (("registered", 0.75, "registered buffers"), ("ddplug", 0.60, "malloc'd buffers")):
        big = [r for sz, r in tables[key].items() if sz >= 1 << 20]
        if big and n > 1:
            worst = min(big, key=lambda r: r["busbw"])
            print(f"#   {label}, 1 MiB and above: lowest busbw {worst['busbw']:.2f} GB/s at {human(worst['size'])}"
                  f" = {100 * worst['busbw'] / bound_busbw:.0f}% of the bound (goal >= {100 * goal:.0f}%): "
                  f"{'met' if worst['busbw'] >= goal * bound_busbw else 'NOT met'}")
    d64 = tables["ddplug"].get(64 << 20)
    g64 = tables["gloo_tcp"].get(64 << 20)
    s64 = tables["gloo_shm"].get(64 << 20)
    if d64:
        r64 = tables["registered"].get(64 << 20)
        print(f"#   busbw at 64 MiB: {d64['busbw']:.2f} GB/s malloc'd"
              + (f", {r64['busbw']:.2f} GB/s registered" if r64 else "")
              + f" (bound {bound_busbw:.2f})")
        if g64:
            print(f"#   vs gloo TCP at 64 MiB: {d64['busbw'] / g64['busbw']:.1f}x "
                  f"({g64['busbw']:.2f} GB/s)")
        if s64:
            print(f"#   vs gloo {'shared memory' if shm_used else 'with LOCAL_WORLD_SIZE (TCP path)'} "
                  f"at 64 MiB: {d64['busbw'] / s64['busbw']:.1f}x ({s64['busbw']:.2f} GB/s)")
    d8 = tables["ddplug"].get(8)
    if d8:
        print(f"#   8-byte allreduce: {d8['time_us']:.2f} us (goal <= 2 us when ranks <= cores, "
              f"here {n} ranks on {os.cpu_count()} cores): {'met' if d8['time_us'] <= 2 else 'NOT met'}")
    summary = {"ranks": n, "dtype": a.d, "copy_bw": bw, "bound_busbw": bound_busbw,
               "repeat": a.repeat, "gloo_shm_used": shm_used, "gloo_shm_in_build": shm_in_build,
               "gloo_shm_evidence": shm_evidence,
               "rows": {k: [t[s] for s in sorted(t)] for k, t in tables.items()}}
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
